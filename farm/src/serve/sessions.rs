//! Live sessions: environments a caller steps itself (`POST /v1/sessions`, exec,
//! write_file), branches, and their end: submitted and scored like a rollout, deleted, or
//! expired.
//!
//! A session's life: opening (a slot reserved) → live → (submitting) → ended. While it is
//! submitted, nothing else may touch it (409), and expiry and shutdown leave it to finish.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datasets::Task;
use engine::config::{Action, RolloutsSection};
use engine::metrics::Role;
use engine::pause::PausedFork;
use engine::row::{Row, Status, Step};
use engine::{observation, rollout_seed, Branch, End, LiveFork, Planned, Policy, Served, TaskSnapshot};
use serde_json::json;
use snapshotter::Snapshot;

use super::requests::{Admitted, ItemRequest, Record};
use super::rollouts::metadata_text;
use super::service::{ApiError, ApiResult, Entry, Phase, Service};

/// A live environment a caller steps.
pub struct Session {
    pub(super) id: String,
    pub(super) suite: String,
    pub(super) task: Arc<Task>,
    /// The inline task it was opened with (to take it up again after a restart).
    pub(super) task_row: Option<serde_json::Value>,
    pub(super) snapshot: Arc<Snapshot>,
    /// None once ended, or while paused.
    pub(super) live: Option<LiveFork>,
    /// Its saved state while paused (no VM).
    pub(super) paused: Option<Arc<PausedFork>>,
    pub(super) steps: Vec<Step>,
    pub(super) limits: RolloutsSection,
    pub(super) planned: Planned,
    /// Time its actions took so far (against `limits.timeout_secs`).
    pub(super) spent: Duration,
    /// Branch snapshots this session's fork depends on.
    pub(super) _branch: Option<Arc<Branch>>,
}

impl Session {
    /// What a restart needs to know of it.
    fn admitted(&self) -> Admitted {
        let served = self.planned.served.as_ref().expect("sessions are served");
        Admitted {
            rollout_id: served.rollout_id.clone(),
            group_id: served.group_id.clone(),
            suite: self.suite.clone(),
            task_id: self.task.id.clone(),
            sample: 0,
            seed: self.planned.seed,
            policy_version: served.policy_version,
            policy_name: "session".into(),
            metadata: served.metadata.clone(),
        }
    }
}

/// A session slot taken by [`Service::take_session_slot`]; given back when dropped unless
/// the session was added.
pub(super) struct SessionSlot<'a>(&'a Service);

impl Drop for SessionSlot<'_> {
    fn drop(&mut self) {
        self.0.lock().sessions.release();
    }
}

impl Service {
    /// Memory for one more VM at the measured cost, past the reserve; or 503 with the figures.
    pub(super) fn check_memory(&self) -> ApiResult<()> {
        let Some(host) = vmm::memory::HostMemory::probe() else {
            return Ok(());
        };
        super::admission::check(&host, self.settings.memory_reserve_percent, self.vm_cost.current()).map_err(|why| {
            ApiError {
                retry_after: Some(5),
                ..ApiError::new(503, why.to_string())
            }
        })
    }

    /// The memory part of `GET /v1/capacity`.
    pub(super) fn memory_capacity(&self) -> serde_json::Value {
        let host = vmm::memory::HostMemory::probe().unwrap_or_default();
        let cost = self.vm_cost.current();
        let reserve = super::admission::reserve_bytes(&host, self.settings.memory_reserve_percent);
        json!({
            "available_mib": host.available >> 20,
            "reserve_mib": reserve >> 20,
            "vm_cost_mib": cost.bytes >> 20,
            "vm_cost_sampled": cost.sampled,
            "more_vms": host.available.saturating_sub(reserve) / cost.bytes.max(1),
        })
    }

    /// Reserves a session slot until the session is added (or the reservation dropped).
    pub(super) fn take_session_slot(&self) -> ApiResult<SessionSlot<'_>> {
        self.check_admitting()?;
        self.check_memory()?;
        self.lock().sessions.reserve(self.max_sessions)?;
        Ok(SessionSlot(self))
    }

    /// Journals a session, then makes it live (or ends it, when a shutdown began meanwhile).
    async fn add_session(&self, slot: SessionSlot<'_>, session: Session) -> ApiResult<()> {
        let admitted = session.admitted();
        let id = session.id.clone();
        self.recorder
            .journal_request(&Record::Session {
                session_id: id.clone(),
                rollout: admitted.clone(),
            })
            .await
            .map_err(|e| ApiError::new(500, format!("journaling the session: {e}")))?;
        {
            let mut inner = self.lock();
            // The slot becomes the session's (`open` gives the reservation back).
            std::mem::forget(slot);
            inner.rollouts.insert(
                admitted.rollout_id.clone(),
                Entry::new(&admitted, Some(id.clone()), Phase::Session),
            );
            inner.sessions.open(&id, session, Instant::now());
            engine::metrics::get()
                .sessions_live
                .set(inner.sessions.live_len() as i64);
        }
        if self.stopping.load(Ordering::SeqCst) {
            let _ = self.end_session(&id, "the service shut down").await;
            return Err(ApiError::new(503, "the service is shutting down"));
        }
        Ok(())
    }

    /// `POST /v1/sessions`.
    pub async fn open_session(&self, request: ItemRequest) -> ApiResult<serde_json::Value> {
        request.check_session()?;
        let slot = self.take_session_slot()?;
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
        let planned = Planned {
            task: task.clone(),
            sample: 0,
            seed,
            snapshot: TaskSnapshot::Ready(snapshot.clone()),
            policy: Arc::new(Policy::Actions(Vec::new())),
            limits: limits.clone(),
            served: Some(served),
        };
        let live = state
            .engine
            .open(&task, &snapshot, seed, &limits, Role::Session)
            .await
            .map_err(|end| {
                ApiError::new(
                    503,
                    format!("opening the session failed: {}", end.error().unwrap_or_default()),
                )
            })?;
        let session = Session {
            id: session_id.clone(),
            suite: suite_name.to_string(),
            task: task.clone(),
            task_row: request.task.clone(),
            snapshot,
            live: Some(live),
            paused: None,
            steps: Vec::new(),
            limits,
            planned,
            spent: Duration::ZERO,
            _branch: None,
        };
        self.add_session(slot, session).await?;
        Ok(
            json!({ "session_id": session_id, "rollout_id": rollout_id, "group_id": group_id, "task_id": task.id, "suite": suite_name, "instruction": task.instruction }),
        )
    }

    fn session(&self, id: &str) -> ApiResult<Arc<tokio::sync::Mutex<Session>>> {
        Ok(self.lock().sessions.usable(id, Instant::now())?)
    }

    /// Marks a session used now, if it is still live.
    pub(super) fn touch(&self, id: &str) {
        self.lock().sessions.touch(id, Instant::now());
    }

    /// Ends a session with a row of how it ended (its steps so far): the VM is gone.
    async fn end_with_row(&self, session: &mut Session, end: End) -> serde_json::Value {
        let engine = self.suites[&session.suite].engine.clone();
        let mut row = engine.ended(&session.planned, end);
        row.policy_name = "session".into();
        row.steps = session.steps.clone();
        session.live = None;
        let (status, error) = (row.status, row.error.clone());
        let cursor = self.emit(row).await;
        json!({ "ended": true, "status": status, "error": error, "cursor": cursor })
    }

    /// `POST /v1/sessions/{id}/exec` and `/write_file`: one action, its observation. The
    /// session's actions share its `timeout_secs` budget, as a rollout's do; past it the
    /// session ends as a `timeout`.
    pub async fn act(&self, id: &str, action: Action, timeout_secs: Option<u64>) -> ApiResult<serde_json::Value> {
        if let Some(host) = vmm::memory::HostMemory::probe() {
            super::admission::check_step(&host, self.settings.memory_reserve_percent).map_err(|why| ApiError {
                retry_after: Some(5),
                ..ApiError::new(503, why.to_string())
            })?;
        }
        let session = self.session(id)?;
        let mut session = session.lock().await;
        let live = session
            .live
            .as_ref()
            .ok_or_else(|| ApiError::new(404, format!("session {id:?} has ended")))?;
        if session.steps.len() >= session.limits.max_steps {
            return Err(ApiError::new(
                409,
                format!(
                    "session {id:?} took its {} steps (rollouts.max_steps): submit it",
                    session.limits.max_steps
                ),
            ));
        }
        if let Action::WriteFile { mode, .. } = &action {
            if *mode > 0o7777 {
                return Err(ApiError::field(400, "mode", "must be a file mode (0 to 0o7777, 4095)"));
            }
        }
        let mut limits = session.limits.clone();
        if let Some(t) = timeout_secs {
            if t == 0 {
                return Err(ApiError::field(400, "timeout_secs", "must be at least 1"));
            }
            limits.step_timeout_secs = t.min(limits.step_timeout_secs);
        }
        let engine = self.suites[&session.suite].engine.clone();
        let index = session.steps.len() as u32;
        let budget = Duration::from_secs(limits.timeout_secs).saturating_sub(session.spent);
        let started = Instant::now();
        let result = tokio::time::timeout(budget, engine.act(live, &action, index, &limits)).await;
        session.spent += started.elapsed();
        self.touch(id);
        let (step, end) = match result {
            Ok(Ok((step, _))) => {
                let out = json!({ "step": step, "observation": observation(&step), "ended": false });
                session.steps.push(step);
                return Ok(out);
            }
            // The action took the VM down: the session ends as the agent's failure.
            Ok(Err((step, reason))) => (Some(step), End::AgentBrokeVm(reason)),
            Err(_) => (None, End::Timeout(limits.timeout_secs)),
        };
        session.steps.extend(step.clone());
        let mut out = self.end_with_row(&mut session, end).await;
        drop(session);
        self.drop_session(id, Phase::Done);
        out["step"] = json!(step);
        out["observation"] = match &step {
            Some(step) => json!(observation(step)),
            None => json!(format!("the session ran past its {} s limit", limits.timeout_secs)),
        };
        Ok(out)
    }

    /// `POST /v1/sessions/{id}/branch`: of a live session, or of a paused one (which stays
    /// paused).
    pub async fn branch(&self, id: &str) -> ApiResult<serde_json::Value> {
        let slot = self.take_session_slot()?;
        let session = self.lock().sessions.any(id)?;
        let session = session.lock().await;
        let engine = self.suites[&session.suite].engine.clone();
        let parent = session.planned.served.clone().expect("sessions are served");
        let (rollout_id, session_id) = (self.new_id("r"), self.new_id("s"));
        let seed = rollout_seed(session.planned.seed, &rollout_id, 0);
        let (child, branch) = match (&session.live, &session.paused) {
            (Some(live), _) => {
                let (child, branch) = engine
                    .branch(live, &session.snapshot, &self.branches, seed, Role::Session)
                    .await
                    .map_err(|e| ApiError::new(503, format!("branching session {id:?} failed: {e}")))?;
                (child, Some(branch))
            }
            (None, Some(paused)) => {
                let env = paused.record.env.clone();
                let identity = snapshotter::ForkIdentity {
                    env,
                    ..snapshotter::ForkIdentity::new(seed)
                };
                let child = engine
                    .unpause(paused, Some(identity), Role::Session)
                    .await
                    .map_err(|e| {
                        ApiError::new(
                            503,
                            format!("branching paused session {id:?} failed: {}", engine::describe(&e)),
                        )
                    })?;
                (child, None)
            }
            (None, None) => return Err(ApiError::new(404, format!("session {id:?} has ended"))),
        };
        let mut planned = session.planned.clone();
        planned.seed = seed;
        planned.served = Some(Served {
            rollout_id: rollout_id.clone(),
            ..parent.clone()
        });
        let new = Session {
            id: session_id.clone(),
            suite: session.suite.clone(),
            task: session.task.clone(),
            task_row: session.task_row.clone(),
            snapshot: session.snapshot.clone(),
            live: Some(child),
            paused: None,
            steps: session.steps.clone(),
            limits: session.limits.clone(),
            planned,
            spent: session.spent,
            _branch: branch,
        };
        drop(session);
        self.add_session(slot, new).await?;
        Ok(json!({ "session_id": session_id, "rollout_id": rollout_id, "group_id": parent.group_id, "parent": id }))
    }

    /// `POST /v1/sessions/{id}/submit`: ends the session, scores it like any rollout (with
    /// the suite's scoring mode: by default in a fresh fork, where the session cannot reach)
    /// and records the row.
    pub async fn submit_session(&self, id: &str, answer: Option<String>) -> ApiResult<serde_json::Value> {
        let session = self.session(id)?;
        // From here on, expiry, DELETE and shutdown leave this session to finish.
        if !self.lock().sessions.begin_submit(id) {
            return Err(ApiError::new(409, format!("session {id:?} is being submitted")));
        }
        let mut session = session.lock().await;
        let Some(live) = session.live.take() else {
            self.lock().sessions.abandon_submit(id);
            return Err(ApiError::new(404, format!("session {id:?} has ended")));
        };
        let engine = self.suites[&session.suite].engine.clone();
        let started = Instant::now();
        let mut row: Row = engine.ended(&session.planned, End::Scored);
        row.policy_name = "session".into();
        row.status = Status::EnvError;
        row.steps = session.steps.clone();
        row.timings.rollout_ms = session.spent.as_secs_f64() * 1e3;
        let (task, snapshot) = (session.task.clone(), session.snapshot.clone());
        let end = engine.finish(live, &task, &snapshot, answer, &mut row).await;
        end.settle(&mut row);
        row.timings.total_ms = started.elapsed().as_secs_f64() * 1e3;
        let cursor = self.emit(row.clone()).await;
        drop(session);
        self.drop_session(id, Phase::Done);
        let details = serde_json::from_str::<serde_json::Value>(&row.score_details).unwrap_or_default();
        Ok(
            json!({ "rollout_id": row.rollout_id, "status": row.status, "reward": row.reward, "error": row.error, "trust": row.trust, "trust_reason": row.trust_reason, "cursor": cursor, "score_details": details }),
        )
    }

    /// `DELETE /v1/sessions/{id}`: ends it without a row.
    pub async fn end_session(&self, id: &str, reason: &str) -> ApiResult<serde_json::Value> {
        self.lock().sessions.endable(id)?;
        self.recorder
            .journal_request(&Record::SessionEnd {
                session_id: id.to_string(),
                reason: reason.to_string(),
            })
            .await
            .map_err(|e| ApiError::new(500, format!("journaling the session's end: {e}")))?;
        self.drop_session(id, Phase::Done);
        Ok(json!({ "session_id": id, "ended": true }))
    }

    fn drop_session(&self, id: &str, phase: Phase) {
        let mut inner = self.lock();
        inner.sessions.remove(id);
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
        engine::metrics::get()
            .sessions_live
            .set(inner.sessions.live_len() as i64);
        engine::metrics::get()
            .sessions_paused
            .set(inner.sessions.paused_len() as i64);
    }

    pub(super) async fn expire_sessions(&self) {
        self.expire_paused().await;
        self.update_session_gauges();
        let lease = Duration::from_secs(self.settings.session_lease_secs);
        let idle = self.lock().sessions.idle(lease, Instant::now());
        for id in idle {
            tracing::info!(session_id = %id, "session expired");
            let _ = self.end_session(&id, "expired").await;
        }
    }
}
