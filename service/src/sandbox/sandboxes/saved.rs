//! Sandboxes that outlive the service's process. Each sandbox has a record on disk, and its
//! checkpoints, under `OUT/sandboxes/saved/`:
//!
//! ```text
//! saved/<id>.json      its restart record (crate::record): what it was made with (its create request), its timers, metadata,
//!                      parent, open ports (and their tokens), and its last checkpoint
//! saved/<id>.<ms>/     a checkpoint: the sandbox's memory, processes and disk at that
//!                      moment (engine::pause's folder: fork.json, state/)
//! ```
//!
//! A checkpoint is made by a pause, by `POST /v1/sandboxes/{id}/checkpoint`, every
//! `serve.sandboxes.checkpoint_secs` when set, and for every live sandbox when the service
//! stops gracefully (SIGTERM, Ctrl-C). A start takes every record up as a *paused* sandbox:
//! resuming it forks its last checkpoint, or, when it never had one (a `kill -9` before its
//! first), its environment again with its settings. A record is written (to a temporary name,
//! then renamed) after the state it names is complete, so a crash at any point leaves the
//! previous record and checkpoint in force. Folders no record names are removed at start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use engine::book::{Kind, Timers};
use engine::pause::PausedFork;

use super::{view, SandboxId, Sandboxes};
use crate::entries::{Card, Facts, Open};
use crate::entries::{Checkpoint, SandboxFacts};
use crate::error::ErrorKind;
use crate::error::{ApiError, ApiResult};
use crate::events::{Cause, EventType, ForkState, Happened};
use crate::record::{ForkRecord, Of, SandboxPart, SavedPort};
use crate::sandbox::environments::Environments;
use crate::wire::SandboxView;

/// The mark a graceful stop leaves beside the records (removed by the next start).
const STOPPED: &str = ".stopped";

/// What a sandbox's owner is told when a new process takes it up: exactly as it was when it
/// was paused (by its owner, or by a graceful stop), or what was lost.
fn restored_event(graceful: bool, was_paused: bool, checkpoint: bool) -> Happened {
    let cause = if graceful {
        Cause::ServiceStop
    } else {
        Cause::ServiceRestart
    };
    let restored = Happened::sandbox(EventType::Restored, ForkState::Paused).cause(cause);
    match (was_paused, checkpoint) {
        (true, _) => restored.reason("the service restarted: taken up exactly as it was paused"),
        (false, true) => restored.reason(
            "the service restarted without pausing it: taken up from its last checkpoint, and what it did after that is lost",
        ),
        (false, false) => restored.reason(
            "the service restarted before its first checkpoint: taken up as a fresh fork of its environment, and what it did is lost",
        ),
    }
}

impl Sandboxes {
    fn record_path(&self, id: &str) -> PathBuf {
        self.saved_dir.join(format!("{id}.json"))
    }

    /// A new folder for a checkpoint of `id`.
    /// Where checkpoints and pauses are saved (`ID.MS` folders).
    pub fn saved_dir(&self) -> &std::path::Path {
        &self.saved_dir
    }

    pub(super) fn checkpoint_dir(&self, id: &str) -> PathBuf {
        self.saved_dir.join(format!("{id}.{}", engine::row::now_ms() as u64))
    }

    /// What the restart record of `open`, with these open ports, says now.
    fn record_of(&self, open: &Open, ports: &BTreeMap<u16, String>) -> ForkRecord {
        let facts = open.sandbox();
        let s = &facts.settings;
        let (checkpoint, checkpoint_ms) = match (open.run.paused(), &facts.checkpoint) {
            (Some(paused), _) => (Some(paused.dir.clone()), facts.checkpoint.as_ref().map(|c| c.at_ms)),
            (None, Some(c)) => (Some(c.fork.dir.clone()), Some(c.at_ms)),
            (None, None) => (None, None),
        };
        let part = SandboxPart {
            request: s.request.clone(),
            idle_secs: s.idle.as_secs(),
            lifetime_secs: s.lifetime.as_secs(),
            created_ms: facts.created_ms,
            parent: facts.parent.clone(),
            paused: open.run.paused().is_some(),
            auto_paused_ms: facts.auto_paused_ms,
            life_from_ms: Some(facts.life_from_ms),
            resume_failed: facts.resume_failed.clone(),
            mounts: facts.mounts.clone(),
            ports: ports
                .iter()
                .map(|(port, token)| SavedPort {
                    port: *port,
                    token: token.clone(),
                })
                .collect(),
        };
        let checkpoint = checkpoint.and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()));
        ForkRecord::new(&open.id, checkpoint, checkpoint_ms, Of::Sandbox(part))
    }

    /// Writes `open`'s record (a failure is logged: the previous record stays in force).
    /// (Its open ports are on its card: a sandbox not in the book has none.)
    /// (Nothing for a sandbox no longer in the book: one that ended stays ended, whatever a
    /// change that held its lock meanwhile would write.)
    pub(super) fn save_record(&self, open: &Open) {
        let ports = self
            .forks()
            .card(&open.id, Kind::Sandbox)
            .map(|card| card.ports.clone());
        match ports {
            Some(ports) => self.save_record_with(open, &ports),
            None => tracing::debug!(sandbox = %open.id, "no record for a sandbox that went"),
        }
    }

    pub(super) fn save_record_with(&self, open: &Open, ports: &BTreeMap<u16, String>) {
        if let Err(e) = self.write_record(&self.record_of(open, ports)) {
            tracing::warn!(sandbox = %open.id, "cannot write its record: {e:#}");
        }
    }

    fn write_record(&self, record: &ForkRecord) -> std::io::Result<()> {
        record.write(&self.record_path(&record.id))
    }

    /// Forgets a sandbox that went (its checkpoints go with their last holder).
    pub(super) fn forget_record(&self, id: &str) {
        let _ = std::fs::remove_file(self.record_path(id));
    }

    /// `POST /v1/sandboxes/{id}/checkpoint`: its state now, kept for a restart; it runs on.
    pub(crate) async fn checkpoint(&self, id: &SandboxId) -> ApiResult<SandboxView> {
        let sandbox = self.get(id)?;
        let mut sandbox = sandbox.lock().await;
        if sandbox.run.paused().is_some() {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!("sandbox {id} is paused: its pause is its checkpoint"),
            ));
        }
        let _in_use = self.begin(id);
        let dir = self.checkpoint_dir(id);
        let fork = sandbox.run.checkpoint(&dir).await.map_err(|e| {
            ApiError::new(
                ErrorKind::Internal,
                format!("checkpointing sandbox {id}: {}", engine::describe(&e)),
            )
        })?;
        sandbox.sandbox_mut().checkpoint = Some(Checkpoint {
            fork,
            at_ms: engine::row::now_ms() as u64,
        });
        self.save_record(&sandbox);
        Ok(view(&sandbox))
    }

    /// Checkpoints every live sandbox whose last checkpoint is older than `every`.
    pub(crate) async fn checkpoint_due(&self, every: Duration) {
        let now = engine::row::now_ms() as u64;
        let all = self.forks().all(Kind::Sandbox);
        for (id, sandbox) in all {
            let due = {
                let open = sandbox.lock().await;
                let last = open.sandbox().checkpoint.as_ref().map(|c| c.at_ms);
                open.run.live().is_ok() && last.is_none_or(|at| now.saturating_sub(at) >= every.as_millis() as u64)
            };
            if due {
                if let Err(e) = self.checkpoint(&SandboxId::trusted(&id)).await {
                    tracing::warn!(sandbox = %id, "periodic checkpoint: {}", e.message);
                }
            }
        }
    }

    /// A graceful stop: every live sandbox is paused (a checkpoint as of now) and every
    /// checkpoint stays on disk for the next start. A sandbox whose pause fails keeps its
    /// previous checkpoint.
    pub(crate) async fn shut_down(&self) {
        use futures::StreamExt;
        let all = self.forks().all(Kind::Sandbox);
        tracing::info!("saving {} sandboxes for the next start", all.len());
        // Two at a time: each pause streams a guest's memory through a helper QEMU.
        futures::stream::iter(all)
            .for_each_concurrent(2, |(id, sandbox)| async move {
                let mut open = sandbox.lock().await;
                if open.run.live().is_ok() {
                    let dir = self.checkpoint_dir(&id);
                    match open.run.pause(&dir).await {
                        Ok(pending) => {
                            pending.commit();
                            let fork = open.run.paused().expect("just paused").clone();
                            let at_ms = engine::row::now_ms() as u64;
                            open.sandbox_mut().checkpoint = Some(Checkpoint { fork, at_ms });
                            let paused = Happened::sandbox(EventType::Paused, ForkState::Paused)
                                .cause(Cause::ServiceStop)
                                .reason("the service stopped: paused, to be taken up at its next start");
                            self.tell(&id, paused);
                        }
                        Err(e) => tracing::warn!(sandbox = %id, "not paused at the stop: {}", engine::describe(&e)),
                    }
                }
                if let Some(paused) = open.run.paused() {
                    paused.keep_on_disk();
                }
                if let Some(c) = &open.sandbox().checkpoint {
                    c.fork.keep_on_disk();
                }
                self.save_record(&open);
                // Its VM (if the pause failed) stops with the process.
            })
            .await;
        let _ = std::fs::write(self.saved_dir.join(STOPPED), b"");
    }

    /// Takes up the sandboxes an earlier process left (each paused), and removes folders no
    /// record names. A record that cannot be taken up is reported and set aside as
    /// `<id>.json.bad`, its folder kept.
    pub(crate) async fn restore(&self, environments: &Environments) {
        let mut named = std::collections::HashSet::new();
        let Ok(entries) = std::fs::read_dir(&self.saved_dir) else {
            return;
        };
        let mut records: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        records.sort();
        // Left by a graceful stop: every sandbox was paused as it was then.
        let graceful = std::fs::remove_file(self.saved_dir.join(STOPPED)).is_ok();
        for path in records {
            match self.take_up(environments, &path, graceful).await {
                Ok((id, checkpoint)) => {
                    named.extend(checkpoint);
                    tracing::info!(sandbox = %id, "sandbox taken up, paused");
                }
                Err(e) => {
                    tracing::error!(
                        "{}: cannot take this sandbox up: {e:#}; set aside as .bad",
                        path.display()
                    );
                    // Its writable holds go with it.
                    if let Ok((record, part)) = ForkRecord::read(&path).and_then(|r| r.into_sandbox(&path)) {
                        self.release_workspaces(&record.id, &part.mounts);
                    }
                    if let Some(id) = path.file_stem().map(|s| s.to_string_lossy().into_owned()) {
                        let died = Happened::sandbox(EventType::Died, ForkState::Ended)
                            .cause(Cause::ServiceRestart)
                            .reason(format!("the service restarted and could not take it up: {e:#}"));
                        self.tell(&id, died);
                    }
                    let _ = std::fs::rename(&path, path.with_extension("json.bad"));
                    if let Some(stem) = path.file_stem() {
                        named.insert(stem.to_string_lossy().into_owned());
                    }
                }
            }
        }
        for entry in std::fs::read_dir(&self.saved_dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let kept = named.iter().any(|n| name == *n || name.starts_with(&format!("{n}.")));
            if entry.path().is_dir() && !kept {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }

    /// One record, taken up: (its id, its checkpoint folder's name).
    async fn take_up(
        &self,
        environments: &Environments,
        path: &Path,
        graceful: bool,
    ) -> anyhow::Result<(String, Option<String>)> {
        let (record, part) = ForkRecord::read(path)?.into_sandbox(path)?;
        let mut settings = self
            .settings_of(environments, &part.request)
            .map_err(|e| anyhow::anyhow!("{}", e.message))?;
        settings.idle = Duration::from_secs(part.idle_secs);
        settings.lifetime = Duration::from_secs(part.lifetime_secs);
        let paused = match &record.checkpoint {
            Some(name) => PausedFork::load(&self.saved_dir.join(name), &self.host.store)?,
            None => self.fresh_checkpoint(&record.id, &settings).await?,
        };
        let restored = restored_event(graceful, part.paused, record.checkpoint.is_some());
        let checkpoint = paused.dir.file_name().map(|n| n.to_string_lossy().into_owned());
        let run = self
            .host
            .paused_sandbox(&settings.ready.snapshot, &settings.spec, paused);
        let mut facts = SandboxFacts::new(settings, part.parent.clone());
        facts.created_ms = part.created_ms;
        facts.life_from_ms = part.life_from_ms.unwrap_or(part.created_ms);
        facts.auto_paused_ms = part.auto_paused_ms;
        facts.resume_failed = part.resume_failed.clone();
        facts.mounts = part.mounts.clone();
        facts.remount = self.stale_mounts(&part, record.checkpoint.as_ref().and(record.checkpoint_ms));
        let life_from = facts.life_from_ms;
        let open = Open {
            id: record.id.clone(),
            run,
            facts: Facts::Sandbox(Box::new(facts)),
        };
        // One its timeout paused is kept for the retention from its pause.
        let lifetime = match part.auto_paused_ms {
            Some(at) => Duration::from_millis(at.saturating_sub(life_from)) + self.paused_retention,
            None => Duration::from_secs(part.lifetime_secs),
        };
        let timers = Timers {
            idle: Duration::from_secs(part.idle_secs),
            lifetime: Some(lifetime),
        };
        let lived = Duration::from_millis((engine::row::now_ms() as u64).saturating_sub(life_from));
        let opened = Instant::now().checked_sub(lived).unwrap_or_else(Instant::now);
        // Its open ports again, with their tokens.
        let ports: BTreeMap<u16, String> = part.ports.iter().map(|p| (p.port, p.token.clone())).collect();
        self.save_record_with(&open, &ports);
        // Its owner as the tenants database has it (an id of before tenants is adopted as
        // the default tenant's).
        let owner = self
            .tenancy
            .owners
            .of(tenants::Kind::Sandbox, &record.id)
            .first()
            .map_or(tenants::DEFAULT, |o| o.tenant);
        let card = Card {
            ports,
            ..super::card(owner, open.sandbox())
        };
        self.forks()
            .add_paused(&record.id, Kind::Sandbox, open, card, timers, opened);
        self.tell(&record.id, restored);
        Ok((record.id, checkpoint))
    }

    /// A sandbox that never had a checkpoint: its environment forked again with its settings,
    /// and paused at once.
    async fn fresh_checkpoint(&self, id: &str, settings: &crate::entries::Settings) -> anyhow::Result<PausedFork> {
        let mut run = self
            .host
            .open_sandbox(
                &settings.ready.snapshot,
                &settings.ready.image,
                &settings.spec,
                self.seed(),
                None,
            )
            .await
            .map_err(|e| anyhow::anyhow!("forking its environment again: {}", e.describe()))?;
        let dir = self.checkpoint_dir(id);
        let pending = run
            .pause(&dir)
            .await
            .map_err(|e| anyhow::anyhow!("pausing its new fork: {}", engine::describe(&e)))?;
        pending.commit();
        let paused = run.paused().expect("just paused").clone();
        drop(run);
        paused.keep_on_disk();
        Ok(PausedFork::load(&dir, &self.host.store)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_taken_up_says_what_it_lost() {
        let told = |graceful, paused, checkpoint| restored_event(graceful, paused, checkpoint);
        assert_eq!(told(true, true, true).cause, Some(Cause::ServiceStop));
        assert!(told(false, true, true).reason.unwrap().contains("exactly"));
        assert!(told(false, false, true).reason.unwrap().contains("is lost"));
        assert!(
            told(true, false, true).reason.unwrap().contains("is lost"),
            "a pause that failed at the stop"
        );
        assert!(told(false, false, false).reason.unwrap().contains("fresh fork"));
    }
}
