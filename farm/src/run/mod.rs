//! `farm run SUITE.toml`: the whole data flow in one place.
//!
//! config -> dataset -> template snapshot -> per-task snapshots -> forked rollouts (policy
//! acts) -> artifacts out -> protected scoring -> journal and Parquet parts -> summary.

pub mod counts;
pub mod openai;
pub mod output;
pub mod policy;
pub mod suite;

use std::collections::{HashMap, VecDeque};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::Args;
use datasets::{Task, WORKSPACE};
use sha2::{Digest, Sha256};
use snapshotter::{build_template_with, Fork, ForkIdentity, Forker, Snapshot, SnapshotStore};
use tokio::sync::Semaphore;
use vmm::{AccelSetting, AgentError, ExecOptions, VmSettings};

use output::{OutputWriter, Row, Status, Step, Timings, Usage};
use policy::{Action, ReplayPolicy};
use suite::{ScoringMode, Suite};

#[derive(Args)]
pub struct RunArgs {
    /// The suite file.
    suite: PathBuf,
    /// Output folder (default: the suite's `output.dir`, relative to the suite file).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Finish an interrupted run in the output folder (same suite file).
    #[arg(long)]
    resume: bool,
    /// Only the first N tasks.
    #[arg(long)]
    limit: Option<usize>,
    /// Rollouts at once (overrides `rollouts.concurrency`).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Accelerator: auto (KVM where it runs stock guests, else TCG), kvm or tcg.
    #[arg(long, default_value = "auto")]
    accel: AccelSetting,
}

/// Everything a rollout needs, shared by all of them.
struct Context_ {
    suite_name: String,
    suite_digest: String,
    suite_seed: u64,
    run_id: String,
    config: suite::SuiteConfig,
    forker: Forker,
    policy: Policy,
    external: Vec<String>,
    /// Warm forks of the template snapshot (rollout and scoring VMs of tasks that use it).
    pool: Option<(String, snapshotter::WarmPool)>,
    /// Rollouts at once (`rollouts.concurrency`, resolved).
    concurrency: usize,
}

impl Context_ {
    /// A fork of `snapshot`: from the warm pool when it holds that snapshot.
    async fn fork(&self, snapshot: &Snapshot, identity: ForkIdentity) -> Result<Fork, snapshotter::ForkError> {
        match &self.pool {
            Some((id, pool)) if id == snapshot.id() => pool.fork(identity).await,
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
}

/// Where actions come from.
enum Policy {
    Replay(ReplayPolicy),
    OpenAi(openai::OpenAiPolicy),
}

impl Policy {
    fn load(suite: &Suite, config: &suite::SuiteConfig) -> Result<Policy> {
        Ok(match config.policy.kind {
            suite::PolicyKind::Replay => Policy::Replay(ReplayPolicy::load(suite, &config.policy)?),
            suite::PolicyKind::Openai => {
                Policy::OpenAi(openai::OpenAiPolicy::new(config.policy.openai().map_err(|e| anyhow::anyhow!("{}: {e}", suite.path.display()))?)?)
            }
        })
    }

    fn name(&self) -> &'static str {
        match self {
            Policy::Replay(p) => p.name(),
            Policy::OpenAi(_) => "openai",
        }
    }

    fn params(&self) -> serde_json::Value {
        match self {
            Policy::Replay(p) => p.params(),
            Policy::OpenAi(p) => p.params(),
        }
    }

    fn samples_for(&self, task: &Task, samples: u32) -> u32 {
        match self {
            Policy::Replay(p) => p.samples_for(task),
            Policy::OpenAi(_) => samples,
        }
    }

    fn driver(&self, task: &Task, sample: u32, seed: u64) -> Result<Driver<'_>, String> {
        match self {
            Policy::Replay(p) => p.actions(task, sample).map(|a| Driver::Replay(a.into())),
            Policy::OpenAi(p) => Ok(Driver::Chat(p.session(task, seed))),
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
fn observation(step: &Step) -> String {
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

/// One planned rollout.
#[derive(Clone)]
struct Planned {
    task: Arc<Task>,
    sample: u32,
    /// The snapshot the rollout forks, or why it could not be made.
    snapshot: Result<Arc<Snapshot>, String>,
}

pub async fn run(args: RunArgs) -> Result<i32> {
    // 1. Config.
    let suite = Suite::load(&args.suite)?;
    let mut config = suite.config.clone();
    if let Some(c) = args.concurrency {
        config.rollouts.concurrency = suite::Count::Fixed(c.max(1));
    }
    let out_dir = match &args.out {
        Some(dir) => dir.clone(),
        None => suite.resolve(&config.output.dir),
    };

    // 2. Dataset.
    let dataset_path = suite.resolve(&config.dataset.path);
    let mut tasks = datasets::load(&dataset_path, config.dataset.format)?;
    if !config.dataset.tasks.is_empty() {
        tasks.retain(|t| config.dataset.tasks.contains(&t.id));
    }
    if let Some(limit) = args.limit.or(config.dataset.limit) {
        tasks.truncate(limit);
    }
    if config.scoring.external.is_empty() {
        if let Some(t) = tasks.iter().find(|t| !t.is_scorable()) {
            anyhow::bail!("{}: task {:?} has neither a test command nor an expected answer, and the suite sets no scoring.external", dataset_path.display(), t.id);
        }
    }
    let policy = Policy::load(&suite, &config)?;
    let live_requests = match &policy {
        Policy::Replay(_) => None,
        Policy::OpenAi(_) => config.policy.openai().ok().map(|c| c.concurrency),
    };
    let counts = counts::resolve(config.rollouts.concurrency, config.rollouts.warm_pool, live_requests, config.template.memory_mib, &counts::Host::probe());

    // Output first: a run that cannot record must not start.
    let run_id = new_run_id();
    let writer = OutputWriter::open(&out_dir, &run_id, &config.suite.name, &suite.digest, args.resume, config.output.rows_per_part)?;
    let run_id = writer.run_id().to_string();
    let digests: HashMap<&str, String> = tasks.iter().map(|t| (t.id.as_str(), t.digest())).collect();
    if let Some(changed) = writer.outcomes().iter().find(|o| digests.get(o.task_id.as_str()).is_some_and(|d| *d != o.task_digest)) {
        anyhow::bail!(
            "task {:?} in {} changed since the recorded rollouts of this run: resuming would mix two versions of it; start a new run in another folder",
            changed.task_id,
            dataset_path.display()
        );
    }
    let tasks: Vec<Arc<Task>> = tasks.into_iter().map(Arc::new).collect();
    let mut plan_keys = Vec::new();
    for task in &tasks {
        for sample in 0..policy.samples_for(task, config.rollouts.samples) {
            plan_keys.push((task.clone(), sample));
        }
    }
    let planned_total = plan_keys.len();
    let todo: Vec<(Arc<Task>, u32)> = plan_keys.into_iter().filter(|(t, s)| !writer.done().contains(&(t.id.clone(), *s))).collect();
    let log = Log::new();
    log.line(&format!(
        "suite {} ({} tasks, {} rollouts planned, {} already done) -> {}",
        config.suite.name,
        tasks.len(),
        planned_total,
        planned_total - todo.len(),
        out_dir.display()
    ));
    if !counts.explanation.is_empty() {
        log.line(&counts.explanation);
    }

    // Ctrl-C or SIGTERM while snapshots are prepared: stop at once (nothing has run yet).
    let mut signals = Signals::new()?;
    let prepared = tokio::select! {
        prepared = prepare(&suite, &config, &args, &todo, counts.concurrency, &log) => prepared?,
        code = signals.recv() => {
            log.line("interrupted while preparing snapshots; nothing ran");
            return Ok(code);
        }
    };
    let (forker, task_snapshots, template) = prepared;
    if let Some(note) = vmm::jail::missing_cgroups_note() {
        log.line(&note);
    }
    let uses_template = task_snapshots.values().any(|s| matches!(s, Ok(s) if s.id() == template.id()));
    let pool = if counts.warm_pool > 0 && uses_template {
        let pool = snapshotter::WarmPool::start_with_warm_up(
            forker.clone(),
            (*template).clone(),
            counts.warm_pool,
            snapshotter::PoolMode::Resumed,
            &config.rollouts.warm_up,
        )?;
        Some((template.id().to_string(), pool))
    } else {
        None
    };

    // 5. Rollouts, scored as they finish, each recorded as it ends.
    let context = Arc::new(Context_ {
        suite_name: config.suite.name.clone(),
        suite_digest: suite.digest.clone(),
        suite_seed: config.suite.seed,
        run_id: run_id.clone(),
        external: resolve_external(&suite, &config.scoring.external),
        config: config.clone(),
        forker,
        policy,
        pool,
        concurrency: counts.concurrency,
    });
    run_rollouts(context, todo, task_snapshots, writer, signals, planned_total, &log, &args, &out_dir).await
}

type TaskSnapshots = HashMap<String, Result<Arc<Snapshot>, String>>;
type Prepared = (Forker, TaskSnapshots, Arc<Snapshot>);

/// 3 and 4: the template snapshot, then a snapshot per task that has files or setup.
async fn prepare(suite: &Suite, config: &suite::SuiteConfig, args: &RunArgs, todo: &[(Arc<Task>, u32)], concurrency: usize, log: &Log) -> Result<Prepared> {
    // 3. Template snapshot.
    let mut vm = VmSettings::detect(args.accel)?;
    vm.boot_timeout = Duration::from_secs(300);
    let mut forker = Forker::new(vm)?;
    forker.max_disk_bytes = Some(config.rollouts.max_disk_mib << 20);
    let store = SnapshotStore::default_location();
    let progress = |line: &str| log.line(&format!("template: {line}"));
    let template = build_template_with(&store, &forker, &config.template, &suite.dir, &config.suite.name, &scorers::zygote::template_extras(), &progress)
        .await
        .context("building the suite's template")?;
    log.line(&format!("template snapshot {}{}", template.snapshot.id(), if template.reused { " (reused)" } else { "" }));
    let template = Arc::new(template.snapshot);

    // 4. Per-task snapshots for tasks with files or setup, `rollouts.concurrency` at a time;
    // tasks with the same files and setup share one.
    let mut task_snapshots: TaskSnapshots = HashMap::new();
    let mut by_id: HashMap<String, Vec<String>> = HashMap::new();
    let mut seen = std::collections::HashSet::new();
    let mut building = tokio::task::JoinSet::new();
    let slots = Arc::new(Semaphore::new(concurrency.max(1)));
    for (task, _) in todo {
        if !seen.insert(task.id.clone()) {
            continue;
        }
        if !task.needs_snapshot() {
            task_snapshots.insert(task.id.clone(), Ok(template.clone()));
            continue;
        }
        let id = task_snapshot_id(&template, task);
        let users = by_id.entry(id).or_default();
        users.push(task.id.clone());
        if users.len() > 1 {
            continue;
        }
        let (store, forker, template, task, slots) = (store.clone(), forker.clone(), template.clone(), task.clone(), slots.clone());
        building.spawn(async move {
            let _slot = slots.acquire_owned().await.expect("semaphore open");
            let snapshot = task_snapshot(&store, &forker, &template, &task).await;
            (task_snapshot_id(&template, &task), snapshot.map(Arc::new).map_err(|e| format!("preparing the task snapshot failed: {e:#}")))
        });
    }
    if !building.is_empty() {
        log.line(&format!("preparing {} task snapshots", building.len()));
    }
    while let Some(built) = building.join_next().await {
        let (id, snapshot) = built.context("a task snapshot build panicked")?;
        for task_id in by_id.get(&id).into_iter().flatten() {
            if let Err(e) = &snapshot {
                log.line(&format!("task {task_id}: {e}"));
            }
            task_snapshots.insert(task_id.clone(), snapshot.clone());
        }
    }
    Ok((forker, task_snapshots, template))
}

/// 5 and 6: run the rollouts with bounded concurrency, record each as it ends, summarise.
#[allow(clippy::too_many_arguments)]
async fn run_rollouts(
    context: Arc<Context_>,
    todo: Vec<(Arc<Task>, u32)>,
    task_snapshots: TaskSnapshots,
    mut writer: OutputWriter,
    mut signals: Signals,
    planned_total: usize,
    log: &Log,
    args: &RunArgs,
    out_dir: &std::path::Path,
) -> Result<i32> {
    let config = context.config.clone();
    let planned: Vec<Planned> = todo
        .into_iter()
        .map(|(task, sample)| Planned { snapshot: task_snapshots[&task.id].clone(), task, sample })
        .collect();
    let total = planned.len();
    let semaphore = Arc::new(Semaphore::new(context.concurrency));
    let mut running = tokio::task::JoinSet::new();
    let mut queue = planned.into_iter();
    let mut progress = Progress::new(total, writer.outcomes().len());
    let mut interrupted = None;
    let wall = Instant::now();
    let mut write_time = Duration::ZERO;
    let mut finished_now = 0usize;
    loop {
        // Start what the concurrency allows.
        while running.len() < context.concurrency && interrupted.is_none() {
            let Some(item) = queue.next() else { break };
            let context = context.clone();
            let permit = semaphore.clone().acquire_owned().await.expect("semaphore open");
            running.spawn(async move {
                let row = rollout_isolated(context, item).await;
                drop(permit);
                row
            });
        }
        if running.is_empty() {
            break;
        }
        tokio::select! {
            finished = running.join_next() => {
                let Some(finished) = finished else { break };
                let row = finished.context("a rollout task panicked")?;
                progress.record(&row, log);
                let t = Instant::now();
                writer.append(row)?;
                write_time += t.elapsed();
                finished_now += 1;
            }
            code = signals.recv(), if interrupted.is_none() => {
                log.line(&format!("interrupted: stopping {} rollouts in flight; `farm run {} --resume` finishes the run", running.len(), args.suite.display()));
                interrupted = Some(code);
                // In-flight rollouts end now (their VMs are killed); they are not recorded and
                // will run again on resume. Rollouts that finished meanwhile are recorded.
                running.abort_all();
                while let Some(finished) = running.join_next().await {
                    if let Ok(row) = finished {
                        progress.record(&row, log);
                        writer.append(row)?;
                        finished_now += 1;
                    }
                }
                break;
            }
        }
    }
    progress.finish();

    // 6. Output.
    let t = Instant::now();
    writer.flush()?;
    write_time += t.elapsed();
    let mut summary = output::summary(writer.outcomes(), config.rollouts.samples, planned_total);
    summary["performance"] = performance(&writer.outcomes()[writer.outcomes().len() - finished_now..], wall.elapsed(), write_time, context.concurrency);
    writer.write_summary(&summary)?;
    log.line(&format!(
        "{} of {} rollouts recorded: {} passed, {} failed, {} timeout, {} env_error; mean reward {}; summary in {}",
        writer.outcomes().len(),
        planned_total,
        summary["counts"]["passed"],
        summary["counts"]["failed"],
        summary["counts"]["timeout"],
        summary["counts"]["env_error"],
        summary["mean_reward"],
        out_dir.join("summary.json").display()
    ));
    Ok(interrupted.unwrap_or(0))
}

/// Throughput and per-phase times of the rollouts finished by this invocation.
fn performance(rows: &[output::Outcome], wall: Duration, write: Duration, concurrency: usize) -> serde_json::Value {
    let phase = |f: fn(&Timings) -> f64| {
        let mut v: Vec<f64> = rows.iter().map(|r| f(&r.timings)).collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        if v.is_empty() {
            return serde_json::json!(null);
        }
        let p = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        serde_json::json!({ "mean_ms": v.iter().sum::<f64>() / v.len() as f64, "p50_ms": p(0.5), "p99_ms": p(0.99) })
    };
    serde_json::json!({
        "rollouts": rows.len(),
        "concurrency": concurrency,
        "wall_secs": wall.as_secs_f64(),
        "rollouts_per_sec": rows.len() as f64 / wall.as_secs_f64().max(1e-9),
        "fork": phase(|t| t.fork_ms),
        "rollout": phase(|t| t.rollout_ms),
        "score": phase(|t| t.score_ms),
        "total": phase(|t| t.total_ms),
        "write_ms_total": write.as_secs_f64() * 1e3,
        "write_ms_per_rollout": write.as_secs_f64() * 1e3 / rows.len().max(1) as f64,
    })
}

fn new_run_id() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let digest = Sha256::digest(format!("{nanos}-{}", std::process::id()).as_bytes());
    format!("run-{}", digest.iter().take(6).map(|b| format!("{b:02x}")).collect::<String>())
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn resolve_external(suite: &Suite, argv: &[String]) -> Vec<String> {
    let mut argv = argv.to_vec();
    if let Some(first) = argv.first_mut() {
        if first.contains('/') && !first.starts_with('/') {
            *first = suite.resolve(std::path::Path::new(first.as_str())).to_string_lossy().into_owned();
        }
    }
    argv
}

/// A rollout's seed: fixed by the suite seed, the task and the sample.
fn rollout_seed(suite_seed: u64, task: &str, sample: u32) -> u64 {
    let d = Sha256::digest(format!("{suite_seed}\0{task}\0{sample}").as_bytes());
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

/// A row for a rollout, before anything happened: status env_error until decided.
fn new_row(context: &Context_, item: &Planned, seed: u64, started_at_ms: i64) -> Row {
    let task = &item.task;
    Row {
        run_id: context.run_id.clone(),
        suite_name: context.suite_name.clone(),
        suite_digest: context.suite_digest.clone(),
        task_id: task.id.clone(),
        task_digest: task.digest(),
        sample_index: item.sample,
        seed,
        snapshot_id: item.snapshot.as_ref().map(|s| s.id().to_string()).unwrap_or_default(),
        policy_name: context.policy.name().to_string(),
        policy_params: context.policy.params().to_string(),
        steps: Vec::new(),
        messages: "[]".into(),
        usage: Usage::default(),
        reward: None,
        status: Status::EnvError,
        error: None,
        score_details: "{}".into(),
        attempts: 1,
        timings: Timings::default(),
        started_at_ms,
        farm_version: env!("CARGO_PKG_VERSION").to_string(),
    }
}

/// Aborts a spawned task when dropped (an interrupted run must not leave rollouts running).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs a rollout on a task of its own, so a panic in it becomes an env_error row for that
/// rollout instead of ending the run.
async fn rollout_isolated(context: Arc<Context_>, item: Planned) -> Row {
    use tracing::Instrument;
    let span = tracing::info_span!(
        "rollout",
        run_id = %context.run_id,
        task_id = %item.task.id,
        sample = item.sample,
        fork_id = tracing::field::Empty,
    );
    let mut inner = {
        let (context, item) = (context.clone(), item.clone());
        AbortOnDrop(tokio::spawn(async move { rollout_with_retries(&context, &item).await }.instrument(span)))
    };
    match (&mut inner.0).await {
        Ok(row) => row,
        Err(e) => {
            let seed = rollout_seed(context.suite_seed, &item.task.id, item.sample);
            let mut row = new_row(&context, &item, seed, now_ms());
            End::Internal(e.to_string()).settle(&mut row);
            row
        }
    }
}

async fn rollout_with_retries(context: &Context_, item: &Planned) -> Row {
    let mut attempt = 1;
    loop {
        let (mut row, end) = rollout(context, item).await;
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
        if attempt > context.config.rollouts.retries || !worth_retrying(&end, row.steps.len()) {
            return row;
        }
        attempt += 1;
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
enum End {
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
            End::NoSnapshot(_) | End::NoActions(_) | End::Fork(_) | End::Setup(_) | End::PolicyEndpoint(_) | End::Scoring(_) | End::Internal(_) => {
                Some(Status::EnvError)
            }
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
    fn settle(&self, row: &mut Row) {
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

async fn rollout(context: &Context_, item: &Planned) -> (Row, End) {
    let started = Instant::now();
    let started_at_ms = now_ms();
    let task = &item.task;
    let seed = rollout_seed(context.suite_seed, &task.id, item.sample);
    let mut row = new_row(context, item, seed, started_at_ms);
    let finish = |mut row: Row, end: End| {
        end.settle(&mut row);
        row.timings.total_ms = started.elapsed().as_secs_f64() * 1e3;
        (row, end)
    };
    let snapshot = match &item.snapshot {
        Ok(s) => s.clone(),
        Err(e) => return finish(row, End::NoSnapshot(e.clone())),
    };
    let mut driver = match context.policy.driver(task, item.sample, seed) {
        Ok(d) => d,
        Err(e) => return finish(row, End::NoActions(e.to_string())),
    };

    // Replayed data needs no VM: when every action writes a file in the workspace or submits
    // the answer, the artifacts are those files, known without running anything. Only
    // fresh-fork scoring can use them (final-state scoring grades the rollout's own VM).
    if context.config.scoring.mode == ScoringMode::FreshFork {
        if let Driver::Replay(actions) = &driver {
            if let Some((steps, artifacts)) = data_only_rollout(actions, context.config.rollouts.max_steps, &scorers::ArtifactLimits::default()) {
                row.steps = steps;
                let score_started = Instant::now();
                let verdict = score(context, task, &snapshot, None, &artifacts, seed).await;
                row.timings.score_ms = score_started.elapsed().as_secs_f64() * 1e3;
                let end = record_verdict(&mut row, verdict, &artifacts);
                return finish(row, end);
            }
        }
    }

    // Fork.
    let identity = ForkIdentity { env: vec![("FARM_TASK_ID".into(), task.id.clone())], ..ForkIdentity::new(seed) };
    tracing::Span::current().record("fork_id", identity.fork_id.as_str());
    tracing::debug!("forking the task's snapshot");
    let fork = match context.fork_task(&snapshot, task, identity).await {
        Ok(f) => f,
        Err(e) => return finish(row, End::Fork(format!("{e:#}"))),
    };
    row.timings.fork_ms = started.elapsed().as_secs_f64() * 1e3;
    tracing::debug!(fork_ms = row.timings.fork_ms, "forked");
    if !context.config.rollouts.runs_as_root() {
        if let Err(e) = fork.agent().handover(WORKSPACE, &context.config.rollouts.user).await {
            return finish(row, End::Setup(format!("handing the workspace to rollouts.user {:?}: {e}", context.config.rollouts.user)));
        }
    }
    let limits = scorers::ArtifactLimits::default();
    let baseline = match scorers::artifacts::list_workspace(fork.agent(), &limits).await {
        Ok(b) => b,
        Err(e) => return finish(row, End::Setup(format!("listing the workspace: {e}"))),
    };

    // The policy acts.
    let rollout_started = Instant::now();
    let rollouts = &context.config.rollouts;
    let mut answer = None;
    let ending = {
        let steps = &mut row.steps;
        let answer = &mut answer;
        let driver = &mut driver;
        // The time limit counts the agent's actions in the VM, not the time the policy takes
        // to answer (an endpoint's queueing and retries are not the agent's doing; the
        // policy has its own request timeout and retries).
        let act = async {
            let mut observed = None;
            let budget = Duration::from_secs(rollouts.timeout_secs);
            let mut spent = Duration::ZERO;
            for index in 0..rollouts.max_steps {
                let action = match driver.next(observed.take()).await {
                    Ok(Some(action)) => action,
                    Ok(None) => break,
                    Err(e) => return policy_ending(&e),
                };
                let started = Instant::now();
                let Some(remaining) = budget.checked_sub(spent) else { return Ending::Timeout };
                let result = match tokio::time::timeout(remaining, run_action(&fork, &action, index as u32, rollouts)).await {
                    Ok(result) => result,
                    Err(_) => return Ending::Timeout,
                };
                spent += started.elapsed();
                match result {
                    Ok((step, submitted)) => {
                        observed = Some(observation(&step));
                        steps.push(step);
                        if let Some(a) = submitted {
                            *answer = Some(a);
                            break;
                        }
                    }
                    Err((step, reason)) => {
                        steps.push(step);
                        return Ending::AgentBrokeVm(reason);
                    }
                }
            }
            Ending::Done
        };
        act.await
    };
    row.messages = driver.messages_json();
    row.usage = driver.usage();
    row.timings.rollout_ms = rollout_started.elapsed().as_secs_f64() * 1e3;
    match ending {
        Ending::Done => {}
        Ending::Timeout => return finish(row, End::Timeout(rollouts.timeout_secs)),
        Ending::PolicyRefused(reason) => return finish(row, End::PolicyRefused(reason)),
        // The endpoint failed, not the model's answer: an environment error (retried).
        Ending::PolicyFailed(reason) => return finish(row, End::PolicyEndpoint(reason)),
        // The agent's own action took its VM down: an agent failure, not the farm's.
        Ending::AgentBrokeVm(reason) => return finish(row, End::AgentBrokeVm(reason)),
    }

    // Artifacts out, as untrusted data; then the rollout VM goes (fresh-fork scoring).
    let score_started = Instant::now();
    let mut collected = scorers::collect_artifacts(fork.agent(), &baseline, &limits).await;
    for _ in 0..3 {
        // The agent's processes may still have been killing the guest agent: wait for the
        // restarted one and ask again.
        if !matches!(collected, Err(AgentError::AgentRestarted { .. })) {
            break;
        }
        let _ = fork.agent().wait_ready(Duration::from_secs(30)).await;
        collected = scorers::collect_artifacts(fork.agent(), &baseline, &limits).await;
    }
    let mut artifacts = match collected {
        Ok(a) => a,
        Err(e) => return finish(row, End::NoArtifacts(fork.explain(&e))),
    };
    artifacts.answer = answer;
    let verdict = score(context, task, &snapshot, Some(fork), &artifacts, seed).await;
    row.timings.score_ms = score_started.elapsed().as_secs_f64() * 1e3;
    let end = record_verdict(&mut row, verdict, &artifacts);
    finish(row, end)
}

/// Puts a verdict into the row; or says why scoring failed.
fn record_verdict(row: &mut Row, verdict: Result<scorers::Verdict>, artifacts: &scorers::Artifacts) -> End {
    match verdict {
        Ok(v) => {
            if let Some(reason) = v.details.get("agent_failure").and_then(|r| r.as_str()) {
                row.error = Some(reason.to_string());
            } else if let Some(reason) = v.details.get("harness").and_then(|r| r.as_str()) {
                row.error = Some(format!("harness: {reason}"));
            }
            row.reward = Some(v.reward);
            row.status = if v.timed_out {
                Status::Timeout
            } else if v.passed {
                Status::Passed
            } else {
                Status::Failed
            };
            let mut details = v.details;
            details["artifacts"] = serde_json::to_value(artifacts).unwrap_or_default();
            row.score_details = details.to_string();
            End::Scored
        }
        Err(e) => End::Scoring(format!("{e:#}")),
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
async fn run_action(fork: &Fork, action: &Action, index: u32, limits: &suite::RolloutsSection) -> Result<(Step, Option<String>), (Step, String)> {
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

/// Scores a rollout where the agent cannot reach. Errors are environment errors.
/// `rollout_fork` is the rollout's VM (None for a replay that needed none); final-state
/// scoring requires it.
async fn score(context: &Context_, task: &Task, snapshot: &Snapshot, rollout_fork: Option<Fork>, artifacts: &scorers::Artifacts, seed: u64) -> Result<scorers::Verdict> {
    let scoring = &context.config.scoring;
    let timeout = Duration::from_secs(scoring.timeout_secs);
    let mut outcome = None;
    let mut verdict = if task.has_tests() {
        let scoring_fork = match scoring.mode {
            ScoringMode::FreshFork => {
                drop(rollout_fork);
                let identity = ForkIdentity::new(seed);
                tracing::debug!(scoring_fork_id = %identity.fork_id, "forking the scoring VM");
                context.fork_task(snapshot, task, identity).await.context("forking the scoring VM")?
            }
            ScoringMode::FinalState => {
                let Some(rollout_fork) = rollout_fork else { anyhow::bail!("final-state scoring needs the rollout's VM") };
                // Every process the agent left is killed by the guest agent itself (no shell
                // or binary of the rollout's takes part), then the tests folder it may have
                // planted files in is removed, then the tests go into the same VM. The agent
                // had this VM (as root, by default): whatever keeps it from taking the tests
                // is the agent's doing, never an environment error it could hide behind.
                let agent = rollout_fork.agent();
                let cleared = match agent.sweep(Vec::new()).await {
                    Ok((_, true)) => agent.remove_tree(datasets::TESTS_DIR).await.map(|_| ()).map_err(|e| format!("clearing the tests folder: {e}")),
                    Ok((_, false)) => Err("processes the rollout left survived every attempt to kill them".to_string()),
                    Err(e) => Err(format!("killing the rollout's processes: {e}")),
                };
                if let Err(reason) = cleared {
                    return Ok(agent_failure(format!("the rollout's VM could not be made ready for its tests: {reason}")));
                }
                rollout_fork
            }
        };
        let scored_artifacts = if scoring.mode == ScoringMode::FinalState { scorers::Artifacts::default() } else { artifacts.clone() };
        let options = scorers::hidden::TestRunOptions {
            timeout,
            call_timeout: Duration::from_secs(scoring.call_timeout_secs),
            final_state: scoring.mode == ScoringMode::FinalState,
        };
        match scorers::run_tests(scoring_fork.agent(), task, &scored_artifacts, &options).await {
            Ok(result) => {
                let v = scorers::hidden::decide(&result, scoring.pass_threshold, task.require_reward_file);
                outcome = Some(result);
                v
            }
            Err(scorers::ScoringError::Environment(e)) => return Err(anyhow::anyhow!(scoring_fork.explain(&e))),
            Err(scorers::ScoringError::Agent(reason)) => {
                let reason = match scoring_fork.machine.limit_violation() {
                    Some(limit) => format!("{reason} ({limit})"),
                    None => reason,
                };
                agent_failure(reason)
            }
        }
    } else if let Some(expected) = &task.expected_answer {
        drop(rollout_fork);
        scorers::answer::score_answer(expected, artifacts.answer.as_deref(), &task.answer_match)
    } else {
        drop(rollout_fork);
        scorers::Verdict { reward: 0.0, passed: false, timed_out: false, details: serde_json::json!({}) }
    };
    // A rollout whose work broke scoring has its verdict (reward 0); there is nothing for an
    // external scorer to grade, and its failing on the missing outcome must not turn the
    // agent's doing into an environment error.
    let broke_scoring = verdict.details.get("agent_failure").is_some();
    if !context.external.is_empty() && !broke_scoring {
        let input = serde_json::json!({
            "task_id": task.id,
            "metadata": task.metadata,
            "expected_answer": task.expected_answer,
            "answer": artifacts.answer,
            "artifacts": artifacts,
            "tests": outcome,
            "verdict": verdict,
        });
        let timed_out = verdict.timed_out;
        verdict = scorers::external::run(&context.external, &input, timeout, scoring.pass_threshold).await?;
        if timed_out {
            // The tests ran out of time: the external scorer may grade, but cannot pass it.
            verdict.timed_out = true;
            verdict.passed = false;
        }
    }
    Ok(verdict)
}

/// Text fit for a terminal: control characters (a guest's file names, a candidate's error
/// text) are shown escaped, so nothing a rollout produced can move the cursor, retitle the
/// terminal or hide a line.
fn printable(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { c.escape_unicode().to_string() } else { c.to_string() }).collect()
}

/// The verdict of a rollout whose own work broke scoring: reward 0, with the reason.
fn agent_failure(reason: String) -> scorers::Verdict {
    scorers::Verdict {
        reward: 0.0,
        passed: false,
        timed_out: false,
        details: serde_json::json!({ "basis": "the agent's work broke scoring", "agent_failure": reason }),
    }
}

/// Log lines: plain on a pipe; above a progress line on a terminal.
struct Log {
    tty: bool,
}

impl Log {
    fn new() -> Log {
        Log { tty: std::io::stderr().is_terminal() }
    }

    fn line(&self, text: &str) {
        if self.tty {
            eprint!("\r\x1b[2K");
        }
        eprintln!("farm: {}", printable(text));
    }
}

struct Progress {
    total: usize,
    done: usize,
    counts: std::collections::BTreeMap<Status, usize>,
    started: Instant,
    tty: bool,
}

impl Progress {
    fn new(total: usize, _already: usize) -> Progress {
        Progress { total, done: 0, counts: Default::default(), started: Instant::now(), tty: std::io::stderr().is_terminal() }
    }

    fn record(&mut self, row: &Row, log: &Log) {
        self.done += 1;
        *self.counts.entry(row.status).or_default() += 1;
        let elapsed = self.started.elapsed().as_secs_f64();
        let rate = self.done as f64 / elapsed.max(1e-3);
        let eta = (self.total - self.done) as f64 / rate.max(1e-9);
        let counts: Vec<String> = self.counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
        if self.tty {
            let width = 30;
            let filled = (self.done * width / self.total.max(1)).min(width);
            eprint!(
                "\r\x1b[2K[{}{}] {}/{} {:.2}/s ETA {:.0}s | {}",
                "#".repeat(filled),
                " ".repeat(width - filled),
                self.done,
                self.total,
                rate,
                eta,
                counts.join(", ")
            );
        } else {
            log.line(&format!(
                "{}/{} {} sample {}: {}{} ({:.1}/s, ETA {:.0}s)",
                self.done,
                self.total,
                row.task_id,
                row.sample_index,
                row.status,
                row.error.as_deref().map(|e| format!(" ({})", e.chars().take(200).collect::<String>())).unwrap_or_default(),
                rate,
                eta
            ));
        }
    }

    fn finish(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

/// SIGINT and SIGTERM, as exit codes.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals { interrupt: signal(SignalKind::interrupt())?, terminate: signal(SignalKind::terminate())? })
    }

    async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.interrupt.recv() => 128 + libc::SIGINT,
            _ = self.terminate.recv() => 128 + libc::SIGTERM,
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
            suite_digest: String::new(),
            task_id: "t".into(),
            task_digest: String::new(),
            sample_index: 0,
            seed: 0,
            snapshot_id: String::new(),
            policy_name: "replay".into(),
            policy_params: "{}".into(),
            steps: vec![step; steps],
            messages: "[]".into(),
            usage: Usage::default(),
            reward: None,
            status: status.parse().unwrap(),
            error: error.map(String::from),
            score_details: "{}".into(),
            attempts: 1,
            timings: Timings::default(),
            started_at_ms: 0,
            farm_version: "0".into(),
        }
    }

    #[test]
    fn log_text_cannot_carry_terminal_controls() {
        assert_eq!(printable("ok \u{1b}]0;PWNED\u{7}\r\nnext"), "ok \\u{1b}]0;PWNED\\u{7}\\u{d}\\u{a}next");
        assert_eq!(printable("plain: text"), "plain: text");
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
