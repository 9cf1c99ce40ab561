//! What a sandbox's owner is told of it: every change of its state is an event
//! ([`crate::events`]), and a watch run by the service's housekeeping finds what changes
//! without a request: a VM that went on its own (its QEMU exited or was killed, a limit
//! stopped it) and a timer about to end a sandbox.

use std::collections::HashMap;
use std::time::Instant;

use engine::book::{Ending, Expiry, Kind};
use engine::session::VmGone;

use super::Sandboxes;
use crate::events::{Cause, EventType, ForkState, Happened};

/// What the watch remembers between rounds.
#[derive(Default)]
pub(super) struct Watch {
    /// The host's out-of-memory kills at the last round.
    oom_kills: Option<u64>,
    /// Sandboxes inside the warning's window now, warned of (and why).
    warned: HashMap<String, Expiry>,
}

/// Why a VM that went did, as its owner is told: the cause and a sentence. A QEMU killed by
/// SIGKILL while the host's out-of-memory kills rose is put down to memory.
pub(super) fn death(gone: &VmGone, oom_rose: bool) -> (Cause, String) {
    const SIGKILL: i32 = 9;
    let (cause, how) = match gone {
        VmGone::Limit(why) => (Cause::DiskLimit, format!("a limit stopped it: {why}")),
        VmGone::Exited {
            signal: Some(SIGKILL), ..
        } if oom_rose => (
            Cause::OutOfMemory,
            "the host's out-of-memory killer took its QEMU".to_string(),
        ),
        VmGone::Exited {
            status,
            signal: Some(_),
        } => (Cause::QemuKilled, format!("its QEMU was killed ({status})")),
        VmGone::Exited { status, signal: None } => (Cause::QemuExited, format!("its QEMU exited ({status})")),
    };
    (cause, format!("its VM died: {how}"))
}

impl Sandboxes {
    /// Who owns sandbox `id`: its card's owner, or the tenants database's once it left the
    /// book (None: no one it is known to).
    pub(super) fn owner_of(&self, id: &str) -> Option<tenants::TenantId> {
        let card = self.forks().card(id, Kind::Sandbox).map(|c| c.owner);
        card.or_else(|| {
            self.tenancy
                .owners
                .of(tenants::Kind::Sandbox, id)
                .first()
                .map(|o| o.tenant)
        })
    }

    /// Tells sandbox `id`'s owner what happened to it (no one, when it has no owner).
    pub(super) fn tell(&self, id: &str, happened: Happened) {
        match self.owner_of(id) {
            Some(owner) => {
                self.events.emit(owner, id, happened);
            }
            None => tracing::warn!(sandbox = %id, "an event of a sandbox with no owner: {:?}", happened.event),
        }
    }

    /// One round of the watch: sandboxes whose VM went on their own are ended as died, with
    /// why; those a timer ends within `serve.events.warn_before_secs` are warned of, once
    /// per end. A sandbox whose lock is held (a change under way) is looked at next round.
    pub(crate) async fn watch(&self) {
        let oom_now = engine::session::host_oom_kills();
        let oom_rose = {
            let mut watch = self.watch.lock().unwrap_or_else(|p| p.into_inner());
            let rose = matches!((watch.oom_kills, oom_now), (Some(before), Some(now)) if now > before);
            watch.oom_kills = oom_now;
            rose
        };
        let all = self.forks().all(Kind::Sandbox);
        for (id, sandbox) in all {
            let gone = match sandbox.try_lock() {
                Ok(mut open) => open.run.vm_gone(),
                Err(_) => None,
            };
            if let Some(gone) = gone {
                let (cause, why) = death(&gone, oom_rose);
                tracing::warn!(sandbox = %id, "its VM went: {why}");
                self.end(&id, Ending::Died(why), cause).await;
            }
        }
        self.warn_of_ends();
        self.observe_all();
    }

    /// Warns of each sandbox whose timer ends it (or pauses it) within the warning's
    /// window, once as it enters the window: a use that moves its idle end back out of the
    /// window arms the warning again, one that leaves it inside does not.
    fn warn_of_ends(&self) {
        let before = self.events.settings.warn_before_secs;
        if before == 0 {
            return;
        }
        let (now, now_ms) = (Instant::now(), engine::row::now_ms() as u64);
        let ends = self.forks().ends(Kind::Sandbox, now);
        let mut due = Vec::new();
        {
            let mut watch = self.watch.lock().unwrap_or_else(|p| p.into_inner());
            let mut warned = HashMap::new();
            for (id, why, left) in ends {
                if left.as_secs() > before {
                    continue;
                }
                if watch.warned.get(&id) != Some(&why) {
                    due.push((id.clone(), why, now_ms + left.as_millis() as u64));
                }
                warned.insert(id, why);
            }
            watch.warned = warned;
        }
        for (id, why, at_ms) in due {
            let pauses = self.get(&id).ok().and_then(|sandbox| {
                let open = sandbox.try_lock().ok()?;
                Some(open.sandbox().settings.request.pauses_on_timeout())
            });
            let (cause, what) = match (why, pauses == Some(true)) {
                (Expiry::Idle, false) => (Cause::IdleTimeout, "unless it is used, its idle timeout ends it"),
                (Expiry::Idle, true) => (Cause::IdleTimeout, "unless it is used, its idle timeout pauses it"),
                (Expiry::Lifetime, false) => (Cause::Lifetime, "its lifetime ends it unless its timers move"),
                (Expiry::Lifetime, true) => (Cause::Lifetime, "its lifetime pauses it unless its timers move"),
            };
            let warning = Happened::sandbox(EventType::TimeoutWarning, ForkState::Running)
                .cause(cause)
                .reason(what)
                .ends_at(at_ms);
            self.tell(&id, warning);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vm_that_went_is_put_down_to_its_cause() {
        let killed = |signal| VmGone::Exited {
            status: format!("signal: {signal}"),
            signal: Some(signal),
        };
        assert_eq!(death(&killed(9), true).0, Cause::OutOfMemory);
        assert_eq!(death(&killed(9), false).0, Cause::QemuKilled);
        assert_eq!(
            death(&killed(15), true).0,
            Cause::QemuKilled,
            "only SIGKILL is the OOM killer's"
        );
        let exited = VmGone::Exited {
            status: "exit status: 1".into(),
            signal: None,
        };
        assert_eq!(death(&exited, true).0, Cause::QemuExited);
        let (cause, why) = death(&VmGone::Limit("the disk overlay grew to 9 MiB".into()), false);
        assert_eq!(cause, Cause::DiskLimit);
        assert!(why.contains("9 MiB"), "{why}");
    }
}
