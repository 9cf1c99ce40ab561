//! The rollout engine: one implementation of a rollout that both front-ends drive, `farm
//! run` (a suite, start to end) and `farm serve` (rollouts and live sessions on request).
//!
//! The stages, each in the crate named for it:
//! - plan: [`Engine::plan`] (which task, which sample, which seed);
//! - prepare: [`Engine::start`] builds or reuses the template snapshot (`snapshotter`),
//!   [`Engine::prepare`] the per-task snapshots (`snapshotter::child`);
//! - run one: [`Engine::run_one`] forks, lets the policy act, collects the artifacts;
//!   [`Engine::open`], [`Engine::act`] and [`Engine::finish`] are the same pieces for a
//!   session that a caller steps itself;
//! - score: `scorers::orchestrate::score`, in a fresh fork where the agent cannot reach;
//! - emit: [`output::OutputWriter::append`] journals the row, then Parquet parts.
//!
//! How a rollout ended is an [`End`]; [`End::settle`] alone turns it into the row's status,
//! reward and error.

pub mod openai;
pub mod output;
pub mod policy;

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use datasets::{Task, WORKSPACE};
use farm_protocol::FileEntry;
use sha2::{Digest, Sha256};
use snapshotter::{build_template_with, Fork, ForkIdentity, Forker, Snapshot, SnapshotStore};
use tokio::sync::Semaphore;
use vmm::{AccelSetting, AgentError, ExecOptions, VmSettings};

use crate::metrics::{self, Role, VmGauge};
use crate::run::suite::{self, RolloutsSection, ScoringMode, Suite, SuiteConfig};
use output::{Row, Status, Step, Usage};
use policy::{Action, ReplayPolicy};

/// What every rollout of one suite shares: its template, forker, warm pool and settings.
pub struct Engine {
    pub suite_name: String,
    pub suite_digest: String,
    pub suite_seed: u64,
    pub run_id: String,
    pub config: SuiteConfig,
    pub forker: Forker,
    pub store: SnapshotStore,
    pub template: Arc<Snapshot>,
    scoring: scorers::orchestrate::Plan,
    /// Warm forks of the template snapshot (rollout and scoring VMs of tasks that use it).
    pool: Option<(String, snapshotter::WarmPool)>,
    /// A converted image's `Env`, for every command of the rollouts' forks.
    image_env: Vec<(String, String)>,
}

/// A task's snapshot for each task id, or why it could not be made.
pub type TaskSnapshots = HashMap<String, Result<Arc<Snapshot>, String>>;

/// One planned rollout.
#[derive(Clone)]
pub struct Planned {
    pub task: Arc<Task>,
    pub sample: u32,
    pub seed: u64,
    /// The snapshot the rollout forks, or why it could not be made.
    pub snapshot: Result<Arc<Snapshot>, String>,
    pub policy: Arc<Policy>,
    /// The suite's `[rollouts]` limits, or a request's lower ones.
    pub limits: RolloutsSection,
    /// `farm serve`'s ids (None for `farm run`).
    pub served: Option<Served>,
}

/// What `farm serve` adds to a row.
#[derive(Debug, Clone, PartialEq)]
pub struct Served {
    /// The suite's name (the service serves several).
    pub suite: String,
    pub rollout_id: String,
    pub group_id: String,
    pub policy_version: Option<u64>,
    /// JSON text.
    pub metadata: Option<String>,
}

impl Engine {
    /// Prepares the suite's template snapshot (built, or reused from the store).
    pub async fn start(suite: &Suite, config: &SuiteConfig, accel: AccelSetting, run_id: &str, progress: &(dyn Fn(&str) + Sync)) -> Result<Engine> {
        let mut vm = VmSettings::detect(accel)?;
        vm.boot_timeout = Duration::from_secs(300);
        let mut forker = Forker::new(vm)?;
        forker.max_disk_bytes = Some(config.rollouts.max_disk_mib << 20);
        let store = SnapshotStore::default_location();
        let template = build_template_with(&store, &forker, &config.template, &suite.dir, &config.suite.name, &scorers::zygote::template_extras(), progress)
            .await
            .context("building the suite's template")?;
        progress(&format!("snapshot {}{}", template.snapshot.id(), if template.reused { " (reused)" } else { "" }));
        let scoring = scorers::orchestrate::Plan {
            mode: config.scoring.mode,
            timeout: Duration::from_secs(config.scoring.timeout_secs),
            call_timeout: Duration::from_secs(config.scoring.call_timeout_secs),
            pass_threshold: config.scoring.pass_threshold,
            external: resolve_external(suite, &config.scoring.external),
        };
        let image_config = vmm::image::config_of(&template.snapshot.manifest.image).unwrap_or_default();
        let image_env = image_config.env.iter().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
        // `rollouts.user` unset: the image's User (a converted image's config), else root.
        let mut config = config.clone();
        if config.rollouts.user.is_empty() {
            config.rollouts.user = match image_config.user.as_str() {
                "" => "root".into(),
                user if suite::valid_user(user) => user.to_string(),
                user => {
                    progress(&format!("the image's User {user:?} is not a user name or UID[:GID]; rollouts run as root (set rollouts.user)"));
                    "root".into()
                }
            };
        }
        Ok(Engine {
            image_env,
            suite_name: config.suite.name.clone(),
            suite_digest: suite.digest.clone(),
            suite_seed: config.suite.seed,
            run_id: run_id.to_string(),
            config,
            forker,
            store,
            template: Arc::new(template.snapshot),
            scoring,
            pool: None,
        })
    }

    /// Keeps `size` warm forks of the template ready (nothing when `size` is 0).
    pub fn start_pool(&mut self, size: usize) -> Result<()> {
        if size == 0 {
            return Ok(());
        }
        let pool = snapshotter::WarmPool::start_with_warm_up(
            self.forker.clone(),
            (*self.template).clone(),
            size,
            snapshotter::PoolMode::Resumed,
            &self.config.rollouts.warm_up,
        )?;
        self.pool = Some((self.template.id().to_string(), pool));
        Ok(())
    }

    /// Warm forks ready now.
    pub fn warm(&self) -> usize {
        self.pool.as_ref().map(|(_, p)| p.ready()).unwrap_or(0)
    }

    /// The rollouts of `tasks`: `samples` each (or as many as the policy has for a task),
    /// with the suite's seeds.
    pub fn plan(&self, tasks: &[Arc<Task>], policy: &Arc<Policy>, samples: u32) -> Vec<Planned> {
        let mut planned = Vec::new();
        for task in tasks {
            for sample in 0..policy.samples_for(task, samples) {
                planned.push(Planned {
                    task: task.clone(),
                    sample,
                    seed: rollout_seed(self.suite_seed, &task.id, sample),
                    snapshot: Err("not prepared".into()),
                    policy: policy.clone(),
                    limits: self.config.rollouts.clone(),
                    served: None,
                });
            }
        }
        planned
    }

    /// A snapshot per task that has setup or large files, `concurrency` at a time; tasks with
    /// the same files and setup share one. Tasks without use the template.
    pub async fn prepare(&self, tasks: &[Arc<Task>], concurrency: usize, log: &(dyn Fn(&str) + Sync)) -> Result<TaskSnapshots> {
        let mut task_snapshots: TaskSnapshots = HashMap::new();
        let mut by_id: HashMap<String, Vec<String>> = HashMap::new();
        let mut building = tokio::task::JoinSet::new();
        let slots = Arc::new(Semaphore::new(concurrency.max(1)));
        for task in tasks {
            if task_snapshots.contains_key(&task.id) || by_id.values().flatten().any(|id| *id == task.id) {
                continue;
            }
            if !task.needs_snapshot() {
                task_snapshots.insert(task.id.clone(), Ok(self.template.clone()));
                continue;
            }
            let id = task_snapshot_id(&self.template, task);
            let users = by_id.entry(id).or_default();
            users.push(task.id.clone());
            if users.len() > 1 {
                continue;
            }
            let (store, forker, template, task, slots) = (self.store.clone(), self.forker.clone(), self.template.clone(), task.clone(), slots.clone());
            building.spawn(async move {
                let _slot = slots.acquire_owned().await.expect("semaphore open");
                let snapshot = task_snapshot(&store, &forker, &template, &task).await;
                (task_snapshot_id(&template, &task), snapshot.map(Arc::new).map_err(|e| format!("preparing the task snapshot failed: {e:#}")))
            });
        }
        if !building.is_empty() {
            log(&format!("preparing {} task snapshots", building.len()));
        }
        while let Some(built) = building.join_next().await {
            let (id, snapshot) = built.context("a task snapshot build panicked")?;
            for task_id in by_id.get(&id).into_iter().flatten() {
                if let Err(e) = &snapshot {
                    log(&format!("task {task_id}: {e}"));
                }
                task_snapshots.insert(task_id.clone(), snapshot.clone());
            }
        }
        Ok(task_snapshots)
    }

    /// A fork of `snapshot`: from the warm pool when it holds that snapshot.
    async fn fork(&self, snapshot: &Snapshot, identity: ForkIdentity) -> Result<Fork, snapshotter::ForkError> {
        match &self.pool {
            Some((id, pool)) if id == snapshot.id() => {
                let fork = pool.fork(identity).await?;
                metrics::get().warm_pool_hits.inc();
                Ok(fork)
            }
            _ => self.forker.fork(snapshot, identity).await,
        }
    }

    /// A fork in the task's pristine state: a fork of its snapshot, with the task's files
    /// written in when the task has no snapshot of its own (a few small files are cheaper to
    /// write into each fork than a RAM file per task is to build and keep).
    async fn fork_task(&self, snapshot: &Snapshot, task: &Task, identity: ForkIdentity) -> Result<Fork> {
        let fork = self.fork(snapshot, identity).await?;
        if task.files_in_forks() {
            for file in &task.files {
                fork.agent()
                    .write_file(&format!("{WORKSPACE}/{}", file.path), file.contents.clone(), file.mode)
                    .await
                    .with_context(|| format!("writing the task's file {} into the fork", file.path))?;
            }
        }
        Ok(fork)
    }

    /// Runs one rollout on a task of its own, with retries of the farm's failures; a panic
    /// in it becomes an `env_error` row for that rollout instead of ending the caller.
    pub async fn run_one(self: &Arc<Self>, item: Planned) -> Row {
        use tracing::Instrument;
        let span = tracing::info_span!(
            "rollout",
            run_id = %self.run_id,
            task_id = %item.task.id,
            sample = item.sample,
            rollout_id = item.served.as_ref().map(|s| s.rollout_id.as_str()).unwrap_or(""),
            fork_id = tracing::field::Empty,
        );
        metrics::get().in_flight.inc();
        let _in_flight = Defer(|| metrics::get().in_flight.dec());
        let mut inner = {
            let (engine, item) = (self.clone(), item.clone());
            AbortOnDrop(tokio::spawn(async move { engine.rollout_with_retries(&item).await }.instrument(span)))
        };
        match (&mut inner.0).await {
            Ok(row) => row,
            Err(e) => self.ended(&item, End::Internal(e.to_string())),
        }
    }

    /// The row of a rollout that ended before it ran (cancelled, lost, failed inside farm).
    pub fn ended(&self, item: &Planned, end: End) -> Row {
        let mut row = self.new_row(item, now_ms());
        end.settle(&mut row);
        row
    }

    async fn rollout_with_retries(&self, item: &Planned) -> Row {
        let mut attempt = 1;
        loop {
            let (mut row, end) = self.rollout(item).await;
            row.attempts = attempt;
            tracing::info!(
                attempt,
                status = %row.status,
                reward = row.reward,
                error = row.error.as_deref().unwrap_or(""),
                fork_ms = row.timings.fork_ms,
                rollout_ms = row.timings.rollout_ms,
                score_ms = row.timings.score_ms,
                total_ms = row.timings.total_ms,
                "rollout ended"
            );
            if attempt > self.config.rollouts.retries || !worth_retrying(&end, row.steps.len()) {
                return row;
            }
            attempt += 1;
        }
    }

    /// A row for a rollout, before anything happened: status env_error until decided.
    fn new_row(&self, item: &Planned, started_at_ms: i64) -> Row {
        let task = &item.task;
        Row {
            run_id: self.run_id.clone(),
            suite_name: self.suite_name.clone(),
            suite_digest: self.suite_digest.clone(),
            task_digest: task.digest(),
            snapshot_id: item.snapshot.as_ref().map(|s| s.id().to_string()).unwrap_or_default(),
            policy_name: item.policy.name().to_string(),
            policy_params: item.policy.params().to_string(),
            started_at_ms,
            rollout_id: item.served.as_ref().map(|s| s.rollout_id.clone()),
            group_id: item.served.as_ref().map(|s| s.group_id.clone()),
            policy_version: item.served.as_ref().and_then(|s| s.policy_version),
            metadata: item.served.as_ref().and_then(|s| s.metadata.clone()),
            ..Row::blank(&task.id, item.sample, item.seed)
        }
    }

    async fn rollout(&self, item: &Planned) -> (Row, End) {
        let started = Instant::now();
        let task = &item.task;
        let mut row = self.new_row(item, now_ms());
        let finish = |mut row: Row, end: End| {
            end.settle(&mut row);
            row.timings.total_ms = started.elapsed().as_secs_f64() * 1e3;
            (row, end)
        };
        let snapshot = match &item.snapshot {
            Ok(s) => s.clone(),
            Err(e) => return finish(row, End::NoSnapshot(e.clone())),
        };
        let mut driver = match item.policy.driver(task, item.sample, item.seed) {
            Ok(d) => d,
            Err(e) => return finish(row, End::NoActions(e.to_string())),
        };
        let limits = &item.limits;

        // Replayed data needs no VM: when every action writes a file in the workspace or
        // submits the answer, the artifacts are those files, known without running anything.
        // Only fresh-fork scoring can use them (final-state scoring grades the rollout's VM).
        if self.config.scoring.mode == ScoringMode::FreshFork {
            if let Driver::Replay(actions) = &driver {
                if let Some((steps, artifacts)) = data_only_rollout(actions, limits.max_steps, &scorers::ArtifactLimits::default()) {
                    row.steps = steps;
                    let score_started = Instant::now();
                    let verdict = self.score(task, &snapshot, None, &artifacts).await;
                    row.timings.score_ms = score_started.elapsed().as_secs_f64() * 1e3;
                    let end = record_verdict(&mut row, verdict, &artifacts);
                    return finish(row, end);
                }
            }
        }

        let live = match self.open(task, &snapshot, item.seed, limits, Role::Rollout).await {
            Ok(live) => live,
            Err(end) => return finish(row, end),
        };
        row.timings.fork_ms = started.elapsed().as_secs_f64() * 1e3;

        // The policy acts.
        let rollout_started = Instant::now();
        let (ending, answer) = self.drive(&live, &mut driver, limits, &mut row.steps).await;
        row.messages = driver.messages_json();
        row.usage = driver.usage();
        row.timings.rollout_ms = rollout_started.elapsed().as_secs_f64() * 1e3;
        match ending {
            Ending::Done => {}
            Ending::Timeout => return finish(row, End::Timeout(limits.timeout_secs)),
            Ending::PolicyRefused(reason) => return finish(row, End::PolicyRefused(reason)),
            // The endpoint failed, not the model's answer: an environment error (retried).
            Ending::PolicyFailed(reason) => return finish(row, End::PolicyEndpoint(reason)),
            // The agent's own action took its VM down: an agent failure, not the farm's.
            Ending::AgentBrokeVm(reason) => return finish(row, End::AgentBrokeVm(reason)),
        }
        let end = self.finish(live, task, &snapshot, answer, &mut row).await;
        finish(row, end)
    }

    /// The policy's actions in `live`, until it is done, submits, or a limit or failure
    /// ends the rollout. Steps go into `steps` as they finish.
    async fn drive(&self, live: &LiveFork, driver: &mut Driver<'_>, limits: &RolloutsSection, steps: &mut Vec<Step>) -> (Ending, Option<String>) {
        // The time limit counts the agent's actions in the VM, not the time the policy takes
        // to answer (an endpoint's queueing and retries are not the agent's doing; the
        // policy has its own request timeout and retries).
        let mut observed = None;
        let budget = Duration::from_secs(limits.timeout_secs);
        let mut spent = Duration::ZERO;
        for index in 0..limits.max_steps {
            let action = match driver.next(observed.take()).await {
                Ok(Some(action)) => action,
                Ok(None) => break,
                Err(e) => return (policy_ending(&e), None),
            };
            let started = Instant::now();
            let Some(remaining) = budget.checked_sub(spent) else { return (Ending::Timeout, None) };
            let result = match tokio::time::timeout(remaining, self.act(live, &action, index as u32, limits)).await {
                Ok(result) => result,
                Err(_) => return (Ending::Timeout, None),
            };
            spent += started.elapsed();
            match result {
                Ok((step, submitted)) => {
                    observed = Some(observation(&step));
                    steps.push(step);
                    if submitted.is_some() {
                        return (Ending::Done, submitted);
                    }
                }
                Err((step, reason)) => {
                    steps.push(step);
                    return (Ending::AgentBrokeVm(reason), None);
                }
            }
        }
        (Ending::Done, None)
    }

    /// A fork of the task's pristine state, handed to the rollout's user, with the
    /// workspace listed (the baseline its artifacts are told apart from).
    pub async fn open(&self, task: &Task, snapshot: &Snapshot, seed: u64, limits: &RolloutsSection, role: Role) -> Result<LiveFork, End> {
        let mut env = self.image_env.clone();
        env.extend(limits.network.proxy_env());
        env.push(("FARM_TASK_ID".into(), task.id.clone()));
        let identity = ForkIdentity { env, ..ForkIdentity::new(seed) };
        tracing::Span::current().record("fork_id", identity.fork_id.as_str());
        tracing::debug!("forking the task's snapshot");
        let fork = self.fork_task(snapshot, task, identity).await.map_err(|e| End::Fork(format!("{e:#}")))?;
        if !limits.network.is_empty() {
            // Only the rollout's own VM: scoring forks keep the default (nothing allowed).
            fork.machine.set_network(vmm::net::Policy { allow: limits.network.allow.clone(), log: None });
        }
        let gauge = VmGauge::new(role);
        if !limits.runs_as_root() {
            if let Err(e) = fork.agent().handover(WORKSPACE, &limits.user).await {
                return Err(End::Setup(format!("handing the workspace to rollouts.user {:?}: {e}", limits.user)));
            }
        }
        // The task's own workspace, before the agent acts: a listing that fails here is the
        // farm's or the task's.
        let baseline = scorers::artifacts::list_workspace(fork.agent()).await.map_err(|e| End::Setup(e.to_string()))?;
        Ok(LiveFork { fork, baseline: Arc::new(baseline), origin: None, _gauge: gauge })
    }

    /// Runs one action. Ok: the step and a submitted answer. Err: the VM died or stopped
    /// answering during the action.
    pub async fn act(&self, live: &LiveFork, action: &Action, index: u32, limits: &RolloutsSection) -> Result<(Step, Option<String>), (Step, String)> {
        run_action(&live.fork, action, index, limits).await
    }

    /// A new session that continues from `live`'s state exactly: `live` is snapshotted (a
    /// child of the snapshot it came from, kept in `store`) and the child forked. `live`
    /// goes on afterwards.
    pub async fn branch(&self, live: &LiveFork, from: &Arc<Snapshot>, store: &SnapshotStore, seed: u64, role: Role) -> Result<(LiveFork, Arc<Branch>)> {
        let parent: Arc<Snapshot> = match &live.origin {
            Some(b) => Arc::new(b.snapshot.clone()),
            None => from.clone(),
        };
        let child = snapshotter::snapshot_fork(store, &self.forker, &parent, &live.fork, "branch", None, true).await.context("snapshotting the session")?;
        let branch = Arc::new(Branch { snapshot: child, store: store.clone(), parent: live.origin.clone() });
        let forker = Forker { max_disk_bytes: self.forker.max_disk_bytes, ..self.forker.clone() };
        let identity = ForkIdentity { env: live.fork.identity.env.clone(), ..ForkIdentity::new(seed) };
        let fork = forker.fork(&branch.snapshot, identity).await.context("forking the branch")?;
        // The branch may reach what its parent may (a session's `rollouts.network`).
        fork.machine.set_network(live.fork.machine.network());
        Ok((LiveFork { fork, baseline: live.baseline.clone(), origin: Some(branch.clone()), _gauge: VmGauge::new(role) }, branch))
    }

    /// After the agent's actions: the artifacts out, as untrusted data, and the verdict
    /// into `row`. The rollout VM goes before a fresh scoring fork starts.
    pub async fn finish(&self, live: LiveFork, task: &Task, snapshot: &Snapshot, answer: Option<String>, row: &mut Row) -> End {
        let score_started = Instant::now();
        let limits = scorers::ArtifactLimits::default();
        let fork = &live.fork;
        let mut collected = scorers::collect_artifacts(fork.agent(), &live.baseline, &limits).await;
        for _ in 0..3 {
            // The agent's processes may still have been killing the guest agent: wait for
            // the restarted one and ask again.
            if !matches!(collected, Err(scorers::ListingError::Agent(AgentError::AgentRestarted { .. }))) {
                break;
            }
            let _ = fork.agent().wait_ready(Duration::from_secs(30)).await;
            collected = scorers::collect_artifacts(fork.agent(), &live.baseline, &limits).await;
        }
        let mut artifacts = match collected {
            Ok(a) => a,
            Err(scorers::ListingError::Agent(e)) => return End::NoArtifacts(fork.explain(&e)),
            // The agent left more files than a listing holds: what it deleted cannot be told,
            // and that is its doing.
            Err(e @ scorers::ListingError::TooManyFiles { .. }) => return End::NoArtifacts(e.to_string()),
        };
        artifacts.answer = answer;
        let LiveFork { fork, _gauge, .. } = live;
        let verdict = self.score(task, snapshot, Some((fork, _gauge)), &artifacts).await;
        row.timings.score_ms = score_started.elapsed().as_secs_f64() * 1e3;
        record_verdict(row, verdict, &artifacts)
    }

    /// Scores a rollout where the agent cannot reach (`scorers::orchestrate`). Errors are
    /// environment errors.
    async fn score(&self, task: &Task, snapshot: &Snapshot, rollout_fork: Option<(Fork, VmGauge)>, artifacts: &scorers::Artifacts) -> Result<scorers::Verdict, scorers::orchestrate::ScoreError> {
        let scoring_vm_gauge = std::sync::Mutex::new(None);
        let scoring_vm = &scoring_vm_gauge;
        // The scoring VM's own seed: the checkers' `FARM_SEED`, which the rollout never saw.
        let fresh = |seed: u64| async move {
            let identity = ForkIdentity::new(seed);
            tracing::debug!(scoring_fork_id = %identity.fork_id, "forking the scoring VM");
            let mut fork = self.fork_task(snapshot, task, identity).await.map_err(|e| format!("{e:#}"))?;
            // Room for the whole artifact budget on top of the task's own limit: placing an
            // agent's files (which may have lived in a tmpfs of its rollout) never kills the
            // scoring VM.
            if let Some(limit) = self.forker.max_disk_bytes {
                fork.machine.limit_disk_growth(limit + scorers::ArtifactLimits::default().scoring_room());
            }
            *scoring_vm.lock().expect("not poisoned") = Some(VmGauge::new(Role::Scoring));
            Ok(fork)
        };
        let (fork, mut gauge) = rollout_fork.unzip();
        if self.scoring.mode == ScoringMode::FreshFork {
            // The rollout's VM goes before the scoring fork starts (orchestrate drops it).
            gauge = None;
        }
        let verdict = scorers::orchestrate::score(&self.scoring, task, fork, artifacts, fresh).await;
        drop(gauge);
        drop(scoring_vm_gauge);
        verdict
    }
}

/// A running fork a rollout or a session acts in.
pub struct LiveFork {
    pub fork: Fork,
    /// The workspace as the task left it.
    baseline: Arc<Vec<FileEntry>>,
    /// The branch snapshot this fork came from (None: the task's snapshot).
    origin: Option<Arc<Branch>>,
    _gauge: VmGauge,
}

/// A session's snapshot taken for a branch; removed from its store once no fork or later
/// branch needs it (a child's disk is backed by its parent's, so children keep parents).
pub struct Branch {
    pub snapshot: Snapshot,
    store: SnapshotStore,
    parent: Option<Arc<Branch>>,
}

impl Drop for Branch {
    fn drop(&mut self) {
        let _ = self.store.remove(self.snapshot.id());
        let _ = &self.parent;
    }
}

/// Runs a closure when dropped.
struct Defer<F: FnMut()>(F);

impl<F: FnMut()> Drop for Defer<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// Where actions come from.
pub enum Policy {
    Replay(ReplayPolicy),
    OpenAi(openai::OpenAiPolicy),
    /// The same actions for every sample (a `farm serve` request's replay).
    Actions(Vec<Action>),
}

impl Policy {
    pub fn load(suite: &Suite, config: &SuiteConfig) -> Result<Policy> {
        Ok(match config.policy.kind {
            suite::PolicyKind::Replay => Policy::Replay(ReplayPolicy::load(suite, &config.policy)?),
            suite::PolicyKind::Openai => {
                Policy::OpenAi(openai::OpenAiPolicy::new(config.policy.openai().map_err(|e| anyhow::anyhow!("{}: {e}", suite.path.display()))?)?)
            }
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Policy::Replay(p) => p.name(),
            Policy::OpenAi(_) => "openai",
            Policy::Actions(_) => "replay",
        }
    }

    pub fn params(&self) -> serde_json::Value {
        match self {
            Policy::Replay(p) => p.params(),
            Policy::OpenAi(p) => p.params(),
            Policy::Actions(_) => serde_json::json!({ "source": "request" }),
        }
    }

    pub fn samples_for(&self, task: &Task, samples: u32) -> u32 {
        match self {
            Policy::Replay(p) => p.samples_for(task),
            Policy::OpenAi(_) | Policy::Actions(_) => samples,
        }
    }

    /// Whether rollouts mostly wait for an endpoint (a live policy).
    pub fn is_live(&self) -> bool {
        matches!(self, Policy::OpenAi(_))
    }

    fn driver(&self, task: &Task, sample: u32, seed: u64) -> Result<Driver<'_>, String> {
        match self {
            Policy::Replay(p) => p.actions(task, sample).map(|a| Driver::Replay(a.into())),
            Policy::OpenAi(p) => Ok(Driver::Chat(p.session(task, seed))),
            Policy::Actions(actions) => Ok(Driver::Replay(actions.clone().into())),
        }
    }
}

/// One rollout's source of actions.
enum Driver<'a> {
    Replay(VecDeque<Action>),
    Chat(openai::ChatSession<'a>),
}

impl Driver<'_> {
    /// The next action, given what the last one produced; None when the policy is done.
    async fn next(&mut self, observation: Option<String>) -> Result<Option<Action>> {
        match self {
            Driver::Replay(actions) => Ok(actions.pop_front()),
            Driver::Chat(session) => session.next(observation).await,
        }
    }

    fn messages_json(&self) -> String {
        match self {
            Driver::Replay(_) => "[]".into(),
            Driver::Chat(session) => session.messages_json(),
        }
    }

    fn usage(&self) -> Usage {
        match self {
            Driver::Replay(_) => Usage::default(),
            Driver::Chat(session) => session.usage(),
        }
    }
}

/// What an action produced, as the policy sees it.
pub fn observation(step: &Step) -> String {
    match step.kind.as_str() {
        "exec" => format!(
            "exit code: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            step.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "none".into()),
            step.stdout,
            step.stderr
        ),
        "write_file" if step.stderr.is_empty() => format!("wrote {}", step.text),
        _ => step.stderr.clone(),
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn resolve_external(suite: &Suite, argv: &[String]) -> Vec<String> {
    let mut argv = argv.to_vec();
    if let Some(first) = argv.first_mut() {
        if first.contains('/') && !first.starts_with('/') {
            *first = suite.resolve(Path::new(first.as_str())).to_string_lossy().into_owned();
        }
    }
    argv
}

/// A rollout's seed: fixed by the base seed (the suite's, or a request's), the task and
/// the sample.
pub fn rollout_seed(base_seed: u64, task: &str, sample: u32) -> u64 {
    let d = Sha256::digest(format!("{base_seed}\0{task}\0{sample}").as_bytes());
    u64::from_le_bytes(d[..8].try_into().expect("8 bytes"))
}

/// What addresses a task's snapshot besides its template: its files and setup.
fn task_snapshot_content(task: &Task) -> Vec<u8> {
    serde_json::to_vec(&(&task.files, &task.setup)).expect("task files serialize")
}

/// The content address of a task's snapshot.
fn task_snapshot_id(template: &Snapshot, task: &Task) -> String {
    snapshotter::child::child_id(template, &task_snapshot_content(task))
}

/// The task's own snapshot: a child of the template with its files and setup (see
/// [`snapshotter::child`]).
async fn task_snapshot(store: &SnapshotStore, forker: &Forker, template: &Snapshot, task: &Task) -> Result<Snapshot> {
    let content = task_snapshot_content(task);
    let files: Vec<(String, Vec<u8>, u32)> = task.files.iter().map(|f| (f.path.clone(), f.contents.clone(), f.mode)).collect();
    let spec = snapshotter::ChildSpec {
        label: &task.id,
        content: &content,
        files: &files,
        setup: &task.setup,
        workdir: WORKSPACE,
        setup_timeout: Duration::from_secs(900),
    };
    Ok(snapshotter::child_snapshot(store, forker, template, &spec).await?)
}

/// Aborts a spawned task when dropped (an interrupted run must not leave rollouts running).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Whether a rollout's environment error is worth another attempt. Not when the policy has
/// no actions for it (it will not have them on a retry either), and not once any action of
/// the agent ran: a retry would then give a live policy a fresh sample, and an agent that
/// could turn its own failures into environment errors would get extra tries that no row
/// records. Such a row stays an `env_error`, visible in the counts.
fn worth_retrying(end: &End, steps: usize) -> bool {
    end.retryable() && steps == 0
}

/// How a rollout ended, and whose doing it was. [`End::settle`] is the one place that turns
/// an ending into the row's status, reward and error.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// The tests (or the answer check) gave a verdict, already in the row.
    Scored,
    // The farm's failures: `env_error`, no reward.
    /// The task's snapshot could not be prepared (a retry would not make it).
    NoSnapshot(String),
    /// The policy has no actions for this rollout (nor will it on a retry).
    NoActions(String),
    /// The VM could not be forked.
    Fork(String),
    /// The forked VM could not be set up for the rollout.
    Setup(String),
    /// The policy's endpoint failed (not the model's answer).
    PolicyEndpoint(String),
    /// Scoring failed for reasons of the farm's.
    Scoring(String),
    /// farm itself failed (a panic in the rollout's task).
    Internal(String),
    /// Cancelled before it finished (by a caller, or a shutdown); the reason says which.
    Cancelled(String),
    /// Queued or running when the service died; found on restart.
    LostInRestart,
    // The agent's doing: `timeout` or `failed`, reward 0.
    /// The agent's actions ran past `rollouts.timeout_secs`.
    Timeout(u64),
    /// The endpoint refused the conversation itself (e.g. past the model's context).
    PolicyRefused(String),
    /// An action of the agent's took its VM down.
    AgentBrokeVm(String),
    /// The rollout VM did not hand over its artifacts after the agent's actions.
    NoArtifacts(String),
}

impl End {
    /// The status this ending gives (None: the verdict decided).
    fn status(&self) -> Option<Status> {
        match self {
            End::Scored => None,
            End::NoSnapshot(_)
            | End::NoActions(_)
            | End::Fork(_)
            | End::Setup(_)
            | End::PolicyEndpoint(_)
            | End::Scoring(_)
            | End::Internal(_)
            | End::Cancelled(_)
            | End::LostInRestart => Some(Status::EnvError),
            End::Timeout(_) => Some(Status::Timeout),
            End::PolicyRefused(_) | End::AgentBrokeVm(_) | End::NoArtifacts(_) => Some(Status::Failed),
        }
    }

    /// The error text of the row.
    fn error(&self) -> Option<String> {
        Some(match self {
            End::Scored => return None,
            End::NoSnapshot(e) | End::Setup(e) | End::AgentBrokeVm(e) => e.clone(),
            End::NoActions(e) | End::PolicyRefused(e) => format!("policy: {e}"),
            End::Fork(e) => format!("fork: {e}"),
            End::PolicyEndpoint(e) => format!("policy endpoint: {e}"),
            End::Scoring(e) => format!("scoring: {e}"),
            End::Internal(e) => format!("the rollout failed inside farm: {e}"),
            End::Cancelled(why) => format!("cancelled: {why}"),
            End::LostInRestart => "lost in restart".into(),
            End::Timeout(secs) => format!("the rollout ran past its {secs} s limit"),
            End::NoArtifacts(e) => format!("the rollout VM did not hand over its artifacts after the agent's actions: {e}"),
        })
    }

    /// Whether another attempt could end differently: a failure of the farm's that a fresh
    /// fork may not meet again (not a missing snapshot or missing replay data, never the
    /// agent's doing).
    fn retryable(&self) -> bool {
        matches!(self, End::Fork(_) | End::Setup(_) | End::PolicyEndpoint(_) | End::Scoring(_))
    }

    /// Puts the ending into the row: status, reward (none for the farm's failures, 0 for the
    /// agent's) and error.
    pub fn settle(&self, row: &mut Row) {
        if let Some(status) = self.status() {
            row.status = status;
            row.reward = (status != Status::EnvError).then_some(0.0);
        }
        if let Some(error) = self.error() {
            row.error = Some(error);
        }
    }
}

/// What ended a rollout before scoring.
enum Ending {
    /// Actions done (or the answer submitted).
    Done,
    /// The wall-clock limit passed.
    Timeout,
    /// The VM died or stopped answering during an action of the agent.
    AgentBrokeVm(String),
    /// The policy could not produce an action (its endpoint failed).
    PolicyFailed(String),
    /// The endpoint refused the conversation itself (e.g. past the model's context length):
    /// the model's failure.
    PolicyRefused(String),
}

fn policy_ending(error: &anyhow::Error) -> Ending {
    match error.downcast_ref::<openai::Refused>() {
        Some(refused) => Ending::PolicyRefused(refused.to_string()),
        None => Ending::PolicyFailed(format!("{error:#}")),
    }
}

/// Puts a verdict into the row; or says why scoring failed.
fn record_verdict(row: &mut Row, verdict: Result<scorers::Verdict, scorers::orchestrate::ScoreError>, artifacts: &scorers::Artifacts) -> End {
    match verdict {
        Ok(v) => {
            row.error = v.error();
            row.reward = Some(v.reward);
            row.status = if v.timed_out {
                Status::Timeout
            } else if v.passed {
                Status::Passed
            } else {
                Status::Failed
            };
            row.trust = Some(v.trust.level);
            row.trust_reason = Some(v.trust.reason.to_string());
            #[derive(serde::Serialize)]
            struct Recorded<'a> {
                #[serde(flatten)]
                details: &'a scorers::Details,
                artifacts: &'a scorers::Artifacts,
            }
            row.score_details = serde_json::to_string(&Recorded { details: &v.details, artifacts }).unwrap_or_else(|_| "{}".into());
            End::Scored
        }
        Err(e) => End::Scoring(e.to_string()),
    }
}

/// The steps and artifacts of a replayed rollout that only writes workspace files and
/// submits an answer, or None when any action needs a VM (a command, a file outside the
/// workspace, a path that is not plain). The artifacts are what a VM would have handed over:
/// the written files (the last write of a path wins, modes without setuid bits, the same
/// limits), and the answer; actions after a submission or past `max_steps` are dropped.
fn data_only_rollout(actions: &VecDeque<Action>, max_steps: usize, limits: &scorers::ArtifactLimits) -> Option<(Vec<Step>, scorers::Artifacts)> {
    let mut steps = Vec::new();
    let mut files: std::collections::BTreeMap<String, (Vec<u8>, u32)> = std::collections::BTreeMap::new();
    let mut answer = None;
    for (index, action) in actions.iter().take(max_steps).enumerate() {
        let mut step = Step {
            index: index as u32,
            kind: String::new(),
            text: String::new(),
            stdout: String::new(),
            stderr: String::new(),
            exit_code: None,
            started_at_ms: now_ms(),
            duration_ms: 0.0,
        };
        match action {
            Action::Exec { .. } => return None,
            Action::WriteFile { path, content, mode } => {
                let relative = path.strip_prefix(&format!("{WORKSPACE}/")).unwrap_or(path);
                if !scorers::artifacts::safe_relative(relative) {
                    return None;
                }
                step.kind = "write_file".into();
                step.text = path.clone();
                files.insert(relative.to_string(), (content.clone().into_bytes(), mode & 0o777));
                steps.push(step);
            }
            Action::Submit { answer: text } => {
                step.kind = "submit".into();
                step.text = text.clone();
                steps.push(step);
                answer = Some(text.clone());
                break;
            }
        }
    }
    let entries: Vec<farm_protocol::FileEntry> =
        files.iter().map(|(path, (bytes, mode))| farm_protocol::FileEntry { path: path.clone(), size: bytes.len() as u64, mtime_ns: 0, mode: *mode }).collect();
    let (wanted, skipped) = scorers::artifacts::select(&[], &entries, limits);
    let mut artifacts = scorers::Artifacts { skipped, answer, ..Default::default() };
    let mut total = 0u64;
    for path in wanted {
        let (bytes, mode) = files.remove(&path).expect("selected from these files");
        if total + bytes.len() as u64 > limits.max_total_bytes {
            artifacts.skipped.push(format!("{path}: {} bytes, over the artifact limits", bytes.len()));
            continue;
        }
        total += bytes.len() as u64;
        artifacts.changed.push(path.clone());
        artifacts.files.push((path, bytes, mode));
    }
    Some((steps, artifacts))
}

/// Runs one action. Ok: the step and a submitted answer. Err: the VM died or stopped
/// answering during the action.
async fn run_action(fork: &Fork, action: &Action, index: u32, limits: &RolloutsSection) -> Result<(Step, Option<String>), (Step, String)> {
    let started_at_ms = now_ms();
    let t = Instant::now();
    let mut step = Step {
        index,
        kind: String::new(),
        text: String::new(),
        stdout: String::new(),
        stderr: String::new(),
        exit_code: None,
        started_at_ms,
        duration_ms: 0.0,
    };
    let result = match action {
        Action::Exec { command } => {
            step.kind = "exec".into();
            step.text = command.clone();
            let options = ExecOptions {
                cwd: Some(WORKSPACE.into()),
                timeout: Some(Duration::from_secs(limits.step_timeout_secs)),
                stdout_cap: limits.output_cap_bytes,
                stderr_cap: limits.output_cap_bytes,
                user: (!limits.runs_as_root()).then(|| limits.user.clone()),
                ..ExecOptions::shell(command.clone())
            };
            match fork.agent().exec(options).await {
                Ok(out) => {
                    step.stdout = String::from_utf8_lossy(&out.stdout).into_owned();
                    step.stderr = String::from_utf8_lossy(&out.stderr).into_owned();
                    step.exit_code = Some(out.shell_exit_code());
                    if out.result.timed_out {
                        step.stderr.push_str(&format!("\n[farm: killed after the {} s step limit]", limits.step_timeout_secs));
                    }
                    Ok(None)
                }
                Err(e) => Err(e),
            }
        }
        Action::WriteFile { path, content, mode } => {
            step.kind = "write_file".into();
            step.text = path.clone();
            let full = if path.starts_with('/') { path.clone() } else { format!("{WORKSPACE}/{path}") };
            let placement = vmm::FilePlacement { beneath: None, owner: (!limits.runs_as_root()).then(|| limits.user.clone()) };
            fork.agent().write_file_placed(&full, content.clone().into_bytes(), *mode, &placement).await.map(|_| None)
        }
        Action::Submit { answer } => {
            step.kind = "submit".into();
            step.text = answer.clone();
            Ok(Some(answer.clone()))
        }
    };
    step.duration_ms = t.elapsed().as_secs_f64() * 1e3;
    match result {
        Ok(answer) => Ok((step, answer)),
        // The agent's command killed the guest agent; it restarts, the rollout goes on.
        Err(AgentError::AgentRestarted { .. }) => {
            step.stderr = "[farm: the guest agent was killed by this command and restarted]".into();
            let _ = fork.agent().wait_ready(Duration::from_secs(30)).await;
            Ok((step, None))
        }
        Err(AgentError::Refused { message, .. }) => {
            step.stderr = format!("[farm: {message}]");
            step.exit_code = Some(if step.kind == "exec" { 127 } else { 1 });
            Ok((step, None))
        }
        Err(e) => {
            let reason = format!("the VM stopped during the agent's action {index}: {}", fork.explain(&e));
            step.stderr = format!("[farm: {reason}]");
            Err((step, reason))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: &str, error: Option<&str>, steps: usize) -> Row {
        let step = Step {
            index: 0,
            kind: "exec".into(),
            text: "true".into(),
            stdout: String::new(),
            stderr: String::new(),
            exit_code: Some(0),
            started_at_ms: 0,
            duration_ms: 1.0,
        };
        Row {
            run_id: "r".into(),
            suite_name: "s".into(),
            policy_name: "replay".into(),
            steps: vec![step; steps],
            status: status.parse().unwrap(),
            error: error.map(String::from),
            farm_version: "0".into(),
            ..Row::blank("t", 0, 0)
        }
    }

    #[test]
    fn only_environment_errors_before_any_action_are_retried() {
        assert!(worth_retrying(&End::Fork("QEMU exited".into()), 0));
        assert!(worth_retrying(&End::PolicyEndpoint("503".into()), 0));
        // Once the agent acted, a retry would be a fresh sample for a live policy.
        assert!(!worth_retrying(&End::Scoring("the scoring VM failed".into()), 2));
        assert!(!worth_retrying(&End::NoActions("no completion for this task".into()), 0));
        assert!(!worth_retrying(&End::NoSnapshot("preparing the task snapshot failed".into()), 0));
        assert!(!worth_retrying(&End::Internal("panicked".into()), 0));
        for agents in [End::Scored, End::Timeout(600), End::PolicyRefused("too long".into()), End::AgentBrokeVm("x".into()), End::NoArtifacts("x".into())] {
            assert!(!worth_retrying(&agents, 0), "{agents:?}");
        }
    }

    #[test]
    fn an_ending_decides_status_reward_and_error_in_one_place() {
        let settled = |end: End| {
            let mut r = row("env_error", None, 0);
            r.reward = None;
            end.settle(&mut r);
            (r.status, r.reward, r.error)
        };
        // The farm's failures: no reward, never a zero a trainer could take for a failure.
        assert_eq!(settled(End::Fork("QEMU exited".into())), (Status::EnvError, None, Some("fork: QEMU exited".into())));
        assert_eq!(settled(End::NoActions("no completion".into())), (Status::EnvError, None, Some("policy: no completion".into())));
        assert_eq!(settled(End::Scoring("boom".into())).1, None);
        // The agent's: a zero.
        assert_eq!(settled(End::Timeout(600)), (Status::Timeout, Some(0.0), Some("the rollout ran past its 600 s limit".into())));
        assert_eq!(settled(End::PolicyRefused("too long".into())), (Status::Failed, Some(0.0), Some("policy: too long".into())));
        assert_eq!(settled(End::AgentBrokeVm("the VM died".into())).0, Status::Failed);
        // A verdict stays as scoring put it.
        let mut r = row("passed", None, 1);
        r.reward = Some(1.0);
        End::Scored.settle(&mut r);
        assert_eq!((r.status, r.reward, r.error), (Status::Passed, Some(1.0), None));
    }
}
