//! Live forks a caller holds open, the one lifecycle every front-end shares: a **session**
//! (a task's environment the caller steps itself, one action at a time, then submits to be
//! scored like any rollout: `farm serve`'s session API, OpenEnv, MCP) and a **sandbox** (an
//! environment's fork a client drives freely, with no task and no verdict: the sandbox API)
//! are one type, [`Session`], with an optional task. Front-ends keep only ids, their
//! journals, admission and their wire format; [`crate::book::Book`] keeps a service's open
//! forks (slots, timers, who is being submitted).
//!
//! ```text
//! Engine::open_session / Host::open_sandbox ──> live ──act / exec──> live ... ──submit──> ended
//!                                                │  ├─branch──> a second live fork, from this state
//!                                                │  └─snapshot──> a new environment (sandboxes)
//!                                                └─pause──> paused (no VM) ──resume──> live
//! ```
//! A session ends without a score when an action takes its VM down, when its actions
//! together pass `rollouts.timeout_secs`, or when its front-end ends it ([`Session::end`]);
//! a sandbox ends when its front-end ends it ([`Session::close`]).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datasets::Task;
use snapshotter::{ForkIdentity, Forker, Snapshot, SnapshotStore};

use crate::action::observation;
use crate::config::{Action, RolloutsSection};
use crate::end::End;
use crate::engine::{Engine, Planned, Served, TaskSnapshot};
use crate::host::Host;
use crate::live::{Branch, BranchError, LiveFork};
use crate::metrics::Role;
use crate::pause::{PauseError, PausedFork};
use crate::policy::Policy;
use crate::row::{Row, Status, Step};

mod changes;
mod health;
mod network;
mod pending;
mod reset;
pub use changes::{Change, Judged};
pub use health::{host_oom_kills, VmGone, VmUsage};
pub use pending::{PendingPause, PendingResume};
pub use reset::{ResetWay, SessionResetError};

/// Where a session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionState {
    /// It has a running VM.
    Live,
    /// Saved to disk, without a VM.
    Paused,
    /// Submitted, or ended by its VM, its time limit or its front-end.
    Ended,
}

enum Vm {
    Live(Box<LiveFork>),
    Paused(Arc<PausedFork>),
    Ended,
}

/// A live fork a caller holds open: a session (with a task) or a sandbox (without).
pub struct Session {
    host: Arc<Host>,
    /// Makes its forks (a branch, a resume): with its disk limit.
    forker: Forker,
    /// What it may reach, given again to every VM it gets.
    network: egress::Policy,
    /// The snapshot it was opened from.
    snapshot: Arc<Snapshot>,
    vm: Vm,
    /// Its task and progress (None: a sandbox).
    task: Option<TaskRun>,
    /// The branch snapshot its fork depends on.
    _branch: Option<Arc<Branch>>,
    /// Changes of its VM so far, for requests they cut ([`Session::judge`]).
    pub(crate) changes: changes::Changes,
}

/// A session's task and its progress.
#[derive(Clone)]
pub struct TaskRun {
    /// Its task, seed, limits and `farm serve` ids (`policy` is unused: the caller acts).
    planned: Planned,
    steps: Vec<Step>,
    /// Time its actions took so far (against `limits.timeout_secs`).
    spent: Duration,
}

impl TaskRun {
    pub fn task(&self) -> &Arc<Task> {
        &self.planned.task
    }

    /// Its `farm serve` ids.
    pub fn served(&self) -> &Served {
        self.planned.served.as_ref().expect("sessions are served")
    }

    pub fn limits(&self) -> &RolloutsSection {
        &self.planned.limits
    }

    pub fn seed(&self) -> u64 {
        self.planned.seed
    }

    /// Time its actions took so far.
    pub fn spent(&self) -> Duration {
        self.spent
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// What a restart needs to take it up again (with its task and ids).
    pub fn progress(&self) -> SessionProgress {
        SessionProgress {
            seed: self.planned.seed,
            limits: self.planned.limits.clone(),
            steps: self.steps.clone(),
            spent: self.spent,
        }
    }
}

/// Why a session refused a call (the front-end tells its caller; HTTP: 404 or 409).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionCallError {
    #[error("the session has ended")]
    Ended,
    #[error("the session is paused: resume it first")]
    Paused,
    #[error("the session took its {0} steps (rollouts.max_steps): submit it")]
    StepsTaken(usize),
    #[error("a sandbox has no task: it takes no actions and is never submitted")]
    NoTask,
}

/// What one action did.
pub enum Acted {
    /// The step, and the session goes on.
    Stepped(Step),
    /// The session ended with this action: the VM went down (`step` is what it saw), or the
    /// session's actions passed its time limit (`step` None). `row` records how it ended.
    Ended { step: Option<Step>, row: Box<Row> },
}

impl Acted {
    /// What the caller is shown of it: the step's observation, or why the session ended.
    pub fn observation(&self, limits: &RolloutsSection) -> String {
        match self {
            Acted::Stepped(step) | Acted::Ended { step: Some(step), .. } => observation(step),
            Acted::Ended { step: None, .. } => {
                format!("the session ran past its {} s limit", limits.timeout_secs)
            }
        }
    }
}

/// Why a session could not be branched.
#[derive(Debug, thiserror::Error)]
pub enum SessionBranchError {
    #[error(transparent)]
    Refused(#[from] SessionCallError),
    #[error(transparent)]
    Live(#[from] BranchError),
    #[error("forking the paused state")]
    Paused(#[source] PauseError),
}

impl Engine {
    /// Opens a session on `task`'s pristine state (its snapshot `snapshot`), with `planned`'s
    /// seed, limits and ids. Err: how it ended before it began.
    pub async fn open_session(
        &self,
        task: Arc<Task>,
        snapshot: Arc<Snapshot>,
        seed: u64,
        limits: RolloutsSection,
        served: Served,
    ) -> Result<Session, End> {
        let live = self.open(&task, &snapshot, seed, &limits, Role::Session).await?;
        let network = self.egress_of(&limits);
        Ok(Session {
            host: self.host.clone(),
            forker: self.forker.clone(),
            network,
            snapshot: snapshot.clone(),
            vm: Vm::Live(Box::new(live)),
            task: Some(TaskRun {
                planned: session_plan(task, &snapshot, seed, limits, served),
                steps: Vec::new(),
                spent: Duration::ZERO,
            }),
            _branch: None,
            changes: Default::default(),
        })
    }

    /// A session of an earlier process, paused, from its saved state.
    pub fn paused_session(
        &self,
        task: Arc<Task>,
        snapshot: Arc<Snapshot>,
        paused: PausedFork,
        progress: SessionProgress,
        served: Served,
    ) -> Session {
        let network = self.egress_of(&progress.limits);
        Session {
            host: self.host.clone(),
            forker: self.forker.clone(),
            network,
            snapshot: snapshot.clone(),
            vm: Vm::Paused(Arc::new(paused)),
            task: Some(TaskRun {
                planned: session_plan(task, &snapshot, progress.seed, progress.limits, served),
                steps: progress.steps,
                spent: progress.spent,
            }),
            _branch: None,
            changes: Default::default(),
        }
    }
}

fn session_plan(
    task: Arc<Task>,
    snapshot: &Arc<Snapshot>,
    seed: u64,
    limits: RolloutsSection,
    served: Served,
) -> Planned {
    Planned {
        task,
        sample: 0,
        seed,
        snapshot: TaskSnapshot::Ready(snapshot.clone()),
        policy: Arc::new(Policy::Actions(Vec::new())),
        limits,
        served: Some(served),
    }
}

impl Session {
    /// A sandbox: `live`, a fork of the environment `snapshot` made on `host` by `forker`,
    /// reaching what `network` allows.
    pub(crate) fn sandbox(
        host: Arc<Host>,
        forker: Forker,
        network: egress::Policy,
        snapshot: Arc<Snapshot>,
        live: LiveFork,
    ) -> Session {
        Session {
            host,
            forker,
            network,
            snapshot,
            vm: Vm::Live(Box::new(live)),
            task: None,
            _branch: None,
            changes: Default::default(),
        }
    }

    /// A sandbox paused by an earlier process.
    pub(crate) fn paused_sandbox(
        host: Arc<Host>,
        forker: Forker,
        network: egress::Policy,
        snapshot: Arc<Snapshot>,
        paused: PausedFork,
    ) -> Session {
        Session {
            host,
            forker,
            network,
            snapshot,
            vm: Vm::Paused(Arc::new(paused)),
            task: None,
            _branch: None,
            changes: Default::default(),
        }
    }

    pub fn state(&self) -> SessionState {
        match self.vm {
            Vm::Live(_) => SessionState::Live,
            Vm::Paused(_) => SessionState::Paused,
            Vm::Ended => SessionState::Ended,
        }
    }

    /// Its task and progress (None: a sandbox).
    pub fn task_run(&self) -> Option<&TaskRun> {
        self.task.as_ref()
    }

    /// The snapshot it was opened from.
    pub fn snapshot(&self) -> &Arc<Snapshot> {
        &self.snapshot
    }

    /// The host it runs on.
    pub(crate) fn host(&self) -> &Arc<Host> {
        &self.host
    }

    /// Its saved state, while paused.
    pub fn paused(&self) -> Option<&Arc<PausedFork>> {
        match &self.vm {
            Vm::Paused(p) => Some(p),
            _ => None,
        }
    }

    /// Its running VM: Err while paused or once ended.
    pub fn live(&self) -> Result<&LiveFork, SessionCallError> {
        match &self.vm {
            Vm::Live(live) => Ok(live),
            Vm::Paused(_) => Err(SessionCallError::Paused),
            Vm::Ended => Err(SessionCallError::Ended),
        }
    }

    fn role(&self) -> Role {
        match self.task {
            Some(_) => Role::Session,
            None => Role::Sandbox,
        }
    }

    fn task_mut(&mut self) -> Result<&mut TaskRun, SessionCallError> {
        self.task.as_mut().ok_or(SessionCallError::NoTask)
    }

    /// Runs one action, with at most `timeout_secs` for it (never more than
    /// `rollouts.step_timeout_secs`). A session's actions share its `rollouts.timeout_secs`,
    /// as a rollout's do: past it, the session ends as a `timeout`.
    pub async fn act(
        &mut self,
        engine: &Engine,
        action: &Action,
        timeout_secs: Option<u64>,
    ) -> Result<Acted, SessionCallError> {
        self.live()?;
        let run = self.task.as_ref().ok_or(SessionCallError::NoTask)?;
        let max_steps = run.planned.limits.max_steps;
        if run.steps.len() >= max_steps {
            return Err(SessionCallError::StepsTaken(max_steps));
        }
        let mut limits = run.planned.limits.clone();
        if let Some(t) = timeout_secs {
            limits.step_timeout_secs = t.min(limits.step_timeout_secs);
        }
        let index = run.steps.len() as u32;
        let budget = Duration::from_secs(limits.timeout_secs).saturating_sub(run.spent);
        let started = Instant::now();
        let live = self.live()?;
        let result = tokio::time::timeout(budget, engine.act(live, action, index, &limits)).await;
        let run = self.task_mut()?;
        run.spent += started.elapsed();
        let (step, end) = match result {
            Ok(Ok((step, _))) => {
                run.steps.push(step.clone());
                return Ok(Acted::Stepped(step));
            }
            // The action took the VM down: the session ends as the agent's failure.
            Ok(Err((step, reason))) => (Some(step), End::AgentBrokeVm(reason)),
            Err(_) => (None, End::Timeout(limits.timeout_secs)),
        };
        run.steps.extend(step.clone());
        let row = Box::new(self.end(engine, end)?);
        Ok(Acted::Ended { step, row })
    }

    /// Ends the session without a score (its VM goes): the row of how it ended, with its steps
    /// so far.
    pub fn end(&mut self, engine: &Engine, end: End) -> Result<Row, SessionCallError> {
        let run = self.task.as_ref().ok_or(SessionCallError::NoTask)?;
        let mut row = engine.ended(&run.planned, end);
        row.policy_name = "session".into();
        row.steps = run.steps.clone();
        self.vm = Vm::Ended;
        Ok(row)
    }

    /// Ends the session, giving its VM to `engine` to be reset in place for the next session
    /// or rollout of the same snapshot (`[rollouts] reuse`) when it is a live fork of the
    /// task's snapshot (not of a branch or a pause); otherwise the VM goes.
    pub fn end_reusing(mut self, engine: &Engine) {
        if self.task.is_some() {
            if let Some(fork) = self.take_own_fork() {
                engine.recycle(fork, &self.snapshot);
            }
        }
    }

    /// Ends a sandbox (or a session its front-end gives up without a row): its VM goes now.
    pub fn close(&mut self) {
        self.vm = Vm::Ended;
    }

    /// Ends a sandbox like [`Session::close`], but gives back its VM when it is a live fork
    /// of the environment's snapshot (not of a branch or a pause), for a pool to reset in
    /// place for a later sandbox ([`snapshotter::WarmPool::give_back`]).
    pub fn close_reusing(&mut self) -> Option<snapshotter::Fork> {
        if self.task.is_some() {
            self.close();
            return None;
        }
        self.take_own_fork()
    }

    /// Ends the session and takes its VM when it is a live fork of the session's own
    /// snapshot (not of a branch or a pause); otherwise the VM goes.
    fn take_own_fork(&mut self) -> Option<snapshotter::Fork> {
        let Vm::Live(live) = std::mem::replace(&mut self.vm, Vm::Ended) else {
            return None;
        };
        let of_its_snapshot = live.origin().is_none() && self._branch.is_none();
        let (fork, _gauge) = live.into_parts();
        (of_its_snapshot && fork.snapshot_id == self.snapshot.id()).then_some(fork)
    }

    /// Ends the session and scores it like any rollout (with the suite's scoring mode: by
    /// default in a fresh fork, where the session cannot reach): the row.
    pub async fn submit(&mut self, engine: &Engine, answer: Option<String>) -> Result<Row, SessionCallError> {
        self.live()?;
        let run = self.task.as_ref().ok_or(SessionCallError::NoTask)?.clone();
        let Vm::Live(live) = std::mem::replace(&mut self.vm, Vm::Ended) else {
            unreachable!("checked above")
        };
        let started = Instant::now();
        let mut row = engine.ended(&run.planned, End::Scored);
        row.policy_name = "session".into();
        row.status = Status::EnvError;
        row.steps = run.steps.clone();
        row.timings.rollout_ms = run.spent.as_secs_f64() * 1e3;
        let end = engine
            .finish(*live, &run.planned.task, &self.snapshot, answer, &mut row)
            .await;
        end.settle(&mut row);
        row.timings.total_ms = started.elapsed().as_secs_f64() * 1e3;
        Ok(row)
    }

    /// A new live fork that continues from this one's state exactly, with its own seed (and,
    /// for a session, its own ids, `served`). A live one is snapshotted into `store` and goes
    /// on; a paused one is forked from its saved state and stays paused.
    pub async fn branch(
        &self,
        store: &SnapshotStore,
        seed: u64,
        served: Option<Served>,
    ) -> Result<Session, SessionBranchError> {
        let role = self.role();
        let (child, branch) = match &self.vm {
            Vm::Live(live) => {
                self.changes.note(Change::Branch);
                let (child, branch) =
                    crate::live::branch(&self.forker, live, &self.snapshot, store, seed, role).await?;
                (child, Some(branch))
            }
            Vm::Paused(paused) => {
                let identity = ForkIdentity {
                    env: paused.record.env.clone(),
                    ..ForkIdentity::new(seed)
                };
                let child = self
                    .unpause(paused, Some(identity))
                    .await
                    .map_err(SessionBranchError::Paused)?;
                (child, None)
            }
            Vm::Ended => return Err(SessionCallError::Ended.into()),
        };
        let task = self.task.clone().map(|mut run| {
            run.planned.seed = seed;
            run.planned.served = served;
            run
        });
        Ok(Session {
            host: self.host.clone(),
            forker: self.forker.clone(),
            network: self.network.clone(),
            snapshot: self.snapshot.clone(),
            vm: Vm::Live(Box::new(child)),
            task,
            _branch: branch,
            changes: Default::default(),
        })
    }

    async fn unpause(&self, paused: &Arc<PausedFork>, identity: Option<ForkIdentity>) -> Result<LiveFork, PauseError> {
        let role = self.role();
        crate::pause::unpause(&self.forker, &self.host.store, paused, identity, role, &self.network).await
    }

    /// Saves the live fork into `dir` (which must not exist) and stops its VM; the caller
    /// records the pause and then commits or cancels it. On an error the VM runs on and the
    /// folder is gone.
    pub async fn pause(&mut self, dir: &Path) -> Result<PendingPause<'_>, SessionPauseError> {
        let live = self.live()?;
        self.changes.note(Change::Pause);
        let paused = match crate::pause::pause(&self.forker, &self.host.store, live, &self.snapshot, dir).await {
            Ok(p) => p,
            Err(e) => {
                let _ = live.fork.machine.resume().await;
                let _ = std::fs::remove_dir_all(dir);
                return Err(e.into());
            }
        };
        Ok(PendingPause {
            session: self,
            paused: Arc::new(paused),
        })
    }

    /// Saves the live fork into `dir` (which must not exist) and lets its VM run on: a
    /// checkpoint to fork again from later (after a restart of the service). The folder goes
    /// when the last holder of the answer drops it, unless it is kept on disk.
    pub async fn checkpoint(&self, dir: &Path) -> Result<Arc<PausedFork>, SessionPauseError> {
        let live = self.live()?;
        self.changes.note(Change::Checkpoint);
        let saved = crate::pause::pause(&self.forker, &self.host.store, live, &self.snapshot, dir).await;
        let resumed = live.fork.machine.resume().await;
        match saved {
            Ok(paused) => {
                let paused = Arc::new(paused);
                resumed.map_err(|e| {
                    SessionPauseError::Pause(PauseError::Folder {
                        dir: dir.to_path_buf(),
                        what: format!("the VM did not run on after its checkpoint: {e}"),
                    })
                })?;
                Ok(paused)
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(dir);
                Err(e.into())
            }
        }
    }

    /// Forks a paused fork again, as it was; the caller records the resume and then
    /// commits it (dropped uncommitted, the new VM goes and it stays paused). None: it was
    /// not paused (nothing done).
    pub async fn resume(&mut self) -> Result<Option<PendingResume<'_>>, PauseError> {
        let Vm::Paused(paused) = &self.vm else {
            return Ok(None);
        };
        let live = self.unpause(paused, None).await?;
        Ok(Some(PendingResume { session: self, live }))
    }
}

/// Why a session could not be paused.
#[derive(Debug, thiserror::Error)]
pub enum SessionPauseError {
    #[error(transparent)]
    Refused(#[from] SessionCallError),
    #[error(transparent)]
    Pause(#[from] PauseError),
}

/// A session's progress, saved with a paused session: enough, with its task and ids, to take
/// it up again.
pub struct SessionProgress {
    pub seed: u64,
    pub limits: RolloutsSection,
    pub steps: Vec<Step>,
    pub spent: Duration,
}
