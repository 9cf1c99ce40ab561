//! Live forks: a rollout's, a session's or a sandbox's VM, opened on the task's pristine
//! state ([`Engine::open`]) or an environment's, stepped ([`Engine::act`]), branched
//! (`branch`) and finished ([`Engine::finish`]: artifacts out as untrusted data, then
//! [`Engine::score`]).

use std::sync::Arc;
use std::time::Duration;

use datasets::Task;
use farm_protocol::FileEntry;
use snapshotter::{Fork, ForkIdentity, Forker, Snapshot, SnapshotStore};
use vmm::AgentError;

use crate::action::{run_action, Submitted};
use crate::config::{Action, RolloutsSection, ScoringMode};
use crate::engine::Engine;
use crate::harbor::Place;
use crate::metrics::{Role, VmGauge};
use crate::row::Step;

/// Why a session could not be branched.
#[derive(Debug, thiserror::Error)]
pub enum BranchError {
    #[error("snapshotting the session")]
    Snapshot(#[source] snapshotter::BuildError),
    #[error("forking the branch")]
    Fork(#[source] snapshotter::ForkError),
}

impl Engine {
    /// The proxy policy for a rollout's `limits.network`: the suite's, rules resolved at start
    /// (requests cannot change the network).
    pub(crate) fn egress_of(&self, limits: &RolloutsSection) -> egress::Policy {
        if limits.network == self.config.rollouts.network {
            self.egress.clone()
        } else {
            egress::Policy {
                allow: limits.network.allow.clone(),
                ..Default::default()
            }
        }
    }

    /// Runs one action. Ok: the step and a submitted answer. Err: the VM died or stopped
    /// answering during the action.
    pub async fn act(
        &self,
        live: &LiveFork,
        action: &Action,
        index: u32,
        limits: &RolloutsSection,
    ) -> Result<(Step, Submitted), (Step, String)> {
        run_action(&live.fork, action, index, limits, &live.place).await
    }

    /// Scores a rollout where the agent cannot reach (`scorers::orchestrate`). Errors are
    /// environment errors. With it, how the scoring VM started, when a VM of its own was
    /// started for it (not a shared scoring VM).
    ///
    /// With `[rollouts] reuse` on, the rollout's VM is given back before its tests need a
    /// VM, and the scoring VM is that VM reset in place: exactly the task's snapshot again.
    pub(crate) async fn score(
        &self,
        task: &Task,
        snapshot: &Snapshot,
        rollout_fork: Option<(Fork, VmGauge)>,
        artifacts: &scorers::Artifacts,
    ) -> (
        Result<scorers::Verdict, scorers::orchestrate::ScoreError>,
        Option<(snapshotter::Start, Option<String>)>,
    ) {
        let scoring_vm_gauge = std::sync::Mutex::new(None);
        let scoring_vm = &scoring_vm_gauge;
        let started = std::sync::Mutex::new(None);
        let started_ref = &started;
        let shares = self.scoring.shares_vms(task) && !self.scoring_vms.is_unshareable(snapshot.id());
        // The scoring VM's own seed: the checkers' `FARM_SEED`, which the rollout never saw.
        let vm = |seed: u64| async move {
            let vm = if shares {
                self.shared_scoring_vm(snapshot, task, seed).await?
            } else {
                scorers::orchestrate::ScoringVm {
                    fork: self.fresh_scoring_vm(snapshot, task, seed, true).await?,
                    shared: None,
                }
            };
            if vm.shared.is_none() {
                // A VM of this check's own (not a shared one): how it started goes in the row.
                *started_ref.lock().expect("not poisoned") = Some((vm.fork.start, vm.fork.reset_error.clone()));
            }
            *scoring_vm.lock().expect("not poisoned") = Some(VmGauge::new(Role::Scoring));
            Ok::<_, ScoringVmError>(vm)
        };
        let (mut fork, mut gauge) = rollout_fork.unzip();
        if self.scoring.mode == ScoringMode::FreshFork {
            // The rollout's VM goes before the scoring fork starts: given back to be reset
            // (it may be the scoring VM), or dropped (QEMU killed).
            gauge = None;
            if let Some(rollout_vm) = fork.take() {
                // Only when a VM is about to be needed (the tests'); else it goes now.
                if task.has_tests() {
                    self.recycle(rollout_vm, snapshot);
                }
            }
        }
        let scored = scorers::orchestrate::score(&self.scoring, task, fork, artifacts, vm).await;
        drop(gauge);
        drop(scoring_vm_gauge);
        let started = started.into_inner().expect("not poisoned");
        let scored = match scored {
            Ok(scored) => scored,
            Err(e) => return (Err(e), started),
        };
        if let Some(used) = scored.vm {
            if used.shared {
                if used.ready {
                    self.scoring_vms
                        .give_back(snapshot.id(), used.fork, used.checks, self.scoring.checks_per_vm);
                }
            } else {
                self.recycle(used.fork, snapshot);
            }
        }
        (Ok(scored.verdict), started)
    }

    /// A fresh fork of the task's pristine state for its tests (`with_files`: the task's
    /// files written, as a fork of the template needs).
    async fn fresh_scoring_vm(
        &self,
        snapshot: &Snapshot,
        task: &Task,
        seed: u64,
        with_files: bool,
    ) -> Result<Fork, ScoringVmError> {
        let identity = ForkIdentity::new(seed);
        tracing::debug!(scoring_fork_id = %identity.fork_id, "forking the scoring VM");
        let forked = if with_files {
            self.fork_task(snapshot, task, identity).await
        } else {
            self.fork(snapshot, identity).await.map_err(Into::into)
        };
        let mut fork = forked.map_err(ScoringVmError::Fork)?;
        // Room for the whole artifact budget on top of the task's own limit: placing an
        // agent's files (which may have lived in a tmpfs of its rollout) never kills the
        // scoring VM.
        if let Some(limit) = self.forker.max_disk_bytes {
            fork.machine
                .limit_disk_growth(limit + scorers::ArtifactLimits::default().scoring_room());
        }
        Ok(fork)
    }

    /// A scoring VM that serves more checks: an idle one of this snapshot (its workspace
    /// emptied by the last reset, the task's files written again), or a fresh fork. A
    /// snapshot whose workspace is not empty in a fresh fork never shares (a reset empties
    /// the workspace): its checks keep fresh forks.
    async fn shared_scoring_vm(
        &self,
        snapshot: &Snapshot,
        task: &Task,
        seed: u64,
    ) -> Result<scorers::orchestrate::ScoringVm, ScoringVmError> {
        while let Some((fork, checks)) = self.scoring_vms.take(snapshot.id()) {
            match crate::engine::write_task_files(&fork, task).await {
                Ok(()) => {
                    return Ok(scorers::orchestrate::ScoringVm {
                        fork,
                        shared: Some(checks),
                    })
                }
                // That VM broke while idle (it is dropped); another, or a fresh one.
                Err(e) => tracing::warn!("an idle scoring VM was retired: {}", crate::engine::describe(&e)),
            }
        }
        let fork = self.fresh_scoring_vm(snapshot, task, seed, false).await?;
        let workspace = scorers::artifacts::list_workspace(fork.agent())
            .await
            .map_err(ScoringVmError::Listing)?;
        let shared = if workspace.is_empty() {
            Some(0)
        } else {
            tracing::info!(
                snapshot = snapshot.id(),
                "the snapshot's workspace is not empty: its checks keep fresh forks"
            );
            self.scoring_vms.mark_unshareable(snapshot.id());
            None
        };
        crate::engine::write_task_files(&fork, task)
            .await
            .map_err(ScoringVmError::Fork)?;
        Ok(scorers::orchestrate::ScoringVm { fork, shared })
    }
}

/// Why a rollout got no scoring VM (an environment error; its text carries every cause).
#[derive(Debug, thiserror::Error)]
enum ScoringVmError {
    #[error("{}", crate::engine::describe(.0))]
    Fork(crate::engine::ForkTaskError),
    #[error("listing the scoring VM's workspace: {}", crate::engine::describe(.0))]
    Listing(scorers::artifacts::ListingError),
}

/// A new live fork that continues from `live`'s state exactly: `live` is snapshotted (a
/// child of the snapshot it came from, `from` unless it is a branch itself, kept in `store`)
/// and the child forked by `forker`, reaching what `live` reaches. `live` goes on afterwards.
pub(crate) async fn branch(
    forker: &Forker,
    live: &LiveFork,
    from: &Arc<Snapshot>,
    store: &SnapshotStore,
    seed: u64,
    role: Role,
) -> Result<(LiveFork, Arc<Branch>), BranchError> {
    let parent: Arc<Snapshot> = match &live.origin {
        Some(b) => Arc::new(b.snapshot.clone()),
        None => from.clone(),
    };
    let child = snapshotter::snapshot_fork(store, forker, &parent, &live.fork, "branch", None, true)
        .await
        .map_err(BranchError::Snapshot)?;
    let branch = Arc::new(Branch {
        snapshot: child,
        store: store.clone(),
        parent: live.origin.clone(),
        folder: None,
        pin: None,
        keep: Default::default(),
    });
    let identity = ForkIdentity {
        env: live.fork.identity.env.clone(),
        ..ForkIdentity::new(seed)
    };
    let fork = forker
        .fork(&branch.snapshot, identity)
        .await
        .map_err(BranchError::Fork)?;
    fork.machine.set_network(live.fork.machine.network());
    Ok((
        LiveFork::from_parts(
            fork,
            live.baseline.clone(),
            Some(branch.clone()),
            live.place.clone(),
            VmGauge::new(role),
        ),
        branch,
    ))
}

/// A running fork a rollout or a session acts in.
pub struct LiveFork {
    pub fork: Fork,
    /// The workspace as the task left it.
    baseline: Arc<Vec<FileEntry>>,
    /// The branch snapshot this fork came from (None: the task's snapshot).
    origin: Option<Arc<Branch>>,
    /// Where and as whom its actions run.
    pub place: Place,
    /// Its QEMU's CPU time when it was opened, in clock ticks: a VM reset from an earlier
    /// user's (a pool's) counts only what this user ran.
    pub(crate) cpu_base_ticks: u64,
    _gauge: VmGauge,
}

impl LiveFork {
    /// A fork opened on a task's pristine state.
    pub(crate) fn new(fork: Fork, baseline: Arc<Vec<FileEntry>>, place: Place, gauge: VmGauge) -> LiveFork {
        LiveFork::from_parts(fork, baseline, None, place, gauge)
    }

    /// The fork and its gauge, for a scoring that takes the VM.
    pub(crate) fn into_parts(self) -> (Fork, VmGauge) {
        (self.fork, self._gauge)
    }
}

/// Where a guest finds farm's egress CA (request rules with HTTPS hosts): the CA alone, and
/// the system bundle with it.
const CA_FILE: &str = "/etc/farm/egress-ca.pem";
const CA_BUNDLE: &str = "/etc/farm/ca-bundle.pem";

/// The variables that point TLS clients at the bundle with farm's CA (when the rules have one).
pub(crate) fn ca_env(egress: &egress::Policy) -> Vec<(String, String)> {
    if egress.rules.ca().is_none() {
        return Vec::new();
    }
    let mut env: Vec<(String, String)> = [
        "REQUESTS_CA_BUNDLE",
        "SSL_CERT_FILE",
        "PIP_CERT",
        "GIT_SSL_CAINFO",
        "CURL_CA_BUNDLE",
    ]
    .iter()
    .map(|k| (k.to_string(), CA_BUNDLE.to_string()))
    .collect();
    env.push(("NODE_EXTRA_CA_CERTS".into(), CA_FILE.into()));
    env
}

/// Why farm's egress CA could not be installed in a guest.
#[derive(Debug, thiserror::Error)]
pub enum CaInstallError {
    #[error("installing farm's egress CA")]
    Agent(#[from] AgentError),
    #[error("installing farm's egress CA failed: {0}")]
    Script(String),
}

/// Installs the rules' CA in the guest: `/etc/farm/egress-ca.pem`, appended to the system
/// bundle, a bundle of both at `/etc/farm/ca-bundle.pem`, and git's `http.sslCAInfo`.
pub(crate) async fn install_ca(fork: &Fork, egress: &egress::Policy) -> Result<(), CaInstallError> {
    let Some(ca) = egress.rules.ca() else { return Ok(()) };
    let agent = fork.agent();
    agent.write_file(CA_FILE, ca.pem().as_bytes().to_vec(), 0o644).await?;
    let script = format!(
        "b=/etc/ssl/certs/ca-certificates.crt; if [ -f $b ]; then cat $b {CA_FILE} > {CA_BUNDLE} && cat {CA_FILE} >> $b; else cp {CA_FILE} {CA_BUNDLE}; fi; \
         chmod 644 {CA_BUNDLE}; if command -v git >/dev/null 2>&1; then git config --system http.sslCAInfo {CA_BUNDLE}; fi"
    );
    let mut options = vmm::ExecOptions::argv(&["/bin/sh", "-c", &script]);
    options.timeout = Some(Duration::from_secs(30));
    let out = agent.exec(options).await?;
    if out.result.exit_code != Some(0) {
        return Err(CaInstallError::Script(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    Ok(())
}

impl LiveFork {
    pub(crate) fn from_parts(
        fork: Fork,
        baseline: Arc<Vec<FileEntry>>,
        origin: Option<Arc<Branch>>,
        place: Place,
        gauge: VmGauge,
    ) -> LiveFork {
        let cpu_base_ticks = vmm::memory::cpu_ticks(fork.machine.pid()).unwrap_or(0);
        LiveFork {
            fork,
            baseline,
            origin,
            place,
            cpu_base_ticks,
            _gauge: gauge,
        }
    }

    /// The snapshot this fork came from, when it is not the task's (a branch, a paused state).
    pub fn origin(&self) -> Option<&Arc<Branch>> {
        self.origin.as_ref()
    }

    /// The workspace as the task left it.
    pub(crate) fn baseline(&self) -> &[FileEntry] {
        &self.baseline
    }
}

/// A session's snapshot taken for a branch (or a paused session's state); removed from its
/// store once no fork or later branch needs it (a child's disk is backed by its parent's, so
/// children keep parents).
pub struct Branch {
    pub snapshot: Snapshot,
    store: SnapshotStore,
    parent: Option<Arc<Branch>>,
    /// A folder removed with it (a paused fork's).
    folder: Option<std::path::PathBuf>,
    /// A pin on the base snapshot, dropped with it: (the base's store, the holder).
    pin: Option<(SnapshotStore, std::path::PathBuf)>,
    /// Left on disk when dropped (a paused session at shutdown, for the next start).
    keep: std::sync::atomic::AtomicBool,
}

impl Branch {
    pub(crate) fn holding(
        snapshot: Snapshot,
        store: SnapshotStore,
        folder: Option<std::path::PathBuf>,
        pin: Option<(SnapshotStore, std::path::PathBuf)>,
    ) -> Branch {
        Branch {
            snapshot,
            store,
            parent: None,
            folder,
            pin,
            keep: Default::default(),
        }
    }

    /// Whether it is a paused fork's state (kept in the pause's folder, removed with it).
    pub(crate) fn is_paused_state(&self) -> bool {
        self.folder.is_some()
    }

    /// Leaves the snapshot (and its folder and pin) on disk when the last holder drops it.
    pub(crate) fn keep(&self) {
        self.keep.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Branch {
    fn drop(&mut self) {
        if self.keep.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let _ = self.store.remove(self.snapshot.id());
        let _ = &self.parent;
        if let Some(folder) = &self.folder {
            let _ = std::fs::remove_dir_all(folder);
        }
        if let Some((store, holder)) = &self.pin {
            store.unpin(holder);
        }
    }
}
