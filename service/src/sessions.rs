//! Live sessions: environments a caller steps itself (`POST /v1/sessions`, exec,
//! write_file), branches, and their end: submitted and scored like a rollout, deleted, or
//! expired.
//!
//! A session's life: opening (a slot reserved) → live → (submitting) → ended. While it is
//! submitted, nothing else may touch it (409), and expiry and shutdown leave it to finish.

use crate::events::{Cause, EventType, ForkState, Happened};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::book::{Kind, Timers};
use engine::config::Action;
use engine::row::{Row, Step};
use engine::session::{Acted, SessionBranchError};
use engine::{rollout_seed, Served};
use serde_json::json;

use super::entries::{Card, Entry, Facts, Open, Phase};
use super::requests::metadata_text;
use super::requests::{ItemRequest, Record};
use super::wire::{Branched, McpAccess, SessionEnded, SessionOpened, SessionScored, Stepped};
use crate::error::{ApiError, ApiResult};
use crate::forks::{InUse, VmSlot};
use crate::state::Service;
use crate::tenancy::Who;

use crate::error::ErrorKind;
pub use crate::ids::SessionId;

impl Service {
    /// Memory for one more VM at the measured cost, past the reserve; or 503 with the figures.
    pub fn check_memory(&self) -> ApiResult<()> {
        let Some(host) = engine::sizing::HostMemory::probe() else {
            return Ok(());
        };
        super::admission::check(&host, self.settings.memory_reserve_percent, self.vm_cost.current()).map_err(|why| {
            ApiError {
                retry_after: Some(5),
                ..ApiError::new(ErrorKind::Unavailable, why.to_string())
            }
        })
    }

    /// A session's timers: its lease, and no lifetime of its own.
    pub fn session_timers(&self) -> Timers {
        Timers {
            idle: Duration::from_secs(self.settings.session_lease_secs),
            lifetime: None,
        }
    }

    /// Journals a session, then makes it live (or ends it, when a shutdown began meanwhile).
    async fn add_session(&self, slot: VmSlot, session: Open, card: Card) -> ApiResult<()> {
        let admitted = session.admitted();
        let id = session.id.clone();
        self.recorder
            .journal_request(&Record::Session {
                session_id: id.clone(),
                rollout: admitted.clone(),
            })
            .await
            .map_err(|e| ApiError::new(ErrorKind::Internal, format!("journaling the session: {e}")))?;
        {
            let mut inner = self.lock();
            inner.rollouts.insert(
                admitted.rollout_id.clone(),
                Entry::new(&admitted, Some(id.clone()), Phase::Session),
            );
            // The slot becomes the session's.
            slot.taken();
            let mut forks = self.forks();
            let owner = card.owner;
            forks.open(&id, Kind::Session, session, card, self.session_timers(), Instant::now());
            engine::metrics::get()
                .sessions_live
                .set(forks.count(Kind::Session).0 as i64);
            drop(forks);
            drop(inner);
            let created = Happened::session(EventType::Created, ForkState::Running);
            self.events.emit(owner, &id, created);
        }
        if self.stopping.load(Ordering::SeqCst) {
            let _ = self
                .end_session(&SessionId::trusted(&id), "the service shut down", Cause::ServiceStop)
                .await;
            return Err(ApiError::new(ErrorKind::Unavailable, "the service is shutting down"));
        }
        Ok(())
    }

    /// The caller's session `id`; another's, or one that never was, is the same 404.
    pub fn resolve_session(&self, who: &Who, id: &str) -> ApiResult<SessionId> {
        // A session in the book is its card's; one that went, the tenants database's.
        let owner = self.forks().card(id, Kind::Session).map(|card| card.owner);
        let mine = match owner {
            Some(owner) => owner == who.tenant(),
            None => self.tenancy.owns(who.tenant(), tenants::Kind::Session, id),
        };
        match mine {
            true => Ok(SessionId::trusted(id)),
            false => Err(crate::tenancy::not_found(tenants::Kind::Session, id)),
        }
    }

    /// Where the agent in a session reaches it over MCP, and the token that opens only that.
    pub fn mcp_access(&self, who: &Who, id: &SessionId) -> McpAccess {
        McpAccess {
            path: format!("/v1/sessions/{id}/mcp"),
            token: self.tenancy.mcp_token(who.tenant(), id),
        }
    }

    /// Records a session just made (and its rollout) as the caller's in the tenants database.
    fn own_session(&self, who: &Who, session: &str, rollout: &str) -> ApiResult<SessionId> {
        let tenancy = &self.tenancy;
        tenancy.own(who.tenant(), tenants::Kind::Session, &[session.to_string()])?;
        tenancy.own(who.tenant(), tenants::Kind::Rollout, &[rollout.to_string()])?;
        Ok(SessionId::trusted(session))
    }

    /// `POST /v1/sessions` (and OpenEnv's reset): a session of the caller's, within its
    /// quotas.
    pub async fn open_session(&self, who: &Who, request: ItemRequest) -> ApiResult<(SessionId, SessionOpened)> {
        let mib = self.session_mib();
        let _held = self.admit_forks(who, 1, mib).await?;
        let card = Card {
            owner: who.tenant(),
            memory_mib: mib,
            environment: None,
            ports: Default::default(),
        };
        // The workspaces it starts from, read now (a copy each: no hold is taken).
        request.check_session()?;
        let read_only: Vec<_> = request
            .workspaces
            .iter()
            .map(|m| crate::workspaces::MountRequest {
                read_only: true,
                ..m.clone()
            })
            .collect();
        let copies = match &self.sandbox {
            Some(api) if !read_only.is_empty() => api.workspaces.claim(who.tenant(), "", &read_only)?,
            None if !request.workspaces.is_empty() => {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    "workspaces",
                    "workspaces need the sandbox API (serve.sandboxes.enabled)",
                ))
            }
            _ => Vec::new(),
        };
        let mut opened = self.open_session_as_asked(request, card, copies).await?;
        let id = self.own_session(who, &opened.session_id, &opened.rollout_id)?;
        opened.mcp = Some(self.mcp_access(who, &id));
        Ok((id, opened))
    }

    async fn open_session_as_asked(
        &self,
        request: ItemRequest,
        card: Card,
        workspaces: Vec<(crate::workspaces::Mounted, Vec<u8>)>,
    ) -> ApiResult<SessionOpened> {
        request.check_session()?;
        request.check_bounds(&|f: &str| f.to_string())?;
        let slot = self.vm_slot()?;
        let metadata = metadata_text(request.metadata.as_ref(), "metadata")?;
        let (suite_name, state) = self.suite(request.suite.as_deref(), "suite")?;
        let (task, snapshot) = self
            .resolve_task(state, request.task_id.as_deref(), request.task.as_ref(), &|f: &str| {
                f.to_string()
            })
            .await?;
        let limits = request
            .limits
            .apply(&state.engine.config.rollouts, &|f: &str| f.to_string())?;
        let seed = rollout_seed(request.seed, &task.id, 0);
        let (rollout_id, session_id, group_id) = (self.new_id("r"), self.new_id("s"), self.new_id("g"));
        let served = Served {
            suite: suite_name.to_string(),
            rollout_id: rollout_id.clone(),
            group_id: group_id.clone(),
            policy_version: request.policy_version,
            metadata,
        };
        let run = state
            .engine
            .open_session(task.clone(), snapshot, seed, limits, served)
            .await
            .map_err(|end| {
                ApiError::new(
                    ErrorKind::Unavailable,
                    format!("opening the session failed: {}", end.error().unwrap_or_default()),
                )
            })?;
        let mut run = run;
        if let Err(e) = start_from_workspaces(&run, &workspaces).await {
            run.close();
            return Err(e);
        }
        let session = Open {
            id: session_id.clone(),
            run,
            facts: Facts::Session {
                suite: suite_name.to_string(),
                task_row: request.task.clone(),
            },
        };
        self.add_session(slot, session, card).await?;
        Ok(SessionOpened {
            session_id,
            rollout_id,
            group_id,
            task_id: task.id.clone(),
            suite: suite_name.to_string(),
            instruction: task.instruction.clone(),
            mcp: None,
        })
    }

    fn session(&self, id: &str) -> ApiResult<Arc<tokio::sync::Mutex<Open>>> {
        Ok(self.forks().usable(id, Kind::Session, Instant::now())?)
    }

    /// Marks a session used now, if it is still live.
    pub fn touch(&self, id: &SessionId) {
        self.forks().touch(id, Instant::now());
    }

    /// The engine of a session's suite.
    pub fn engine_of(&self, session: &Open) -> Arc<engine::Engine> {
        self.suites[session.suite()].engine.clone()
    }

    /// Records the row of a session that ended without a score: what the caller is told.
    async fn ended_row(&self, row: Row, step: Option<Step>, observation: String) -> Stepped {
        let (status, error) = (row.status, row.error.clone());
        let cursor = self.emit(row).await;
        Stepped {
            step: step.map(|s| json!(s)),
            observation,
            ended: true,
            status: Some(status),
            error,
            cursor,
        }
    }

    /// `POST /v1/sessions/{id}/exec` and `/write_file`: one action, its observation. The
    /// session's actions share its `timeout_secs` budget, as a rollout's do; past it the
    /// session ends as a `timeout`.
    pub async fn act(&self, id: &SessionId, action: Action, timeout_secs: Option<u64>) -> ApiResult<Stepped> {
        super::admission::step_room(self.settings.memory_reserve_percent)?;
        super::requests::check_action(&action)?;
        if timeout_secs == Some(0) {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                "timeout_secs",
                "must be at least 1",
            ));
        }
        let session = self.session(id)?;
        // Not idle while the step runs, however long it takes.
        let _in_use = InUse::begin(&self.forks, id);
        let mut session = session.lock().await;
        let engine = self.engine_of(&session);
        let acted = session
            .run
            .act(&engine, &action, timeout_secs)
            .await
            .map_err(|e| ApiError::session(id, e))?;
        let observation = acted.observation(session.task().limits());
        match acted {
            Acted::Stepped(step) => Ok(Stepped {
                step: Some(json!(step)),
                observation,
                ended: false,
                status: None,
                error: None,
                cursor: None,
            }),
            Acted::Ended { step, row } => {
                let out = self.ended_row(*row, step, observation).await;
                drop(session);
                self.drop_session(id, Phase::Done, (Cause::Submitted, "its task ended it"));
                Ok(out)
            }
        }
    }

    /// `POST /v1/sessions/{id}/branch` (and OpenEnv's `branch_of`): of a live session, or of
    /// a paused one (which stays paused); the caller's, within its quotas.
    pub async fn branch(&self, who: &Who, id: &SessionId) -> ApiResult<(SessionId, Branched)> {
        let card = self.session_card(id)?;
        let _held = self.admit_forks(who, 1, card.memory_mib).await?;
        let mut branched = self.branch_as_asked(id, card).await?;
        let child = self.own_session(who, &branched.session_id, &branched.rollout_id)?;
        branched.mcp = Some(self.mcp_access(who, &child));
        Ok((child, branched))
    }

    /// A session's card (a branch's is its parent's): 404 when it is not in the book.
    pub fn session_card(&self, id: &SessionId) -> ApiResult<Card> {
        let forks = self.forks();
        let card = forks
            .card(id, Kind::Session)
            .ok_or_else(|| ApiError::from(engine::book::Refusal::NoneLiveOrPaused(id.to_string())))?;
        Ok(card.clone())
    }

    async fn branch_as_asked(&self, id: &str, card: Card) -> ApiResult<Branched> {
        let slot = self.vm_slot()?;
        let session = self.forks().any(id, Kind::Session)?;
        let session = session.lock().await;
        let parent = session.task().served().clone();
        let (rollout_id, session_id) = (self.new_id("r"), self.new_id("s"));
        let seed = rollout_seed(session.task().seed(), &rollout_id, 0);
        let served = Served {
            rollout_id: rollout_id.clone(),
            ..parent.clone()
        };
        let run = session
            .run
            .branch(&self.branches, seed, Some(served))
            .await
            .map_err(|e| match e {
                SessionBranchError::Refused(e) => ApiError::session(id, e),
                e => ApiError::new(
                    ErrorKind::Unavailable,
                    format!("branching session {id:?} failed: {}", engine::describe(&e)),
                ),
            })?;
        let new = Open {
            id: session_id.clone(),
            run,
            facts: Facts::Session {
                suite: session.suite().to_string(),
                task_row: match &session.facts {
                    Facts::Session { task_row, .. } => task_row.clone(),
                    Facts::Sandbox(_) => None,
                },
            },
        };
        drop(session);
        self.add_session(slot, new, card).await?;
        Ok(Branched {
            session_id,
            rollout_id,
            group_id: parent.group_id,
            parent: id.to_string(),
            mcp: None,
        })
    }

    /// `POST /v1/sessions/{id}/submit`: ends the session, scores it like any rollout (with
    /// the suite's scoring mode: by default in a fresh fork, where the session cannot reach)
    /// and records the row.
    pub async fn submit_session(&self, id: &SessionId, answer: Option<String>) -> ApiResult<SessionScored> {
        if let Some(answer) = &answer {
            super::bounds::text("answer", answer, super::bounds::ANSWER_BYTES)?;
        }
        let session = self.session(id)?;
        // From here on, expiry, DELETE and shutdown leave this session to finish.
        if !self.forks().begin_submit(id) {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!("session {id:?} is being submitted"),
            ));
        }
        let mut session = session.lock().await;
        let engine = self.engine_of(&session);
        let row = match session.run.submit(&engine, answer).await {
            Ok(row) => row,
            Err(e) => {
                self.forks().abandon_submit(id);
                return Err(ApiError::session(id, e));
            }
        };
        let cursor = self.emit(row.clone()).await;
        drop(session);
        self.drop_session(id, Phase::Done, (Cause::Submitted, "submitted"));
        let details = serde_json::from_str::<serde_json::Value>(&row.score_details).unwrap_or_default();
        Ok(SessionScored {
            rollout_id: row.rollout_id,
            status: row.status,
            reward: row.reward,
            error: row.error,
            trust: row.trust,
            trust_reason: row.trust_reason,
            cursor,
            score_details: details,
        })
    }

    /// `DELETE /v1/sessions/{id}`: ends it without a row.
    pub async fn end_session(&self, id: &SessionId, reason: &str, cause: Cause) -> ApiResult<SessionEnded> {
        self.forks().endable(id, Kind::Session)?;
        self.recorder
            .journal_request(&Record::SessionEnd {
                session_id: id.to_string(),
                reason: reason.to_string(),
            })
            .await
            .map_err(|e| ApiError::new(ErrorKind::Internal, format!("journaling the session's end: {e}")))?;
        self.drop_session(id, Phase::Done, (cause, reason));
        Ok(SessionEnded {
            session_id: id.to_string(),
            ended: true,
        })
    }

    /// Takes an ended session out of the book (`why`: as its owner is told).
    fn drop_session(&self, id: &str, phase: Phase, why: (Cause, &str)) {
        let owner = self.forks().card(id, Kind::Session).map(|c| c.owner);
        if let Some(owner) = owner {
            let ended = Happened::session(EventType::Ended, ForkState::Ended)
                .cause(why.0)
                .reason(why.1);
            self.events.emit(owner, id, ended);
        }
        let mut inner = self.lock();
        let rollout = inner
            .rollouts
            .iter()
            .find(|(_, e)| e.session.as_deref() == Some(id))
            .map(|(r, _)| r.clone());
        if let Some(entry) = rollout.and_then(|r| inner.rollouts.get_mut(&r)) {
            if entry.phase == Phase::Session {
                entry.phase = phase;
            }
        }
        let mut forks = self.forks();
        let removed = forks.remove(id, engine::book::Ending::Ended("ended".into()));
        let (live, paused) = forks.count(Kind::Session);
        engine::metrics::get().sessions_live.set(live as i64);
        engine::metrics::get().sessions_paused.set(paused as i64);
        drop(forks);
        drop(inner);
        // Nobody else holds it (no call in flight): its VM may serve the next session of its
        // snapshot after a reset in place (an OpenEnv reset on the same connection).
        if let Some(open) = removed.and_then(|o| Arc::try_unwrap(o).ok()).map(|o| o.into_inner()) {
            if matches!(open.facts, Facts::Session { .. }) {
                let engine = self.engine_of(&open);
                open.run.end_reusing(&engine);
            }
        }
    }

    pub async fn expire_sessions(&self) {
        self.expire_paused().await;
        self.update_session_gauges();
        let expired = self.forks().expired(Kind::Session, Instant::now());
        for (id, _) in expired {
            tracing::info!(session_id = %id, "session expired");
            let _ = self
                .end_session(&SessionId::trusted(&id), "unused past its lease", Cause::IdleTimeout)
                .await;
        }
    }
}

/// Writes each workspace a session starts from into its guest at its path.
async fn start_from_workspaces(
    run: &engine::session::Session,
    workspaces: &[(crate::workspaces::Mounted, Vec<u8>)],
) -> ApiResult<()> {
    if workspaces.is_empty() {
        return Ok(());
    }
    let guest = run
        .guest()
        .map_err(|e| ApiError::new(ErrorKind::Internal, format!("starting from workspaces: {e}")))?;
    for (mount, bytes) in workspaces {
        let archive = match bytes.is_empty() {
            true => crate::workspaces::empty_archive(),
            false => bytes.clone(),
        };
        guest.write_folder(&mount.path, archive).await.map_err(|e| {
            ApiError::new(
                ErrorKind::GuestFailed,
                format!("writing workspace {:?} at {}: {e}", mount.name, mount.path),
            )
        })?;
    }
    Ok(())
}
