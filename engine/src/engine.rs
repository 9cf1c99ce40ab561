//! What every rollout of one suite shares ([`Engine`]), and the stages before any rollout:
//! the template snapshot ([`Engine::start`]), the plan ([`Engine::plan`]) and the per-task
//! snapshots ([`Engine::prepare`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use datasets::{Task, WORKSPACE};
use sha2::{Digest, Sha256};
use snapshotter::{Fork, ForkIdentity, Forker, Snapshot, SnapshotStore};

use crate::config::{RolloutsSection, Suite, SuiteConfig};
use crate::host::Host;
pub use crate::host::{EngineError, HostChoices};
use crate::policy::Policy;

/// Why a fork of a task's pristine state could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ForkTaskError {
    #[error(transparent)]
    Fork(#[from] snapshotter::ForkError),
    #[error("writing the task's file {file} into the fork")]
    WriteFile {
        file: String,
        #[source]
        source: vmm::AgentError,
    },
}

pub use crate::errors::describe;

/// What every rollout of one suite shares: its template, forker, warm pool and settings.
pub struct Engine {
    pub suite_name: String,
    pub suite_digest: String,
    pub suite_seed: u64,
    pub run_id: String,
    pub config: SuiteConfig,
    /// The host core it is built on.
    pub host: Arc<Host>,
    /// The host's forker, with the suite's disk limit (`rollouts.max_disk_mib`).
    pub forker: Forker,
    pub store: SnapshotStore,
    pub template: Arc<Snapshot>,
    /// For a template image from a registry: what it resolved to at start.
    pub image_pulled: Option<images::registry::Pulled>,
    pub(crate) scoring: scorers::orchestrate::Plan,
    /// Scoring VMs that serve more checks (`[scoring] isolation = "sandbox"`), idle.
    pub(crate) scoring_vms: crate::idle_vms::IdleVms,
    /// Whether VMs are reused by a reset in place (`[rollouts] reuse`, resolved on this host).
    pub(crate) reuse: bool,
    /// Finished rollout and scoring VMs, reset in place when taken (`reuse`).
    pub(crate) reset_vms: crate::idle_vms::IdleVms,
    /// Warm forks of the template snapshot (rollout and scoring VMs of tasks that use it).
    pool: Option<(String, snapshotter::WarmPool)>,
    /// A converted image's `Env`, for every command of the rollouts' forks.
    pub(crate) image_env: Vec<(String, String)>,
    /// The image config of each Harbor task's environment snapshot, by snapshot id.
    pub(crate) task_images: std::sync::Mutex<HashMap<String, images::ImageConfig>>,
    /// What each Harbor task's environment was built from, by task id.
    pub environments: std::sync::Mutex<std::collections::BTreeMap<String, crate::harbor::EnvironmentRecord>>,
    /// The proxy policy of `rollouts.network` (rules resolved).
    pub(crate) egress: egress::Policy,
}

/// A task's snapshot, as far as it got.
#[derive(Debug, Clone)]
pub enum TaskSnapshot {
    /// Planned; not prepared yet.
    Pending,
    Ready(Arc<Snapshot>),
    /// It could not be made (a retry would not make it).
    Failed(String),
}

/// Each task's snapshot, by task id.
pub type TaskSnapshots = HashMap<String, TaskSnapshot>;

/// One planned rollout.
#[derive(Clone)]
pub struct Planned {
    pub task: Arc<Task>,
    pub sample: u32,
    pub seed: u64,
    pub snapshot: TaskSnapshot,
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
    /// Prepares the suite's template snapshot on `host` (built, or reused from its store),
    /// its harness zygote importing what `preload` says.
    pub async fn start(
        suite: &Suite,
        host: &Arc<Host>,
        run_id: &str,
        preload: scorers::zygote::Preload,
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<Engine, EngineError> {
        let mut config = suite.config.clone();
        // The rollouts' egress, with the rules' credentials read now: a missing one stops
        // the start, naming it.
        let egress = config
            .rollouts
            .network
            .policy(&format!("suite {} [rollouts.network]", config.suite.name))
            .map_err(EngineError::Egress)?;
        let mut forker = host.forker_limited(Some(config.rollouts.max_disk_mib << 20));
        let reuse = config.rollouts.reuse.resets(forker.vm.selective_reset);
        // A VM reused by a reset must have been forked resettable (its pool's too).
        forker.resettable |= reuse;
        let store = host.store.clone();
        let template = host
            .build_template(
                &config.template,
                &suite.dir,
                &config.suite.name,
                &scorers::zygote::template_extras(preload),
                progress,
            )
            .await
            .map_err(EngineError::Template)?;
        progress(&format!(
            "snapshot {}{}",
            template.snapshot.id(),
            if template.reused { " (reused)" } else { "" }
        ));
        let scoring = scorers::orchestrate::Plan {
            mode: config.scoring.mode,
            isolation: config.scoring.isolation,
            checks_per_vm: config.scoring.checks_per_vm,
            timeout: Duration::from_secs(config.scoring.timeout_secs),
            call_timeout: Duration::from_secs(config.scoring.call_timeout_secs),
            pass_threshold: config.scoring.pass_threshold,
            external: resolve_external(suite, &config.scoring.external),
        };
        let image_config = template
            .image_config
            .clone()
            .unwrap_or_else(|| images::config_of(&template.snapshot.manifest.image).unwrap_or_default());
        let image_env = image_config
            .env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        // `rollouts.user` unset: the image's User (a converted image's config), else root.
        if config.rollouts.user.is_empty() {
            config.rollouts.user = rollouts_user_of_image(&image_config.user, progress);
        }
        Ok(Engine {
            image_env,
            suite_name: config.suite.name.clone(),
            suite_digest: suite.digest.clone(),
            suite_seed: config.suite.seed,
            run_id: run_id.to_string(),
            config,
            host: host.clone(),
            forker,
            store,
            template: Arc::new(template.snapshot),
            image_pulled: template.pulled,
            task_images: Default::default(),
            environments: Default::default(),
            scoring,
            scoring_vms: Default::default(),
            reuse,
            reset_vms: Default::default(),
            pool: None,
            egress,
        })
    }

    /// Keeps `size` warm forks of the template ready (nothing when `size` is 0).
    pub(crate) fn start_pool(&mut self, size: usize) -> Result<(), EngineError> {
        if size == 0 {
            return Ok(());
        }
        let pool = self
            .host
            .start_pool(
                self.forker.clone(),
                &self.template,
                snapshotter::PoolSize::fixed(size),
                // A suite's commands are shell commands (the policy's) and `/bin/sh -c`
                // (checks): no argv path to warm.
                snapshotter::WarmUp::shell(&self.config.rollouts.warm_up),
            )
            .map_err(EngineError::Pool)?;
        self.pool = Some((self.template.id().to_string(), pool));
        Ok(())
    }

    /// Warm forks ready now.
    pub fn warm(&self) -> usize {
        self.pool.as_ref().map(|(_, p)| p.ready()).unwrap_or(0)
    }

    /// The rollouts of `tasks`: `samples` each (or as many as the policy has for a task),
    /// with the suite's seeds; their snapshots are still to be prepared.
    pub fn plan(&self, tasks: &[Arc<Task>], policy: &Arc<Policy>, samples: u32) -> Vec<Planned> {
        let mut planned = Vec::new();
        for task in tasks {
            for sample in 0..policy.samples_for(task, samples) {
                planned.push(Planned {
                    task: task.clone(),
                    sample,
                    seed: rollout_seed(self.suite_seed, &task.id, sample),
                    snapshot: TaskSnapshot::Pending,
                    policy: policy.clone(),
                    limits: self.config.rollouts.clone(),
                    served: None,
                });
            }
        }
        planned
    }

    /// A VM in `snapshot`'s state with `identity`: an idle one of that snapshot reset in
    /// place (`[rollouts] reuse`), else a fork, from the warm pool when it holds that
    /// snapshot. A reset that fails gives a fork that says so ([`snapshotter::Start`]).
    pub(crate) async fn fork(
        &self,
        snapshot: &Snapshot,
        identity: ForkIdentity,
    ) -> Result<Fork, snapshotter::ForkError> {
        let mut reset_error = None;
        if let Some((mut idle, _)) = self.reuse.then(|| self.reset_vms.take(snapshot.id())).flatten() {
            // It was stopped while idle (`recycle`).
            idle.machine.thaw();
            if std::env::var_os("FARM_TEST_LOSE_RESET_POINT").is_some() {
                // Tests of the fallback: the reset below then fails as a real one would.
                let _ = idle.machine.forget_reset_point().await;
            }
            match idle.reset(identity.clone()).await {
                Ok(_) => {
                    crate::metrics::get().vm_resets.with_label_values(&["reset"]).inc();
                    if let Some(max) = self.forker.max_disk_bytes {
                        idle.machine.limit_disk_growth(max);
                    }
                    return Ok(idle);
                }
                Err(e) => {
                    let why = crate::engine::describe(&e);
                    tracing::warn!(
                        snapshot = snapshot.id(),
                        "a reset in place failed, forking instead: {why}"
                    );
                    crate::metrics::get().vm_resets.with_label_values(&["failed"]).inc();
                    reset_error = Some(why);
                }
            }
        }
        let mut fork = match &self.pool {
            Some((id, pool)) if id == snapshot.id() => {
                let fork = pool.fork(identity).await?;
                crate::metrics::get().warm_pool_hits.inc();
                fork
            }
            _ => self.forker.fork(snapshot, identity).await?,
        };
        if reset_error.is_some() {
            fork.start = snapshotter::Start::ResetFailed;
            fork.reset_error = reset_error;
        }
        Ok(fork)
    }

    /// Drops the VMs kept for a reset (and the shared scoring VMs) idle for longer than
    /// `max`: `farm serve` calls it from its housekeeping.
    pub fn prune_idle(&self, max: Duration) {
        self.reset_vms.prune(max);
        self.scoring_vms.prune(max);
    }

    /// Gives back a VM that is done (a rollout's, a scoring VM after its check), to be reset
    /// in place by the next [`Engine::fork`] of its snapshot; dropped (its QEMU killed) when
    /// VMs are not reused or it cannot be reset.
    ///
    /// `of` is the snapshot the VM's user opened it on: a VM that is not a fork of it (a
    /// branch, a resumed pause) is dropped, as nothing would ever take it.
    pub fn recycle(&self, mut fork: Fork, of: &Snapshot) {
        // A VM stopped for a limit, or whose QEMU is gone, is not worth a reset that fails.
        let alive = fork.machine.limit_violation().is_none() && fork.machine.exited().is_none();
        if self.reuse && alive && fork.machine.resettable() && fork.snapshot_id == of.id() {
            // Whatever it was allowed, an idle VM reaches nothing and runs nothing (its
            // QEMU process is stopped) until it is taken and reset.
            fork.machine.set_network(egress::Policy::default());
            fork.machine.freeze();
            self.reset_vms.put(fork);
        }
    }

    /// A fork in the task's pristine state: a fork of its snapshot, with the task's files
    /// written in when the task has no snapshot of its own (a few small files are cheaper to
    /// write into each fork than a RAM file per task is to build and keep).
    pub(crate) async fn fork_task(
        &self,
        snapshot: &Snapshot,
        task: &Task,
        identity: ForkIdentity,
    ) -> Result<Fork, ForkTaskError> {
        let fork = self.fork(snapshot, identity).await?;
        write_task_files(&fork, task).await?;
        Ok(fork)
    }
}

/// The task's files, into a fork of the template (a task with a snapshot of its own has them
/// there already).
pub(crate) async fn write_task_files(fork: &Fork, task: &Task) -> Result<(), ForkTaskError> {
    if task.files_in_forks() {
        for file in &task.files {
            fork.agent()
                .write_file(&format!("{WORKSPACE}/{}", file.path), file.contents.clone(), file.mode)
                .await
                .map_err(|source| ForkTaskError::WriteFile {
                    file: file.path.clone(),
                    source,
                })?;
        }
    }
    Ok(())
}

/// The user rollouts run as when the suite names none: the image's `User`, or root when it
/// has none or one that is not a user name or `UID[:GID]` (said to `progress`).
fn rollouts_user_of_image(user: &str, progress: &(dyn Fn(&str) + Sync)) -> String {
    match user {
        "" => "root".into(),
        user if crate::config::valid_user(user) => user.to_string(),
        user => {
            progress(&format!(
                "the image's User {user:?} is not a user name or UID[:GID]; rollouts run as root (set rollouts.user)"
            ));
            "root".into()
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_fixed_by_base_task_and_sample() {
        assert_eq!(rollout_seed(0, "t", 0), rollout_seed(0, "t", 0));
        let distinct: std::collections::BTreeSet<u64> = [
            rollout_seed(0, "t", 0),
            rollout_seed(1, "t", 0),
            rollout_seed(0, "u", 0),
            rollout_seed(0, "t", 1),
        ]
        .into();
        assert_eq!(distinct.len(), 4);
    }
}
