//! Paused sessions: `POST /v1/sessions/{id}/pause` saves a live session to the service's
//! output folder and stops its VM; `/resume` forks it again, as it was. A paused session
//! holds no VM and no session slot, has no lease, survives a restart of the service (even
//! `kill -9`), and is removed after `serve.paused_retention_secs`.
//!
//! ```text
//! out/paused/<session id>.<ms>/
//!   session.json   its restart record (crate::record): suite, task, limits, steps so far, seed, ids
//!   fork.json      the fork (engine::pause): identity, workspace baseline, network
//!   state/         its snapshot, stored against the task's (snapshotter::paused)
//! ```
//!
//! Order of writes: the folder is complete before `requests.jsonl` records the pause, and
//! the VM stops only after that. A resume records itself once the new VM runs. A restart
//! takes up every session whose last record is a pause; any other folder is removed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use engine::book::{Kind, Refusal};
use engine::pause::PausedFork;
use engine::session::{SessionPauseError, SessionProgress, SessionState};
use engine::Served;

use super::entries::{Facts, Open};
use super::requests::Record;
use super::wire::{PausedView, SessionList, SessionView};
use crate::error::ErrorKind;
use crate::error::{ApiError, ApiResult};
use crate::ids::SessionId;
use crate::record::{ForkRecord, Of, RecordError, SessionPart};
use crate::state::Service;
use crate::tenancy::Who;

/// The part of a session's restart record ([`crate::record`]) only a session has.
fn session_part(session: &Open) -> SessionPart {
    let run = session.task();
    let served = run.served();
    let progress = run.progress();
    SessionPart {
        suite: session.suite().to_string(),
        task_id: run.task().id.clone(),
        task_row: match &session.facts {
            Facts::Session { task_row, .. } => task_row.clone(),
            Facts::Sandbox(_) => None,
        },
        seed: progress.seed,
        rollout_id: served.rollout_id.clone(),
        group_id: served.group_id.clone(),
        policy_version: served.policy_version,
        metadata: served.metadata.clone(),
        limits: progress.limits,
        steps: progress.steps,
        spent_ms: progress.spent.as_millis() as u64,
    }
}

/// A session's state as its view names it.
fn state_name(state: SessionState) -> &'static str {
    match state {
        SessionState::Live => "live",
        SessionState::Paused => "paused",
        SessionState::Ended => "ended",
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Service {
    /// `out/paused`.
    pub fn paused_root(&self) -> PathBuf {
        self.out.join("paused")
    }

    /// What GET says of a session.
    pub fn describe(&self, id: &str, session: &Open) -> SessionView {
        let run = session.task();
        let served = run.served();
        let paused = session.run.paused().map(|p| PausedView {
            since_unix: p.record.paused_unix,
            expires_unix: p.record.paused_unix + self.settings.paused_retention_secs,
            disk_bytes: p.disk_bytes(),
            memory_pages_changed: p.record.packed.pages,
            memory_bytes: p.record.packed.memory_bytes,
        });
        SessionView {
            session_id: id.to_string(),
            state: state_name(session.run.state()).into(),
            rollout_id: Some(served.rollout_id.clone()),
            group_id: Some(served.group_id.clone()),
            suite: Some(session.suite().to_string()),
            task_id: Some(run.task().id.clone()),
            steps: Some(run.steps().len()),
            spent_secs: Some(run.spent().as_secs_f64()),
            paused,
            mcp: None,
        }
    }

    /// `GET /v1/sessions/{id}`, with where its agent reaches it over MCP.
    pub async fn get_session(&self, who: &Who, id: &SessionId) -> ApiResult<SessionView> {
        let session = self.forks().any(id, Kind::Session);
        let mut view = match session {
            Ok(s) => {
                let s = s.lock().await;
                self.describe(id, &s)
            }
            // Being scored: say so without waiting for it.
            Err(Refusal::BeingScored(_)) => SessionView::bare(id, "submitting"),
            Err(e) => return Err(e.into()),
        };
        view.mcp = Some(self.mcp_access(who, id));
        Ok(view)
    }

    /// Whether a session is there (live or paused), without waiting for a call running in it.
    pub fn session_known(&self, id: &SessionId) -> ApiResult<()> {
        self.forks().any(id, Kind::Session)?;
        Ok(())
    }

    /// The cap on a step's output in a session (`rollouts.output_cap_bytes`).
    pub async fn session_output_cap(&self, id: &SessionId) -> ApiResult<u64> {
        let session = self.forks().any(id, Kind::Session)?;
        let s = session.lock().await;
        Ok(s.task().limits().output_cap_bytes)
    }

    /// A session's task: its id and instruction.
    pub async fn session_task(&self, id: &SessionId) -> ApiResult<(String, String)> {
        let session = self.forks().any(id, Kind::Session)?;
        let s = session.lock().await;
        Ok((s.task().task().id.clone(), s.task().task().instruction.clone()))
    }

    /// `GET /v1/sessions`: the caller's live and paused sessions.
    pub async fn list_sessions(&self, who: &Who) -> ApiResult<SessionList> {
        let mine = self.forks().all_with(Kind::Session, |card| card.owner == who.tenant());
        let mut out = Vec::new();
        for (id, session) in mine {
            match session.try_lock() {
                Ok(s) => out.push(self.describe(&id, &s)),
                Err(_) => out.push(SessionView::bare(&id, "busy")),
            }
        }
        out.sort_by(|a, b| a.session_id.cmp(&b.session_id));
        Ok(SessionList { sessions: out })
    }

    /// `POST /v1/sessions/{id}/pause`, within the caller's disk. Pausing a paused session
    /// answers the same again.
    pub async fn pause_session(&self, who: &Who, id: &SessionId) -> ApiResult<SessionView> {
        self.check_disk(who)?;
        let handle = self.forks().any(id, Kind::Session)?;
        let mut session = handle.lock().await;
        if session.run.state() == SessionState::Paused {
            return Ok(self.describe(id, &session));
        }
        if self.forks().any(id, Kind::Session).is_err() {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!("session {id:?} is being submitted and scored: it cannot be paused"),
            ));
        }
        let started = Instant::now();
        let at_ms = engine::row::now_ms() as u64;
        let folder = format!("{id}.{at_ms}");
        let dir = self.paused_root().join(&folder);
        let record = ForkRecord::new(id, Some(folder), Some(at_ms), Of::Session(session_part(&session)));
        let pending = session.run.pause(&dir).await.map_err(|e| match e {
            SessionPauseError::Refused(e) => ApiError::session(id, e),
            e => ApiError::new(
                ErrorKind::Unavailable,
                format!("pausing session {id:?} failed: {}", engine::describe(&e)),
            ),
        })?;
        // The folder is complete before the journal says so; the VM stops only after that.
        let path = dir.join("session.json");
        let written = tokio::task::spawn_blocking(move || record.write(&path))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        let journaled = match written {
            Ok(()) => self
                .recorder
                .journal_request(&Record::SessionPaused {
                    session_id: id.to_string(),
                    dir: dir.file_name().unwrap_or_default().to_string_lossy().to_string(),
                })
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(format!("writing {}: {e}", dir.join("session.json").display())),
        };
        if let Err(e) = journaled {
            pending.cancel().await;
            return Err(ApiError::new(
                ErrorKind::Internal,
                format!("recording the pause of session {id:?}: {e}"),
            ));
        }
        pending.commit();
        self.forks().pause(id);
        self.tell_session(id, crate::events::EventType::Paused, crate::events::ForkState::Paused);
        tracing::info!(session_id = %id, "session paused in {:.1} s", started.elapsed().as_secs_f64());
        let answer = self.describe(id, &session);
        drop(session);
        self.update_session_gauges();
        Ok(answer)
    }

    /// `POST /v1/sessions/{id}/resume`, its VM within the caller's quotas, handed back once it
    /// has what `keep` names (else the new VM goes, it stays paused, and the answer is a 409
    /// naming what is missing). Resuming a live session answers the same again.
    pub async fn resume_session(
        &self,
        who: &Who,
        id: &SessionId,
        keep: Option<crate::sandbox::sandboxes::kept::Keep>,
    ) -> ApiResult<SessionView> {
        if let Some(keep) = &keep {
            keep.check("keep")?;
        }
        let mib = self.session_card(id)?.memory_mib;
        let _held = self.admit_forks(who, 1, mib).await?;
        let handle = self.forks().any(id, Kind::Session)?;
        if !self.forks().is_paused(id) {
            let session = handle.lock().await;
            return Ok(self.describe(id, &session));
        }
        let slot = self.vm_slot()?;
        let mut session = handle.lock().await;
        let pending = session.run.resume().await.map_err(|e| {
            ApiError::new(
                ErrorKind::Unavailable,
                format!("resuming session {id:?} failed: {}", engine::describe(&e)),
            )
        })?;
        let Some(pending) = pending else {
            return Ok(self.describe(id, &session));
        };
        if let Some(keep) = keep.filter(|k| !k.is_empty()) {
            let missing = crate::sandbox::sandboxes::kept::missing(&pending.guest(), &keep).await;
            if !missing.is_empty() {
                drop(pending);
                let why = missing.join("; ");
                if let Some(owner) = self.forks().card(id, Kind::Session).map(|c| c.owner) {
                    let failed = crate::events::Happened::session(
                        crate::events::EventType::ResumeFailed,
                        crate::events::ForkState::Paused,
                    )
                    .reason(&why);
                    self.events.emit(owner, id, failed);
                }
                return Err(ApiError::new(
                    ErrorKind::Conflict,
                    format!("session {id} failed its resume checks: {why}; it stays paused"),
                ));
            }
        }
        self.recorder
            .journal_request(&Record::SessionResumed {
                session_id: id.to_string(),
            })
            .await
            .map_err(|e| {
                ApiError::new(
                    ErrorKind::Internal,
                    format!("recording the resume of session {id:?}: {e}"),
                )
            })?;
        pending.commit();
        slot.taken(); // the session's now (`resume` takes the reservation)
        self.forks().resume(id, Instant::now());
        self.tell_session(id, crate::events::EventType::Resumed, crate::events::ForkState::Running);
        let answer = self.describe(id, &session);
        drop(session);
        self.update_session_gauges();
        Ok(answer)
    }

    /// Tells a session's owner of a change of its state.
    fn tell_session(&self, id: &str, event: crate::events::EventType, state: crate::events::ForkState) {
        if let Some(owner) = self.forks().card(id, Kind::Session).map(|c| c.owner) {
            self.events
                .emit(owner, id, crate::events::Happened::session(event, state));
        }
    }

    pub fn update_session_gauges(&self) {
        let (all, (live, paused)) = {
            let forks = self.forks();
            (forks.all(Kind::Session), forks.count(Kind::Session))
        };
        // Bytes of the sessions not busy right now (a busy one is counted next time).
        let bytes: u64 = all
            .iter()
            .filter_map(|(_, s)| s.try_lock().ok().and_then(|s| s.run.paused().map(|p| p.disk_bytes())))
            .sum();
        let m = engine::metrics::get();
        m.sessions_live.set(live as i64);
        m.sessions_paused.set(paused as i64);
        m.paused_bytes.set(bytes as i64);
    }

    /// Paused sessions older than `serve.paused_retention_secs` are removed.
    pub async fn expire_paused(&self) {
        let ids = self.forks().paused_ids(Kind::Session);
        let now = now_unix();
        for id in ids {
            let handle = match self.forks().any(&id, Kind::Session) {
                Ok(h) => h,
                Err(_) => continue,
            };
            let old = match handle.try_lock() {
                Ok(s) => s
                    .run
                    .paused()
                    .is_some_and(|p| now >= p.record.paused_unix + self.settings.paused_retention_secs),
                Err(_) => false,
            };
            if old {
                tracing::info!(session_id = %id, "paused session removed after serve.paused_retention_secs");
                let _ = self
                    .end_session(
                        &super::ids::SessionId::trusted(&id),
                        "paused past serve.paused_retention_secs",
                        crate::events::Cause::Lifetime,
                    )
                    .await;
            }
        }
    }

    /// A paused session of an earlier process, from its folder.
    pub async fn take_up_paused(&self, dir: &Path) -> Result<(String, Open), TakeUpError> {
        let path = dir.join("session.json");
        let (record, file) = ForkRecord::read(&path)?.into_session(&path)?;
        let (_, state) = self
            .suite(Some(&file.suite), "suite")
            .map_err(|e| TakeUpError::NotServed(e.message))?;
        let task_id = file.task_row.is_none().then_some(file.task_id.as_str());
        let (task, snapshot) = self
            .resolve_task(state, task_id, file.task_row.as_ref(), &|f: &str| f.to_string())
            .await
            .map_err(|e| TakeUpError::NotServed(e.message))?;
        let paused = PausedFork::load(dir, &state.engine.store)?;
        if paused.record.base != snapshot.id() {
            return Err(TakeUpError::OtherSnapshot {
                paused: paused.record.base.clone(),
                now: snapshot.id().to_string(),
            });
        }
        let served = Served {
            suite: file.suite.clone(),
            rollout_id: file.rollout_id,
            group_id: file.group_id,
            policy_version: file.policy_version,
            metadata: file.metadata,
        };
        let progress = SessionProgress {
            seed: file.seed,
            limits: file.limits,
            steps: file.steps,
            spent: Duration::from_millis(file.spent_ms),
        };
        let run = state.engine.paused_session(task, snapshot, paused, progress, served);
        let session = Open {
            id: record.id.clone(),
            run,
            facts: Facts::Session {
                suite: file.suite,
                task_row: file.task_row,
            },
        };
        Ok((record.id, session))
    }
}

/// Why a paused session of an earlier process could not be taken up.
#[derive(Debug, thiserror::Error)]
pub enum TakeUpError {
    #[error(transparent)]
    Record(#[from] RecordError),
    /// Its suite or task is not served any more (the service's own answer).
    #[error("{0}")]
    NotServed(String),
    #[error(transparent)]
    Load(#[from] engine::pause::PauseError),
    #[error("it was paused from snapshot {paused} and its task now has {now}")]
    OtherSnapshot { paused: String, now: String },
}
