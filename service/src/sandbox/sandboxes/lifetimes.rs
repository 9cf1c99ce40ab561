//! A sandbox's time and its company: new timers within the service's caps
//! (`POST /v1/sandboxes/{id}/timeout`), the list filtered by state and metadata, and many
//! branches in one call.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use engine::book::{Ending, Expiry, Kind, Timers};

use crate::entries::Checkpoint;
use crate::events::{Cause, EventType, ForkState, Happened};
use serde::Deserialize;
use utoipa::ToSchema;

use super::{view, SandboxId, Sandboxes};
use crate::bounds;
use crate::error::ErrorKind;
use crate::error::{ApiError, ApiResult};
use crate::forks::VmSlot;
use crate::wire::{SandboxList, SandboxReset, SandboxView};

/// The most branches one call makes.
pub const MAX_BRANCHES: u64 = 32;

/// `POST /v1/sandboxes/{id}/timeout`: at least one field.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TimeoutRequest {
    /// Its idle timeout from now on (1 s to `serve.sandboxes.idle_timeout_secs`).
    pub idle_timeout_secs: Option<u64>,
    /// Its whole lifetime, counted from its creation (at most
    /// `serve.sandboxes.max_lifetime_secs`).
    pub lifetime_secs: Option<u64>,
    /// Instead of `lifetime_secs`: end this many seconds from now (within the same cap).
    pub expires_in_secs: Option<u64>,
}

/// `POST /v1/sandboxes/{id}/branch`: an empty body makes one branch (the answer is its
/// sandbox); a `count` makes that many (the answer is their list).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchRequest {
    /// Branches to make, 1-32: all or none.
    pub count: Option<u64>,
}

/// What `GET /v1/sandboxes` keeps: `?state=running|paused` and `?metadata.KEY=VALUE` (all
/// must match).
#[derive(Debug, Default)]
pub struct ListFilter {
    state: Option<String>,
    metadata: BTreeMap<String, String>,
}

impl ListFilter {
    /// The filter a query asks for, or a 400 naming the parameter.
    pub fn parse(query: BTreeMap<String, String>) -> ApiResult<ListFilter> {
        let mut filter = ListFilter::default();
        for (key, value) in query {
            if key == "state" {
                if !["running", "paused", "resume_failed"].contains(&value.as_str()) {
                    return Err(ApiError::field(
                        ErrorKind::Invalid,
                        "state",
                        format!("{value:?} is not a state: running, paused or resume_failed"),
                    ));
                }
                filter.state = Some(value);
            } else if let Some(name) = key.strip_prefix("metadata.").filter(|n| !n.is_empty()) {
                bounds::text(&key, &value, bounds::ID_BYTES * 16)?;
                filter.metadata.insert(name.to_string(), value);
            } else {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    key.clone(),
                    "not a filter: the list takes state=running|paused and metadata.KEY=VALUE",
                ));
            }
        }
        Ok(filter)
    }

    fn keeps(&self, sandbox: &SandboxView) -> bool {
        self.state.as_ref().is_none_or(|s| *s == sandbox.state)
            && self.metadata.iter().all(|(k, v)| sandbox.metadata.get(k) == Some(v))
    }
}

impl Sandboxes {
    /// Runs `make` once per idempotency key (`key`: the key and the body's digest) within
    /// `scope` (a route and its sandbox): a retry with the same key and body gets the ids the
    /// first request made, and `false`; a different body is a 422, one still running a 409.
    pub(crate) async fn once(
        &self,
        scope: &str,
        key: Option<(String, String)>,
        make: impl std::future::Future<Output = ApiResult<Vec<String>>>,
    ) -> ApiResult<(Vec<String>, bool)> {
        let Some((key, digest)) = key else {
            return make.await.map(|ids| (ids, true));
        };
        let key = format!("{scope} {key}");
        let claim = self.made_keys().claim(&key, &digest);
        match claim.map_err(ApiError::from)? {
            engine::idempotency::Claim::Answered(ids) => return Ok((ids, false)),
            engine::idempotency::Claim::Claimed => {}
        }
        let made = make.await;
        self.made_keys().settle(&key, &digest, made.as_ref().ok().cloned());
        made.map(|ids| (ids, true))
    }

    fn made_keys(&self) -> std::sync::MutexGuard<'_, engine::idempotency::Keys<Vec<String>>> {
        self.made_keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `GET /v1/sandboxes`: the caller's that the filter keeps, oldest first.
    pub async fn list(&self, who: &crate::tenancy::Who, filter: &ListFilter) -> Vec<SandboxView> {
        // Others' sandboxes are not even locked: a list never waits on their commands.
        let mine = self.forks().all_with(Kind::Sandbox, |card| card.owner == who.tenant());
        let mut views = Vec::new();
        for (_, sandbox) in mine {
            let sandbox = view(&*sandbox.lock().await);
            if filter.keeps(&sandbox) {
                views.push(sandbox);
            }
        }
        views.sort_by_key(|v| (v.created_at_ms, v.id.clone()));
        views
    }

    /// `POST /v1/sandboxes/{id}/timeout`.
    pub async fn set_timeout(&self, id: &SandboxId, request: TimeoutRequest) -> ApiResult<SandboxView> {
        let sandbox = self.get(id)?;
        let mut sandbox = sandbox.lock().await;
        let opened = self.forks().opened(id).ok_or_else(|| {
            ApiError::new(
                ErrorKind::Gone,
                format!("sandbox {id} was removed while the request ran"),
            )
        })?;
        let lived = Instant::now().duration_since(opened);
        let settings = &sandbox.sandbox().settings;
        let (idle, lifetime) = new_timers(
            &request,
            (settings.idle, settings.lifetime),
            (self.idle, self.lifetime),
            lived,
        )?;
        let settings = &mut sandbox.sandbox_mut().settings;
        settings.idle = idle;
        settings.lifetime = lifetime;
        let timers = Timers {
            idle,
            lifetime: Some(lifetime),
        };
        if !self.forks().set_timers(id, timers) {
            return Err(ApiError::new(
                ErrorKind::Gone,
                format!("sandbox {id} was removed while the request ran"),
            ));
        }
        self.save_record(&sandbox);
        tracing::info!(sandbox = %id, idle_secs = idle.as_secs(), lifetime_secs = lifetime.as_secs(), "sandbox timers set");
        Ok(view(&sandbox))
    }

    /// `POST /v1/sandboxes/{id}/reset`: back to its environment's snapshot, same id. Its
    /// processes are gone (they lived in the guest); its open ports stay open; its last
    /// checkpoint is forgotten (a restart brings it back as a fresh fork of its environment,
    /// which is what it now is).
    pub async fn reset(&self, id: &SandboxId) -> ApiResult<SandboxReset> {
        let sandbox = self.get(id)?;
        let mut sandbox = sandbox.lock().await;
        let _in_use = self.begin(id);
        // Its VM's last reading (a reset by a fresh fork replaces the VM).
        let reading = sandbox.run.usage();
        sandbox.sandbox_mut().spent.observe(reading);
        let seed = self.seed();
        let way = sandbox.run.reset(seed).await.map_err(|e| match e {
            engine::session::SessionResetError::Call(engine::session::SessionCallError::Paused) => {
                ApiError::new(ErrorKind::Conflict, format!("sandbox {id} is paused: resume it first"))
            }
            e => ApiError::new(
                ErrorKind::Internal,
                format!("resetting sandbox {id}: {}", engine::describe(&e)),
            ),
        })?;
        sandbox.sandbox_mut().checkpoint = None;
        self.save_record(&sandbox);
        // Its guest is its environment's again: its workspaces are written again as last
        // synced, or a later sync would keep the environment's folder in their place.
        let mounts = sandbox.sandbox().mounts.clone();
        if !mounts.is_empty() {
            let guest = sandbox
                .run
                .guest()
                .map_err(|e| ApiError::new(ErrorKind::Internal, format!("sandbox {id} after its reset: {e}")))?;
            if let Err(e) = self.remount(id, &guest, &mounts).await {
                // Nothing it syncs from now on may stand for the workspaces it lost.
                self.release_workspaces(id, &mounts);
                let copies: Vec<_> = mounts.iter().map(|m| m.for_branch()).collect();
                sandbox.sandbox_mut().mounts = copies;
                self.save_record(&sandbox);
                return Err(e);
            }
        }
        let (in_place, why, took) = match way {
            engine::session::ResetWay::InPlace { took } => (true, None, took),
            engine::session::ResetWay::FreshFork { why, took } => (false, Some(why), took),
        };
        tracing::info!(sandbox = %id, in_place, took_ms = took.as_millis() as u64, "sandbox reset");
        let mut told =
            crate::events::Happened::sandbox(crate::events::EventType::Reset, crate::events::ForkState::Running)
                .reason(if in_place { "in place" } else { "by a fresh fork" });
        if let Some(why) = &why {
            told = told.reason(format!("by a fresh fork: {why}"));
        }
        self.tell(id, told);
        Ok(SandboxReset {
            sandbox: view(&sandbox),
            in_place,
            why,
            took_ms: took.as_millis() as u64,
        })
    }

    /// Ends sandboxes idle past their timeout or past their lifetime; one that asked
    /// (`on_timeout = "pause"`) is paused instead, and kept paused for
    /// `serve.sandboxes.paused_retention_secs`.
    pub(crate) async fn expire(&self) {
        let expired = self.forks().expired(Kind::Sandbox, Instant::now());
        for (id, expiry) in expired {
            let (why, cause) = match expiry {
                Expiry::Idle => ("idle past its timeout", Cause::IdleTimeout),
                Expiry::Lifetime => ("past its lifetime", Cause::Lifetime),
            };
            match self.pause_for_timeout(&id, cause).await {
                Some(Ok(())) => continue,
                Some(Err(e)) => {
                    tracing::warn!(sandbox = %id, "its timeout could not pause it, so it ends: {}", e.message)
                }
                None => {}
            }
            self.end(&id, Ending::Ended(why.into()), cause).await;
        }
    }

    /// Pauses a sandbox whose timeout came, if it asked for that (None: it did not, or it was
    /// paused already, and it ends).
    async fn pause_for_timeout(&self, id: &str, cause: Cause) -> Option<ApiResult<()>> {
        let sandbox = self.get(id).ok()?;
        let mut sandbox = sandbox.lock().await;
        if !sandbox.sandbox().settings.request.pauses_on_timeout() || sandbox.run.paused().is_some() {
            return None;
        }
        let reading = sandbox.run.usage();
        sandbox.sandbox_mut().spent.observe(reading);
        let dir = self.checkpoint_dir(id);
        let pending = match sandbox.run.pause(&dir).await {
            Ok(pending) => pending,
            Err(e) => {
                let e = ApiError::new(ErrorKind::Internal, format!("pausing: {}", engine::describe(&e)));
                return Some(Err(e));
            }
        };
        pending.commit();
        self.forks().pause(id);
        let now_ms = engine::row::now_ms() as u64;
        let fork = sandbox.run.paused().expect("just paused").clone();
        let facts = sandbox.sandbox_mut();
        facts.checkpoint = Some(Checkpoint { fork, at_ms: now_ms });
        facts.auto_paused_ms = Some(now_ms);
        // Kept paused for the retention from now: its lifetime in the book, counted from its
        // current life's start, ends then.
        let lived = Duration::from_millis(now_ms.saturating_sub(facts.life_from_ms));
        let timers = Timers {
            idle: facts.settings.idle,
            lifetime: Some(lived + self.paused_retention),
        };
        self.forks().set_timers(id, timers);
        self.save_record(&sandbox);
        let paused = Happened::sandbox(EventType::Paused, ForkState::Paused)
            .cause(cause)
            .reason("its timeout paused it (on_timeout = pause): any call on it resumes it");
        self.tell(id, paused);
        Some(Ok(()))
    }

    /// `POST /v1/sandboxes/{id}/branch` with a count: all of them, or none (those made are
    /// deleted when one fails).
    pub(crate) async fn branch_many(
        &self,
        id: &str,
        count: u64,
        slot: impl Fn() -> ApiResult<VmSlot>,
    ) -> ApiResult<SandboxList> {
        bounds::range("count", count, (1, MAX_BRANCHES), "branches")?;
        let mut made: Vec<SandboxView> = Vec::new();
        for _ in 0..count {
            match self.branch(id, &slot).await {
                Ok(child) => made.push(child),
                Err(e) => {
                    for child in &made {
                        let _ = self
                            .delete(&SandboxId::trusted(&child.id), "its branch call failed")
                            .await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(SandboxList { sandboxes: made })
    }
}

/// The timers a request sets, checked against the caps (`caps`: idle, lifetime) and the time
/// the sandbox has lived.
fn new_timers(
    request: &TimeoutRequest,
    current: (Duration, Duration),
    caps: (Duration, Duration),
    lived: Duration,
) -> ApiResult<(Duration, Duration)> {
    let idle = match request.idle_timeout_secs {
        Some(s) => {
            bounds::range(
                "idle_timeout_secs",
                s,
                (1, caps.0.as_secs()),
                "seconds (the service's limit)",
            )?;
            Duration::from_secs(s)
        }
        None => current.0,
    };
    let lifetime = match (request.lifetime_secs, request.expires_in_secs) {
        (Some(_), Some(_)) => {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                "expires_in_secs",
                "give lifetime_secs or expires_in_secs, not both",
            ))
        }
        (Some(s), None) => {
            bounds::range(
                "lifetime_secs",
                s,
                (1, caps.1.as_secs()),
                "seconds (the service's limit)",
            )?;
            Duration::from_secs(s)
        }
        (None, Some(s)) => {
            let left = caps.1.saturating_sub(lived).as_secs();
            bounds::range(
                "expires_in_secs",
                s,
                (1, left.max(1)),
                "seconds (what the service's lifetime limit leaves it)",
            )?;
            lived + Duration::from_secs(s)
        }
        (None, None) if request.idle_timeout_secs.is_none() => {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                "idle_timeout_secs",
                "missing: give idle_timeout_secs, lifetime_secs or expires_in_secs",
            ))
        }
        (None, None) => current.1,
    };
    if lifetime <= lived {
        return Err(ApiError::field(
            ErrorKind::Invalid,
            "lifetime_secs",
            format!(
                "it has lived {} s already: a lifetime of {} s would end it now (delete it instead)",
                lived.as_secs(),
                lifetime.as_secs()
            ),
        ));
    }
    Ok((idle, lifetime))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn asked(idle: Option<u64>, lifetime: Option<u64>, expires_in: Option<u64>) -> TimeoutRequest {
        TimeoutRequest {
            idle_timeout_secs: idle,
            lifetime_secs: lifetime,
            expires_in_secs: expires_in,
        }
    }

    #[test]
    fn timers_move_within_the_caps_and_never_into_the_past() {
        let (current, caps, lived) = ((secs(60), secs(600)), (secs(300), secs(3600)), secs(100));
        let set = |r: TimeoutRequest| new_timers(&r, current, caps, lived);
        assert_eq!(set(asked(Some(200), None, None)).unwrap(), (secs(200), secs(600)));
        assert_eq!(set(asked(None, Some(3600), None)).unwrap(), (secs(60), secs(3600)));
        assert_eq!(set(asked(None, None, Some(500))).unwrap(), (secs(60), secs(600)));
        for (request, field) in [
            (asked(Some(301), None, None), "idle_timeout_secs"),
            (asked(Some(0), None, None), "idle_timeout_secs"),
            (asked(None, Some(3601), None), "lifetime_secs"),
            (asked(None, None, Some(3501)), "expires_in_secs"),
            (asked(None, Some(50), None), "lifetime_secs"),
            (asked(None, Some(600), Some(10)), "expires_in_secs"),
            (asked(None, None, None), "idle_timeout_secs"),
        ] {
            let e = set(request).unwrap_err();
            assert_eq!(
                (e.kind, e.field.as_deref()),
                (ErrorKind::Invalid, Some(field)),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn the_list_filters_by_state_and_metadata_and_names_a_bad_key() {
        let query = |pairs: &[(&str, &str)]| {
            ListFilter::parse(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
        };
        let filter = query(&[("state", "running"), ("metadata.owner", "ann")]).unwrap();
        let mut sandbox = SandboxView {
            id: "sb-1".into(),
            environment: "env-1".into(),
            state: "running".into(),
            cpus: 1,
            memory_mib: 256,
            network: None,
            workdir: None,
            user: None,
            created_at_ms: 0,
            expires_at_ms: 0,
            idle_timeout_secs: 0,
            parent: None,
            metadata: [("owner".to_string(), "ann".to_string())].into(),
            checkpoint_at_ms: None,
            workspaces: Vec::new(),
            start: None,
        };
        assert!(filter.keeps(&sandbox));
        sandbox.metadata.insert("owner".into(), "bob".into());
        assert!(!filter.keeps(&sandbox));
        for (bad, field) in [("state", "state"), ("metadata.", "metadata."), ("owner", "owner")] {
            let e = query(&[(bad, "x")]).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(field));
        }
    }
}
