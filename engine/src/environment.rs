//! The kinds of environment a task can have, behind one seam. The engine asks a task's
//! [`Environment`] to prepare it ([`Engine::prepare`]), to open a live fork of it
//! ([`Engine::open`]) and to verify what the agent did there ([`Engine::finish`]); which
//! kind it holds is asked in one place, [`Environment::of`], and each operation is one
//! match that hands the work to its kind:
//!
//! - [`Environment::Suite`]: a task of farm's own formats (a task table, HumanEval, a task
//!   folder) in the suite's template, with the task's files and setup as a child snapshot
//!   when it has any; its agent acts in `/workspace`, and it is scored where the agent cannot
//!   reach (`scorers::orchestrate`);
//! - [`Environment::Harbor`]: a Harbor task, in an environment of its own (its Dockerfile,
//!   or its `docker_image`); its agent acts where the image says, and its own `test.sh`
//!   verifies it (`scorers::harbor`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datasets::{HarborTask, Task, WORKSPACE};
use snapshotter::{ForkIdentity, Forker, Snapshot, SnapshotStore};
use tokio::sync::Semaphore;
use vmm::AgentError;

use crate::config::{RolloutsSection, SuiteConfig};
use crate::end::{record_verdict, End};
use crate::engine::{Engine, EngineError, TaskSnapshot, TaskSnapshots};
use crate::errors::describe;
use crate::harbor::{EnvironmentRecord, Place};
use crate::live::{ca_env, install_ca, LiveFork};
use crate::metrics::{Role, VmGauge};
use crate::row::Row;

/// A task's environment, by kind.
pub enum Environment<'a> {
    /// farm's own task formats, in the suite's template.
    Suite(&'a Task),
    /// A Harbor task, in the environment its task folder builds.
    Harbor(&'a Task, &'a HarborTask),
}

/// How one task's snapshot is made (owned: it is built on a task of its own).
enum Job {
    Suite {
        host: Arc<crate::host::Host>,
        template: Arc<Snapshot>,
        task: Arc<Task>,
    },
    Harbor {
        host: Arc<crate::host::Host>,
        config: Box<SuiteConfig>,
        task: Arc<Task>,
        harbor: Box<HarborTask>,
    },
}

/// What a prepared Harbor environment adds to its snapshot: the config its commands run
/// with, and what it was built from.
type Extras = Option<(String, images::ImageConfig, EnvironmentRecord)>;

impl Job {
    async fn run(self) -> (TaskSnapshot, Extras) {
        match self {
            Job::Suite { host, template, task } => {
                match task_snapshot(&host.store, &host.forker, &template, &task).await {
                    Ok(s) => (TaskSnapshot::Ready(Arc::new(s)), None),
                    Err(e) => (
                        TaskSnapshot::Failed(format!("preparing the task snapshot failed: {}", describe(&e))),
                        None,
                    ),
                }
            }
            Job::Harbor {
                host,
                config,
                task,
                harbor,
            } => match crate::harbor::environment(&host, &config, &task, &harbor).await {
                Ok((s, image, record)) => (TaskSnapshot::Ready(Arc::new(s)), Some((task.id.clone(), image, record))),
                Err(e) => (
                    TaskSnapshot::Failed(format!("building the task's environment failed: {}", describe(&e))),
                    None,
                ),
            },
        }
    }
}

impl<'a> Environment<'a> {
    /// The one place that asks which kind of environment a task has.
    pub fn of(task: &'a Task) -> Environment<'a> {
        match task.harbor.as_deref() {
            Some(harbor) => Environment::Harbor(task, harbor),
            None => Environment::Suite(task),
        }
    }

    /// The limits a rollout of the task runs under: a Harbor task's own agent timeout bounds
    /// its rollout and each of its commands (the oracle's solve.sh is one).
    pub fn limits(&self, limits: &RolloutsSection) -> RolloutsSection {
        match self {
            Environment::Harbor(_, harbor) => match harbor.agent_timeout_secs {
                Some(secs) => {
                    let secs = secs.ceil().max(1.0) as u64;
                    RolloutsSection {
                        timeout_secs: secs,
                        step_timeout_secs: secs,
                        ..limits.clone()
                    }
                }
                None => limits.clone(),
            },
            Environment::Suite(_) => limits.clone(),
        }
    }

    /// Whether a replay that only writes files can be scored with no rollout VM (its files
    /// are its artifacts): only in the suite's environment, scored in a fresh fork.
    pub fn scores_files_alone(&self) -> bool {
        matches!(self, Environment::Suite(_))
    }

    /// The key under which tasks share one prepared snapshot, and how it is made; None when
    /// the task runs in the suite's template as it is.
    fn job(&self, engine: &Engine, task: &Arc<Task>) -> Option<(String, Job)> {
        match self {
            Environment::Suite(t) if !t.needs_snapshot() => None,
            Environment::Suite(t) => Some((
                task_snapshot_id(&engine.template, t),
                Job::Suite {
                    host: engine.host.clone(),
                    template: engine.template.clone(),
                    task: task.clone(),
                },
            )),
            // An environment of its own: a template of its own.
            Environment::Harbor(t, harbor) => Some((
                format!("harbor:{}", t.id),
                Job::Harbor {
                    host: engine.host.clone(),
                    config: Box::new(engine.config.clone()),
                    task: task.clone(),
                    harbor: Box::new((*harbor).clone()),
                },
            )),
        }
    }
}

impl Engine {
    /// What `farm run` and `farm serve` do before their first rollout: every task's snapshot
    /// ([`Engine::prepare`]), then a warm pool of `warm_pool` forks of the template when some
    /// task runs in the template itself (a task with its own snapshot forks that instead).
    pub async fn prepare_and_pool(
        &mut self,
        tasks: &[Arc<Task>],
        concurrency: usize,
        warm_pool: usize,
        log: &(dyn Fn(&str) + Sync),
    ) -> Result<TaskSnapshots, EngineError> {
        let snapshots = self.prepare(tasks, concurrency, log).await?;
        self.scoring_vms.set_max_idle(concurrency);
        self.reset_vms.set_max_idle(concurrency);
        let template = self.template.id();
        if snapshots
            .values()
            .any(|s| matches!(s, TaskSnapshot::Ready(s) if s.id() == template))
        {
            self.start_pool(warm_pool)?;
        }
        Ok(snapshots)
    }

    /// Each task's snapshot, `concurrency` built at a time: the environment's own for Harbor
    /// tasks; for the others a child of the template with the task's files and setup (tasks
    /// with the same files and setup share one), or the template itself.
    pub async fn prepare(
        &self,
        tasks: &[Arc<Task>],
        concurrency: usize,
        log: &(dyn Fn(&str) + Sync),
    ) -> Result<TaskSnapshots, EngineError> {
        let mut task_snapshots: TaskSnapshots = HashMap::new();
        let mut by_key: HashMap<String, Vec<String>> = HashMap::new();
        let mut building = tokio::task::JoinSet::new();
        let slots = Arc::new(Semaphore::new(concurrency.max(1)));
        for task in tasks {
            if task_snapshots.contains_key(&task.id) || by_key.values().flatten().any(|id| *id == task.id) {
                continue;
            }
            let Some((key, job)) = Environment::of(task).job(self, task) else {
                task_snapshots.insert(task.id.clone(), TaskSnapshot::Ready(self.template.clone()));
                continue;
            };
            let users = by_key.entry(key.clone()).or_default();
            users.push(task.id.clone());
            if users.len() > 1 {
                continue;
            }
            let slots = slots.clone();
            building.spawn(async move {
                let _slot = slots.acquire_owned().await.expect("semaphore open");
                let (snapshot, extras) = job.run().await;
                (key, snapshot, extras)
            });
        }
        if !building.is_empty() {
            log(&format!("preparing {} task snapshots", building.len()));
        }
        while let Some(built) = building.join_next().await {
            let (key, snapshot, extras) = built.map_err(|_| EngineError::Panicked)?;
            if let (TaskSnapshot::Ready(s), Some((task_id, image, record))) = (&snapshot, extras) {
                self.task_images
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(s.id().to_string(), image);
                self.environments
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(task_id, record);
            }
            for task_id in by_key.get(&key).into_iter().flatten() {
                if let TaskSnapshot::Failed(e) = &snapshot {
                    log(&format!("task {task_id}: {e}"));
                }
                task_snapshots.insert(task_id.clone(), snapshot.clone());
            }
        }
        Ok(task_snapshots)
    }

    /// A fork of the task's pristine state, handed to the rollout's user, ready for the
    /// agent's actions.
    pub async fn open(
        &self,
        task: &Task,
        snapshot: &Snapshot,
        seed: u64,
        limits: &RolloutsSection,
        role: Role,
    ) -> Result<LiveFork, End> {
        match Environment::of(task) {
            Environment::Suite(task) => self.open_in_template(task, snapshot, seed, limits, role).await,
            Environment::Harbor(task, harbor) => self.open_harbor(task, harbor, snapshot, seed, limits, role).await,
        }
    }

    /// After the agent's actions: the verdict into `row`.
    pub async fn finish(
        &self,
        live: LiveFork,
        task: &Task,
        snapshot: &Snapshot,
        answer: Option<String>,
        row: &mut Row,
    ) -> End {
        let started = Instant::now();
        let end = match Environment::of(task) {
            Environment::Suite(task) => self.score_suite_task(live, task, snapshot, answer, row).await,
            Environment::Harbor(task, harbor) => self.verify_harbor(live, task, harbor, snapshot, answer, row).await,
        };
        row.timings.score_ms = started.elapsed().as_secs_f64() * 1e3;
        end
    }

    /// A fork of the suite's template (or the task's child of it), the workspace listed: the
    /// baseline its artifacts are told apart from.
    async fn open_in_template(
        &self,
        task: &Task,
        snapshot: &Snapshot,
        seed: u64,
        limits: &RolloutsSection,
        role: Role,
    ) -> Result<LiveFork, End> {
        let mut env = self.image_env.clone();
        env.extend(limits.network.proxy_env());
        let egress = (!limits.network.is_empty()).then(|| self.egress_of(limits));
        env.extend(egress.as_ref().map(ca_env).unwrap_or_default());
        env.push(("FARM_TASK_ID".into(), task.id.clone()));
        let identity = ForkIdentity {
            env,
            ..ForkIdentity::new(seed)
        };
        tracing::Span::current().record("fork_id", identity.fork_id.as_str());
        tracing::debug!("forking the task's snapshot");
        let fork = self
            .fork_task(snapshot, task, identity)
            .await
            .map_err(|e| End::Fork(describe(&e)))?;
        if let Some(egress) = egress {
            // Only the rollout's own VM: scoring forks keep the default (nothing allowed).
            install_ca(&fork, &egress).await.map_err(|e| End::Setup(describe(&e)))?;
            fork.machine.set_network(egress);
        }
        let gauge = VmGauge::new(role);
        if !limits.runs_as_root() {
            if let Err(e) = fork.agent().handover(WORKSPACE, &limits.user).await {
                return Err(End::Setup(format!(
                    "handing the workspace to rollouts.user {:?}: {e}",
                    limits.user
                )));
            }
        }
        // The task's own workspace, before the agent acts: a listing that fails here is the
        // farm's or the task's.
        let baseline = scorers::artifacts::list_workspace(fork.agent())
            .await
            .map_err(|e| End::Setup(describe(&e)))?;
        let place = Place {
            workdir: WORKSPACE.into(),
            user: (!limits.runs_as_root()).then(|| limits.user.clone()),
            env: self.image_env.clone(),
        };
        Ok(LiveFork::new(fork, Arc::new(baseline), place, gauge))
    }

    /// A fork of a Harbor task's environment: the agent acts in the working folder as the
    /// task's user, with the network only when the task allows the internet (the suite's
    /// `rollouts.network` is what the internet means here).
    async fn open_harbor(
        &self,
        task: &Task,
        harbor: &HarborTask,
        snapshot: &Snapshot,
        seed: u64,
        limits: &RolloutsSection,
        role: Role,
    ) -> Result<LiveFork, End> {
        let image = self
            .task_images
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(snapshot.id())
            .cloned()
            .unwrap_or_default();
        let place = crate::harbor::place(harbor, &image);
        let online = harbor.allow_internet && !limits.network.is_empty();
        let mut env = place.env.clone();
        if online {
            env.extend(limits.network.proxy_env());
            env.extend(ca_env(&self.egress_of(limits)));
        }
        env.push(("FARM_TASK_ID".into(), task.id.clone()));
        let identity = ForkIdentity {
            env,
            ..ForkIdentity::new(seed)
        };
        tracing::Span::current().record("fork_id", identity.fork_id.as_str());
        let fork = self
            .fork(snapshot, identity)
            .await
            .map_err(|e| End::Fork(describe(&e)))?;
        if online {
            let egress = self.egress_of(limits);
            install_ca(&fork, &egress).await.map_err(|e| End::Setup(describe(&e)))?;
            fork.machine.set_network(egress);
        }
        Ok(LiveFork::new(fork, Arc::new(Vec::new()), place, VmGauge::new(role)))
    }

    /// The artifacts out of the rollout's VM, as untrusted data, then scored where the agent
    /// cannot reach. The rollout VM goes before a fresh scoring fork starts.
    async fn score_suite_task(
        &self,
        live: LiveFork,
        task: &Task,
        snapshot: &Snapshot,
        answer: Option<String>,
        row: &mut Row,
    ) -> End {
        let limits = scorers::ArtifactLimits::default();
        let fork = &live.fork;
        let mut collected = scorers::collect_artifacts(fork.agent(), live.baseline(), &limits).await;
        for _ in 0..3 {
            // The agent's processes may still have been killing the guest agent: wait for
            // the restarted one and ask again.
            if !matches!(
                collected,
                Err(scorers::ListingError::Agent(AgentError::AgentRestarted { .. }))
            ) {
                break;
            }
            let _ = fork.agent().wait_ready(Duration::from_secs(30)).await;
            collected = scorers::collect_artifacts(fork.agent(), live.baseline(), &limits).await;
        }
        let mut artifacts = match collected {
            Ok(a) => a,
            Err(scorers::ListingError::Agent(e)) => return End::NoArtifacts(fork.explain(&e)),
            // The agent left more files than a listing holds: what it deleted cannot be told,
            // and that is its doing.
            Err(e @ scorers::ListingError::TooManyFiles { .. }) => return End::NoArtifacts(e.to_string()),
        };
        artifacts.answer = answer;
        let (fork, gauge) = live.into_parts();
        row.note_vm(&fork, false);
        let (verdict, scoring_vm) = self.score(task, snapshot, Some((fork, gauge)), &artifacts).await;
        if let Some((start, reset_error)) = scoring_vm {
            row.note_start(start, reset_error, true);
        }
        record_verdict(row, verdict, &artifacts)
    }

    /// The task's own test.sh, where `[harbor] verify` says (the rollout's VM, or a fresh
    /// boot of its disk), then Harbor's logs and artifacts collected from that VM.
    async fn verify_harbor(
        &self,
        live: LiveFork,
        task: &Task,
        harbor: &HarborTask,
        snapshot: &Snapshot,
        answer: Option<String>,
        row: &mut Row,
    ) -> End {
        let run = scorers::harbor::VerifyRun {
            mode: self.config.harbor.verify,
            workdir: &live.place.workdir,
            env: &live.place.env,
            network: &self.config.harbor.verifier_network.allow,
            pass_threshold: self.config.scoring.pass_threshold,
        };
        let verify_and_collect = |machine| scorers::harbor::verify_and_collect(machine, task, harbor, &run);
        let mut logs = scorers::harbor::Logs::default();
        let verified = match run.mode {
            scorers::harbor::HarborVerify::Live => {
                let (verified, collected) = verify_and_collect(&live.fork.machine).await;
                logs = collected;
                verified
            }
            scorers::harbor::HarborVerify::FreshBoot => {
                // (Only the fork moves: its place stays borrowed by `run`.)
                let fork = live.fork;
                match snapshotter::boot_from_disk(&self.forker, snapshot, fork).await {
                    Ok(machine) => {
                        let (verified, collected) = verify_and_collect(&machine).await;
                        logs = collected;
                        verified
                    }
                    // The agent had root on that disk: a disk that no longer boots is its doing.
                    Err(e) if e.is_the_disks() => Ok(scorers::orchestrate::agent_failure(
                        format!("the disk the agent left did not boot: {}", describe(&e)),
                        run.mode.trust(),
                    )),
                    Err(e) => return End::Scoring(describe(&e)),
                }
            }
        };
        let mut verdict = match verified {
            Ok(verdict) => verdict,
            Err(e) => return End::Scoring(e.to_string()),
        };
        if !logs.files.is_empty() || !logs.notes.is_empty() {
            let folder = format!("artifacts/{}", row.artifacts_folder());
            verdict.details.harbor_logs = Some(logs.record(folder));
            row.attachments = logs
                .files
                .into_iter()
                .map(|f| crate::row::Attachment {
                    path: f.path,
                    bytes: f.bytes,
                })
                .collect();
        }
        let artifacts = scorers::Artifacts {
            answer,
            ..Default::default()
        };
        record_verdict(row, Ok(verdict), &artifacts)
    }
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
async fn task_snapshot(
    store: &SnapshotStore,
    forker: &Forker,
    template: &Snapshot,
    task: &Task,
) -> Result<Snapshot, snapshotter::ChildError> {
    let content = task_snapshot_content(task);
    let files: Vec<(String, Vec<u8>, u32)> = task
        .files
        .iter()
        .map(|f| (f.path.clone(), f.contents.clone(), f.mode))
        .collect();
    let spec = snapshotter::ChildSpec {
        label: &task.id,
        content: &content,
        files: &files,
        setup: &task.setup,
        workdir: WORKSPACE,
        setup_timeout: Duration::from_secs(900),
    };
    snapshotter::child_snapshot(store, forker, template, &spec).await
}
