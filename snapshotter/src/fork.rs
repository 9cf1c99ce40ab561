//! Forks: microVMs that resume a snapshot instead of booting.
//!
//! A fork maps the snapshot's RAM file `share=off` (MAP_PRIVATE, so its writes are private
//! copies), gets a fresh copy-on-write overlay on the snapshot's disk, loads the state file
//! with `-incoming`, resumes, and then takes a fresh identity (entropy, clock, hostname, seed)
//! before anything else runs. A [`crate::pool::WarmPool`] keeps VMs ready, so a fork does not pay
//! process start-up.

pub use crate::start::Start;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use farm_protocol::IdentityRequest;
use vmm::machine::{LaunchPlan, RunDir};
use vmm::qemu::RamBacking;
use vmm::{Machine, MachineError, VmSettings};

use crate::statefile;
use crate::store::{HostProfile, Snapshot, SnapshotError};

#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error("starting a fork of snapshot {snapshot} failed")]
    Machine {
        snapshot: String,
        #[source]
        source: MachineError,
    },
    #[error("fork of snapshot {snapshot} did not take its identity")]
    Identity {
        snapshot: String,
        #[source]
        source: vmm::AgentError,
    },
    #[error("copying the disk overlay for a fork failed")]
    Overlay(#[source] std::io::Error),
    #[error("copying the snapshot's memory for a build step's fork failed")]
    Memory(#[source] std::io::Error),
}

/// Who a fork is: set in the guest before any user command runs.
#[derive(Debug, Clone)]
pub struct ForkIdentity {
    /// Unique id of the fork (hostname `fork-<id>`, `FARM_FORK_ID`).
    pub fork_id: String,
    /// Per-rollout seed (`FARM_SEED`).
    pub seed: u64,
    /// More variables for every command of the fork.
    pub env: Vec<(String, String)>,
}

impl ForkIdentity {
    pub fn new(seed: u64) -> ForkIdentity {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        ForkIdentity {
            fork_id: format!("{}-{n}", std::process::id()),
            seed,
            env: Vec::new(),
        }
    }
}

/// Settings for starting forks on this host.
#[derive(Debug, Clone)]
pub struct Forker {
    pub vm: VmSettings,
    pub host: HostProfile,
    /// Kill a fork whose disk overlay grows past this many bytes.
    pub max_disk_bytes: Option<u64>,
    /// Make forks that can be reset in place ([`Fork::reset`]; `vmm/src/machine/reset.rs`):
    /// guest RAM mapped privately behind QEMU's back by the RAM shim, and the reset point
    /// taken in the fork's overlay before the guest runs (a few ms more per fork).
    pub resettable: bool,
}

impl Forker {
    pub fn new(vm: VmSettings) -> Result<Forker, MachineError> {
        let host = HostProfile {
            qemu_version: vmm::machine::qemu_version(&vm.qemu_binary)?,
            accel: vm.accel,
            cpu_model: vm.cpu_model.clone(),
        };
        Ok(Forker {
            vm,
            host,
            max_disk_bytes: None,
            resettable: false,
        })
    }

    /// VM settings matching a snapshot (its memory size and CPU count).
    fn settings_for(&self, snapshot: &Snapshot) -> VmSettings {
        VmSettings {
            memory_mib: snapshot.manifest.memory_mib,
            cpus: snapshot.manifest.cpus,
            ..self.vm.clone()
        }
    }

    /// Starts a QEMU that waits for the snapshot's state: the expensive part of a fork that
    /// can happen ahead of time.
    pub async fn prepare(&self, snapshot: &Snapshot) -> Result<Machine, ForkError> {
        let ram = RamBacking::private(snapshot.memory_path(), self.resettable);
        self.prepare_on(snapshot, ram).await
    }

    /// [`Forker::prepare`] with the guest's RAM in `ram`: the snapshot's memory file, private
    /// (a fork), or a writable copy of it, shared (a build step's fork, in `build_fork.rs`).
    pub(crate) async fn prepare_on(&self, snapshot: &Snapshot, ram: RamBacking) -> Result<Machine, ForkError> {
        let machine_err = |source| ForkError::Machine {
            snapshot: snapshot.id().to_string(),
            source,
        };
        let run_dir = RunDir::create(&self.vm.run_root).map_err(machine_err)?;
        // A fresh overlay is a copy of the empty one made with the snapshot (cheaper than
        // running qemu-img for each fork). The copy must be writable.
        let disk = run_dir.path().join("disk.qcow2");
        std::fs::copy(snapshot.overlay_template_path(), &disk).map_err(ForkError::Overlay)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&disk, std::fs::Permissions::from_mode(0o600)).map_err(ForkError::Overlay)?;
        let plan = LaunchPlan {
            kernel: None,
            disk,
            ram,
            incoming: true,
            max_disk_bytes: self.max_disk_bytes,
        };
        let mut machine = Machine::launch(&self.settings_for(snapshot), plan, run_dir)
            .await
            .map_err(machine_err)?;
        if let Some(max) = self.max_disk_bytes {
            machine.limit_disk_growth(max);
        }
        Ok(machine)
    }

    /// Forks `snapshot` so that it can be reset in place ([`Fork::reset`]), whatever
    /// [`Forker::resettable`] says.
    pub async fn fork_resettable(&self, snapshot: &Snapshot, identity: ForkIdentity) -> Result<Fork, ForkError> {
        Forker {
            resettable: true,
            ..self.clone()
        }
        .fork(snapshot, identity)
        .await
    }

    /// Forks `snapshot`: prepare, then resume.
    pub async fn fork(&self, snapshot: &Snapshot, identity: ForkIdentity) -> Result<Fork, ForkError> {
        snapshot.check_host(&self.host)?;
        snapshot.check_files()?;
        let machine = self.prepare(snapshot).await?;
        self.resume(machine, snapshot, identity).await
    }

    /// Loads the snapshot's state into a prepared machine, resumes it and applies the
    /// identity. The caller checked the snapshot (host and files) when it was opened.
    pub async fn resume(
        &self,
        machine: Machine,
        snapshot: &Snapshot,
        identity: ForkIdentity,
    ) -> Result<Fork, ForkError> {
        load_and_resume(&machine, snapshot).await?;
        apply_identity(machine, snapshot, identity).await
    }
}

/// Loads the snapshot's state and resumes (a resettable machine takes its reset point in
/// between).
pub(crate) async fn load_and_resume(machine: &Machine, snapshot: &Snapshot) -> Result<(), ForkError> {
    machine
        .load_state(&snapshot.state_path(), statefile::HEADER_BYTES)
        .await
        .map_err(|source| ForkError::Machine {
            snapshot: snapshot.id().to_string(),
            source,
        })
}

/// A round trip of the identity request longer than this sets the guest's clock again.
const CLOCK_ROUND_TRIP: Duration = Duration::from_millis(500);

fn host_time_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Gives a resumed machine its own entropy, clock, hostname and seed.
pub(crate) async fn apply_identity(
    machine: Machine,
    snapshot: &Snapshot,
    identity: ForkIdentity,
) -> Result<Fork, ForkError> {
    identify(&machine, snapshot.id(), &identity).await?;
    Ok(Fork {
        machine,
        snapshot_id: snapshot.id().to_string(),
        identity,
        start: Start::Fork,
        reset_error: None,
    })
}

/// [`apply_identity`] on a machine that stays where it is.
pub(crate) async fn identify(machine: &Machine, snapshot_id: &str, identity: &ForkIdentity) -> Result<(), ForkError> {
    let machine_err = |source| ForkError::Machine {
        snapshot: snapshot_id.to_string(),
        source,
    };
    let mut entropy = vec![0u8; 64];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut entropy))
        .map_err(|e| {
            machine_err(MachineError::Io {
                what: "reading host entropy".into(),
                source: e,
            })
        })?;
    let mut env: std::collections::BTreeMap<String, String> = identity.env.iter().cloned().collect();
    env.insert("FARM_SEED".into(), identity.seed.to_string());
    env.insert("FARM_FORK_ID".into(), identity.fork_id.clone());
    env.insert("FARM_SNAPSHOT_ID".into(), snapshot_id.to_string());
    let mut request = IdentityRequest {
        unix_time_ns: host_time_ns(),
        hostname: format!("fork-{}", identity.fork_id),
        env,
    };
    let identity_err = |source| ForkError::Identity {
        snapshot: snapshot_id.to_string(),
        source,
    };
    let mut sent = std::time::Instant::now();
    machine
        .agent()
        .set_identity(request.clone(), entropy)
        .await
        .map_err(identity_err)?;
    // The guest set the time the host read before sending. A guest slow to take its first
    // request (code not yet translated, on a loaded host) set a time already seconds old: it
    // is set again, now that the path is warm, until a round trip is short (the identity is
    // the same; no entropy the second time).
    for _ in 0..3 {
        if sent.elapsed() <= CLOCK_ROUND_TRIP {
            break;
        }
        request.unix_time_ns = host_time_ns();
        sent = std::time::Instant::now();
        machine
            .agent()
            .set_identity(request.clone(), Vec::new())
            .await
            .map_err(identity_err)?;
    }
    Ok(())
}

/// A running fork.
pub struct Fork {
    pub machine: Machine,
    pub snapshot_id: String,
    pub identity: ForkIdentity,
    /// How it came to be in its snapshot's state.
    pub start: Start,
    /// With [`Start::ResetFailed`]: why the reset it replaces failed.
    pub reset_error: Option<String>,
}

impl Fork {
    pub fn agent(&self) -> &vmm::AgentClient {
        self.machine.agent()
    }

    /// Puts a fork made by [`Forker::fork_resettable`] back to its snapshot, in the same QEMU
    /// process, then gives it `identity` as a new fork gets one. The fork is paused in
    /// between; `check` runs there (a test hashes guest RAM at that point).
    pub async fn reset_with<F, Fut>(&mut self, identity: ForkIdentity, check: F) -> Result<vmm::ResetTimings, ForkError>
    where
        F: FnOnce(u32) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let machine_err = |source| ForkError::Machine {
            snapshot: self.snapshot_id.clone(),
            source,
        };
        let timings = self.machine.reset_paused().await.map_err(machine_err)?;
        check(self.machine.pid()).await;
        self.machine.resume().await.map_err(|source| ForkError::Machine {
            snapshot: self.snapshot_id.clone(),
            source,
        })?;
        identify(&self.machine, &self.snapshot_id, &identity).await?;
        self.identity = identity;
        self.start = Start::Reset;
        self.reset_error = None;
        Ok(timings)
    }

    /// [`Fork::reset_with`] with nothing to check.
    pub async fn reset(&mut self, identity: ForkIdentity) -> Result<vmm::ResetTimings, ForkError> {
        self.reset_with(identity, |_| async {}).await
    }

    /// Turns an agent error into the most telling explanation: a resource limit that
    /// killed the fork, or the error itself.
    pub fn explain(&self, error: &vmm::AgentError) -> String {
        match self.machine.limit_violation() {
            Some(reason) => format!("fork killed: {reason}"),
            None => error.to_string(),
        }
    }
}

/// Why a fork's disk could not be booted afresh.
#[derive(Debug, thiserror::Error)]
pub enum BootFromDiskError {
    /// Stopping the fork or copying its disk failed: the farm's side.
    #[error("taking the fork's disk failed")]
    Disk(#[source] MachineError),
    #[error("copying the fork's disk failed")]
    Copy(#[source] std::io::Error),
    /// QEMU could not be started: the farm's side.
    #[error("starting the VM failed")]
    Launch(#[source] MachineError),
    /// QEMU ran but the guest never answered: the disk did not boot.
    #[error("the disk did not boot to a working agent")]
    NoAgent(#[source] MachineError),
    /// The booted guest's agent did not take its identity (clock, entropy, hostname).
    #[error("the booted disk's agent did not take its identity")]
    NoIdentity(#[source] ForkError),
}

impl BootFromDiskError {
    /// Whether the disk the fork left is to blame (it does not boot to an agent that works):
    /// after an agent's phase, that disk is the agent's doing.
    pub fn is_the_disks(&self) -> bool {
        matches!(self, BootFromDiskError::NoAgent(_) | BootFromDiskError::NoIdentity(_))
    }
}

/// A VM booted afresh (not resumed) from `fork`'s disk as it is now: its files, none of its
/// processes. The fork is stopped (QEMU flushes its disk) and its disk copied before it
/// goes; the new VM boots the kernel of `snapshot` on that copy.
///
/// A guest that already went (it reset, halted or panicked: QEMU runs with `-no-reboot`, so
/// any of these ends it) is not an error here: after the agent's phase that is the agent's
/// doing, and its disk is booted as it was left. Only a QEMU still running that refuses to
/// stop is the farm's failure.
pub async fn boot_from_disk(
    forker: &Forker,
    snapshot: &crate::store::Snapshot,
    mut fork: Fork,
) -> Result<Machine, BootFromDiskError> {
    let started = std::time::Instant::now();
    if let Err(e) = fork.agent().quiesce().await {
        // The agent's processes may have killed the guest agent; its writes then go as the
        // guest left them (whatever its page cache held is not on the disk).
        tracing::warn!("the rollout's guest did not sync its disk before it was taken: {e}");
    }
    tracing::debug!(secs = started.elapsed().as_secs_f64(), "boot from disk: quiesced");
    if let Err(e) = fork.machine.qmp("stop", None).await {
        // The monitor goes first when the guest ends QEMU: give the process a moment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let gone = loop {
            if let Some(status) = fork.machine.exited() {
                break Some(status);
            }
            if std::time::Instant::now() >= deadline {
                break None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        match gone {
            Some(status) => tracing::info!(
                "the rollout's guest had already ended ({status}) when its disk was taken; booting the disk as it was left"
            ),
            None => return Err(BootFromDiskError::Disk(e)),
        }
    }
    let settings = VmSettings {
        memory_mib: snapshot.manifest.memory_mib,
        cpus: snapshot.manifest.cpus,
        ..forker.vm.clone()
    };
    let run_dir = RunDir::create(&settings.run_root).map_err(BootFromDiskError::Launch)?;
    let disk = run_dir.path().join("disk.qcow2");
    std::fs::copy(&fork.machine.spec().disk, &disk).map_err(BootFromDiskError::Copy)?;
    let identity = fork.identity.clone();
    drop(fork);
    let plan = LaunchPlan {
        kernel: Some(snapshot.manifest.kernel.path.clone()),
        ram: RamBacking::shared(run_dir.path().join("memory")),
        disk,
        incoming: false,
        max_disk_bytes: forker.max_disk_bytes,
    };
    tracing::debug!(secs = started.elapsed().as_secs_f64(), "boot from disk: disk copied");
    let machine = Machine::launch(&settings, plan, run_dir)
        .await
        .map_err(BootFromDiskError::Launch)?;
    machine
        .wait_for_agent(settings.boot_timeout)
        .await
        .map_err(BootFromDiskError::NoAgent)?;
    tracing::debug!(secs = started.elapsed().as_secs_f64(), "boot from disk: booted");
    // A booted guest starts with the clock at 1970 and the kernel's own entropy: it takes the
    // rollout's identity (with the host's time and fresh entropy) as a fork does.
    let booted = apply_identity(machine, snapshot, identity)
        .await
        .map_err(BootFromDiskError::NoIdentity)?;
    Ok(booted.machine)
}
