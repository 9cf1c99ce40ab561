//! One microVM: a QEMU process, its QMP connection, its agent channel and its run folder.
//!
//! Two entry points share one private launch path, as forks need:
//! - [`Machine::boot`] boots a kernel and image from scratch and waits for the agent;
//! - [`Machine::launch`] with `incoming = true` starts a paused QEMU that waits for
//!   migration state; [`Machine::load_state`] then resumes a snapshot in it.
//!
//! [`Machine::save_state`] writes a state-only migration stream (guest RAM stays in the
//! shared memory file thanks to `x-ignore-shared`).
//!
//! A machine launched with resettable RAM takes a reset point ([`Machine::mark_reset_point`])
//! and goes back to it in the same process ([`Machine::reset_paused`], `reset.rs`).

use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::accel::{self, Accel};
use crate::agent::{AgentClient, AgentError, DEFAULT_MAX_RESPONSE_BYTES};
use crate::jail::{self, Confinement, VmCgroup, VmUser};
use crate::process::QemuProcess;
use crate::qemu::{MachineSpec, RamBacking, AGENT_FD, CONSOLE_FD, NET_FD, QMP_FD};
use crate::qmp::{Qmp, QmpError};

#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error(transparent)]
    Artifacts(#[from] crate::artifacts::ArtifactError),
    #[error(transparent)]
    Accel(#[from] accel::KvmUnusable),
    #[error(
        "{binary} not found: install the Debian package qemu-system-x86 (scripts/setup.sh does), or set FARM_QEMU"
    )]
    QemuNotFound { binary: String },
    #[error("qemu-img not found: install the Debian package qemu-utils (scripts/setup.sh does)")]
    QemuImgNotFound,
    #[error("{what} failed")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("creating the disk overlay failed: {0}")]
    Overlay(String),
    #[error("reading the disk's backing chain failed")]
    Chain(#[from] crate::qcow2::ChainError),
    #[error("QEMU exited early ({status}); its messages:\n{log}")]
    QemuExited { status: String, log: String },
    #[error("QMP {what} failed")]
    Qmp {
        what: String,
        #[source]
        source: QmpError,
    },
    #[error("the guest agent was not ready within {waited:?}; last lines of the serial console:\n{console}")]
    BootTimeout { waited: Duration, console: String },
    #[error("the guest went away before its agent was ready ({reason}); last lines of the serial console:\n{console}")]
    GuestDied { reason: String, console: String },
    #[error("migration {what} failed: {detail}")]
    Migration { what: String, detail: String },
    #[error(transparent)]
    Agent(#[from] AgentError),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> MachineError {
    let what = what.into();
    move |source| MachineError::Io { what, source }
}

/// A running (or paused) microVM.
pub struct Machine {
    agent: AgentClient,
    qmp: tokio::sync::Mutex<Qmp>,
    process: QemuProcess,
    /// The uid this QEMU runs as, held until it is gone (None: farm is not root).
    user: Option<VmUser>,
    /// Its cgroup, removed after it is gone (declared after `process`, so dropped after it).
    _cgroup: Option<VmCgroup>,
    /// Set when a resource watchdog killed the machine, with the reason.
    limit_violation: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    watchdog: Option<tokio::task::JoinHandle<()>>,
    network: egress::SharedPolicy,
    /// The network port's server (stopped with the machine), and the way to the guest's own
    /// services.
    net_port: egress::NetPort,
    /// The RAM shim's reset channel (resettable machines only).
    reset: Option<reset::ResetChannel>,
    /// Numbers QMP jobs.
    next_job: AtomicU64,
    /// The disk limit its process was started with (`RLIMIT_FSIZE` is fixed for a process's
    /// life): a pool gives a VM to a later user only when that user's limit is the same.
    launch_disk_limit: Option<u64>,
    spec: MachineSpec,
    run_dir: RunDir,
}

/// Where a machine's disk and RAM come from.
pub struct LaunchPlan {
    /// The kernel to boot; None when the machine will receive migration state.
    pub kernel: Option<PathBuf>,
    /// The qcow2 overlay this VM writes (already created).
    pub disk: PathBuf,
    pub ram: RamBacking,
    /// Wait for migration state instead of booting.
    pub incoming: bool,
    /// A limit on the bytes the disk overlay may reach (the QEMU's file size cap follows).
    pub max_disk_bytes: Option<u64>,
}

static VM_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The jail of one QEMU: its own uid (when farm is root), its cgroup (where the host has
/// cgroup v2), and the limits.
fn confine(
    spec: &MachineSpec,
    run_root: &Path,
    max_file_bytes: u64,
) -> Result<(Option<VmUser>, Option<VmCgroup>, Confinement), MachineError> {
    let user = if jail::running_as_root() {
        Some(VmUser::allocate(&run_root.join("uids")).map_err(io_err("allocating a uid for QEMU"))?)
    } else {
        None
    };
    let cgroup = match jail::cgroups() {
        jail::Cgroups::Available(parent) => {
            // Guest RAM, TCG's translation buffer and QEMU's own heap, with room to spare.
            let memory =
                (u64::from(spec.memory_mib) << 20) + (u64::from(spec.tcg_tb_size_mib.unwrap_or(0)) << 20) + (256 << 20);
            Some(
                VmCgroup::create(parent, &spec.name, memory, jail::MAX_PIDS)
                    .map_err(io_err("creating the VM's cgroup"))?,
            )
        }
        jail::Cgroups::Missing(_) => None,
    };
    let groups = match spec.accel {
        Accel::Kvm => jail::kvm_group().into_iter().collect::<Vec<u32>>(),
        Accel::Tcg => Vec::new(),
    };
    if spec.accel == Accel::Kvm && user.is_some() && groups.is_empty() && !jail::kvm_open_to_all() {
        return Err(MachineError::Io {
            what: "giving the jailed QEMU access to /dev/kvm".into(),
            source: std::io::Error::other(
                "/dev/kvm is open to root only; make it group-accessible (e.g. root:kvm, mode 0660, as Debian's udev rules do)",
            ),
        });
    }
    let confinement = Confinement {
        uid: user.as_ref().map(|u| u.uid),
        groups,
        max_file_bytes,
        cgroup_procs: cgroup.as_ref().map(VmCgroup::procs),
        ksm: spec.ksm,
    };
    Ok((user, cgroup, confinement))
}

/// Creates this QEMU's own RAM file, and gives the files it writes to its uid (when it has
/// one of its own).
fn prepare_writable_files(spec: &MachineSpec, own_ram: bool, user: Option<&VmUser>) -> Result<(), MachineError> {
    if own_ram && !spec.ram.path.exists() {
        std::fs::File::create(&spec.ram.path).map_err(io_err(format!("creating {}", spec.ram.path.display())))?;
    }
    if let Some(user) = user {
        // The files this QEMU writes become its own; everything else it only reads.
        let mut writable = vec![&spec.disk];
        if own_ram {
            writable.push(&spec.ram.path);
        }
        for path in writable {
            std::os::unix::fs::chown(path, Some(user.uid), Some(user.uid))
                .map_err(io_err(format!("giving {} to the VM's user", path.display())))?;
        }
    }
    Ok(())
}

/// The host's ends of a QEMU's channels (the console's is read by its own thread).
struct HostEnds {
    qmp: UnixStream,
    agent: UnixStream,
    net: UnixStream,
    /// The RAM shim's reset channel (resettable machines only).
    reset: Option<UnixStream>,
}

/// Starts QEMU for `spec` in its jail, its messages going to `qemu_log`: every channel and
/// every file it opens is passed as a descriptor, and the console is read into its log.
fn spawn_qemu(
    spec: &MachineSpec,
    qemu_log: &Path,
    confinement: Confinement,
) -> Result<(QemuProcess, HostEnds), MachineError> {
    let (qmp_host, qmp_child) = UnixStream::pair().map_err(io_err("creating the QMP socket pair"))?;
    let (agent_host, agent_child) = UnixStream::pair().map_err(io_err("creating the agent socket pair"))?;
    let (console_host, console_child) = UnixStream::pair().map_err(io_err("creating the console socket pair"))?;
    let (net_host, net_child) = UnixStream::pair().map_err(io_err("creating the network socket pair"))?;
    let log_file = std::fs::File::create(qemu_log).map_err(io_err(format!("creating {}", qemu_log.display())))?;
    let mut command = Command::new(&spec.qemu_binary);
    command
        .args(spec.args())
        .env_clear()
        .envs(spec.env())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file);
    let mut fds: Vec<(OwnedFd, i32)> = vec![
        (qmp_child.into(), QMP_FD),
        (agent_child.into(), AGENT_FD),
        (console_child.into(), CONSOLE_FD),
        (net_child.into(), NET_FD),
    ];
    for (path, number) in spec.files() {
        // O_PATH: QEMU reopens each file through /proc/self/fd with its own permissions;
        // the descriptor itself grants nothing.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(&path)
            .map_err(io_err(format!("opening {}", path.display())))?;
        fds.push((file.into(), number));
    }
    let reset = match spec.reset_fd() {
        Some(number) => {
            let (host, child) = UnixStream::pair().map_err(io_err("creating the reset socket pair"))?;
            fds.push((child.into(), number));
            Some(host)
        }
        None => None,
    };
    crate::console::capture(console_host, spec.console_log.clone()).map_err(io_err("starting the console reader"))?;
    let process = QemuProcess::spawn(command, fds, confinement)
        .map_err(io_err(format!("starting {}", spec.qemu_binary.display())))?;
    let host_ends = HostEnds {
        qmp: qmp_host,
        agent: agent_host,
        net: net_host,
        reset,
    };
    Ok((process, host_ends))
}

/// A socket end for the async runtime.
fn to_tokio(s: UnixStream, what: &str) -> Result<tokio::net::UnixStream, MachineError> {
    s.set_nonblocking(true)
        .map_err(io_err(format!("configuring the {what} socket")))?;
    tokio::net::UnixStream::from_std(s).map_err(io_err(format!("registering the {what} socket")))
}

/// QEMU's QMP greeting; when QEMU exits first, its messages say why.
async fn qmp_handshake(
    qmp_stream: tokio::net::UnixStream,
    process: &mut QemuProcess,
    qemu_log: &Path,
) -> Result<Qmp, MachineError> {
    match tokio::time::timeout(Duration::from_secs(30), Qmp::handshake(qmp_stream)).await {
        Ok(Ok(qmp)) => Ok(qmp),
        Ok(Err(e)) => {
            // Usually QEMU refused its command line; its stderr says why.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let status = process.try_exit_status().unwrap_or_else(|| "still running".into());
            Err(match e {
                QmpError::Closed => MachineError::QemuExited {
                    status,
                    log: tail(qemu_log, 20),
                },
                other => MachineError::Qmp {
                    what: "handshake".into(),
                    source: other,
                },
            })
        }
        Err(_) => Err(MachineError::QemuExited {
            status: "no QMP greeting within 30 s".into(),
            log: tail(qemu_log, 20),
        }),
    }
}

impl Machine {
    /// Boots `kernel` with a fresh copy-on-write overlay over the read-only raw `image` and
    /// waits for the guest agent.
    pub async fn boot(settings: &VmSettings, kernel: &Path, image: &Path) -> Result<Machine, MachineError> {
        let run_dir = RunDir::create(&settings.run_root)?;
        let disk = run_dir.path().join("disk.qcow2");
        create_overlay(image, "raw", &disk).await?;
        let ram = RamBacking::private(run_dir.path().join("memory"), false);
        let plan = LaunchPlan {
            kernel: Some(kernel.to_path_buf()),
            disk,
            ram,
            incoming: false,
            max_disk_bytes: None,
        };
        let machine = Machine::launch(settings, plan, run_dir).await?;
        machine.wait_for_agent(settings.boot_timeout).await?;
        Ok(machine)
    }

    /// Starts QEMU for `plan` in `run_dir` and connects QMP and the agent channel. A booting
    /// machine is not waited for; call [`Machine::wait_for_agent`].
    ///
    /// QEMU starts jailed: as a uid of its own when farm is root (the overlay, and a shared
    /// RAM file, are given to that uid; every other file stays root's), with every file passed
    /// as a descriptor, a scrubbed environment, seccomp, rlimits and, where the host has them,
    /// a cgroup.
    pub async fn launch(settings: &VmSettings, plan: LaunchPlan, run_dir: RunDir) -> Result<Machine, MachineError> {
        let disk_backing = crate::qcow2::backing_chain(&plan.disk)?;
        // A RAM file that exists already and is mapped privately is a snapshot's: read-only to
        // this QEMU, through the shim. One that does not exist yet is this VM's own.
        let own_ram = plan.ram.shared || !plan.ram.path.exists();
        let spec = MachineSpec {
            qemu_binary: settings.qemu_binary.clone(),
            name: format!(
                "farm-{}-{}",
                std::process::id(),
                VM_COUNTER.fetch_add(1, Ordering::Relaxed)
            ),
            accel: settings.accel,
            cpu_model: settings.cpu_model.clone(),
            cpus: settings.cpus,
            memory_mib: settings.memory_mib,
            kernel_cmdline: crate::qemu::host_kernel_cmdline(settings.accel),
            kernel: plan.kernel,
            disk: plan.disk,
            disk_backing,
            ram: plan.ram,
            ram_shim: (!own_ram).then(|| settings.ram_shim.clone()),
            console_log: run_dir.path().join("console.log"),
            tcg_tb_size_mib: settings.tcg_tb_size_mib,
            ksm: settings.ksm,
            incoming: plan.incoming,
            selective_reset: settings.selective_reset,
        };
        let ram_bytes = u64::from(spec.memory_mib) << 20;
        // The largest file QEMU writes: a template's RAM file, or the disk overlay.
        let max_file_bytes = match plan.max_disk_bytes {
            Some(disk) => disk + (256 << 20),
            None => settings.max_file_bytes,
        }
        .max(if own_ram { ram_bytes } else { 0 });
        let (user, cgroup, confinement) = confine(&spec, &settings.run_root, max_file_bytes)?;
        prepare_writable_files(&spec, own_ram, user.as_ref())?;
        let qemu_log = run_dir.path().join("qemu.log");
        let (mut process, host_ends) = spawn_qemu(&spec, &qemu_log, confinement)?;
        let qmp_stream = to_tokio(host_ends.qmp, "QMP")?;
        // The network port: everything refused until a policy says otherwise.
        let network: egress::SharedPolicy = Default::default();
        let net_port =
            egress::spawn(host_ends.net, network.clone()).map_err(io_err("starting the network port's server"))?;
        let (agent_read, agent_write) = to_tokio(host_ends.agent, "agent")?.into_split();
        let agent = AgentClient::new(agent_read, agent_write, DEFAULT_MAX_RESPONSE_BYTES);
        let reset = host_ends.reset.map(reset::ResetChannel::new).transpose()?;
        let qmp = qmp_handshake(qmp_stream, &mut process, &qemu_log).await?;
        Ok(Machine {
            agent,
            qmp: tokio::sync::Mutex::new(qmp),
            process,
            user,
            _cgroup: cgroup,
            limit_violation: Default::default(),
            watchdog: None,
            network,
            net_port,
            reset,
            next_job: AtomicU64::new(0),
            spec,
            run_dir,
            launch_disk_limit: plan.max_disk_bytes,
        })
    }

    /// What the guest may reach now.
    pub fn network(&self) -> egress::Policy {
        self.network.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Bytes the guest sent out and received through its network port so far.
    pub fn network_bytes(&self) -> (u64, u64) {
        self.net_port.bytes()
    }

    /// What opens connections to services of the guest's own, on its `127.0.0.1:PORT`,
    /// carried over the network port (the guest has no network device).
    pub fn guest_connector(&self) -> egress::GuestConnector {
        self.net_port.connector()
    }

    /// What the guest may reach from now on (see the `egress` crate); `Policy::default()`
    /// refuses everything. Connections the guest has open that `policy` would not open are
    /// cut.
    pub fn set_network(&self, policy: egress::Policy) {
        *self.network.lock().unwrap_or_else(|e| e.into_inner()) = policy;
        self.net_port.policy_changed();
    }

    /// Waits until the guest agent answers, reporting the console if it never does.
    pub async fn wait_for_agent(&self, timeout: Duration) -> Result<(), MachineError> {
        match self.agent.wait_ready(timeout).await {
            Ok(_) => Ok(()),
            Err(AgentError::Timeout { .. }) => Err(MachineError::BootTimeout {
                waited: timeout,
                console: tail(&self.spec.console_log, 25),
            }),
            Err(e) => {
                // Give QEMU a moment to finish writing the console before reading it.
                tokio::time::sleep(Duration::from_millis(100)).await;
                Err(MachineError::GuestDied {
                    reason: e.to_string(),
                    console: tail(&self.spec.console_log, 25),
                })
            }
        }
    }

    pub fn agent(&self) -> &AgentClient {
        &self.agent
    }

    pub fn spec(&self) -> &MachineSpec {
        &self.spec
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The uid QEMU runs as (None when farm is not root and QEMU runs as farm's own user).
    pub fn uid(&self) -> Option<u32> {
        self.user.as_ref().map(|u| u.uid)
    }

    pub fn run_dir(&self) -> &Path {
        self.run_dir.path()
    }

    pub fn console_tail(&self, lines: usize) -> String {
        tail(&self.spec.console_log, lines)
    }

    /// Runs a QMP command.
    pub async fn qmp(
        &self,
        command: &str,
        arguments: Option<serde_json::Value>,
    ) -> Result<serde_json::Value, MachineError> {
        let mut qmp = self.qmp.lock().await;
        qmp.execute(command, arguments)
            .await
            .map_err(|source| MachineError::Qmp {
                what: command.to_string(),
                source,
            })
    }

    /// Runs QMP commands sent together, one round trip for all
    /// ([`crate::qmp::Qmp::execute_all`]): each command's answer or refusal in its place.
    pub async fn qmp_each(
        &self,
        commands: &[(&str, Option<serde_json::Value>)],
    ) -> Result<Vec<Result<serde_json::Value, MachineError>>, MachineError> {
        let answers = {
            let mut qmp = self.qmp.lock().await;
            qmp.execute_all(commands).await
        };
        let qmp_error = |what: String| move |source| MachineError::Qmp { what, source };
        let names = commands.iter().map(|(c, _)| *c).collect::<Vec<_>>();
        let answers = answers.map_err(qmp_error(names.join(", ")))?;
        Ok(answers
            .into_iter()
            .zip(names)
            .map(|(answer, command)| answer.map_err(qmp_error(command.to_string())))
            .collect())
    }

    /// [`Machine::qmp_each`], the first refusal as the error (QEMU ran the others all the same).
    pub async fn qmp_all(
        &self,
        commands: &[(&str, Option<serde_json::Value>)],
    ) -> Result<Vec<serde_json::Value>, MachineError> {
        self.qmp_each(commands).await?.into_iter().collect()
    }

    /// Asks QEMU to quit and waits for it; kills it if it does not go within a second.
    pub async fn shutdown(mut self) {
        let quit = tokio::time::timeout(Duration::from_secs(1), self.qmp("quit", None)).await;
        if quit.is_ok() {
            for _ in 0..100 {
                if self.process.try_exit_status().is_some() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        self.process.kill();
    }

    /// Kills QEMU at once (the run folder goes when the machine is dropped).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Kills the machine if its disk overlay grows beyond `max_bytes` (checked a few times a
    /// second). The reason is then available from [`Machine::limit_violation`].
    pub fn limit_disk_growth(&mut self, max_bytes: u64) {
        let disk = self.spec.disk.clone();
        let pid = self.process.pid();
        let violation = self.limit_violation.clone();
        if let Some(old) = self.watchdog.take() {
            old.abort();
        }
        self.watchdog = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let Ok(meta) = std::fs::metadata(&disk) else { return };
                // Allocated bytes, not the apparent size: qcow2 files can be sparse.
                let used = std::os::unix::fs::MetadataExt::blocks(&meta) * 512;
                if used > max_bytes {
                    *violation.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!(
                        "the disk overlay grew to {} MiB, over the limit of {} MiB",
                        used >> 20,
                        max_bytes >> 20
                    ));
                    crate::process::kill_pid(pid);
                    return;
                }
            }
        }));
    }

    /// The disk limit its process was started with ([`LaunchPlan::max_disk_bytes`]).
    pub fn launch_disk_limit(&self) -> Option<u64> {
        self.launch_disk_limit
    }

    /// Stops watching the disk's growth ([`Machine::limit_disk_growth`]): the VM is going
    /// back to a pool, whose next user sets its own limit.
    pub fn lift_disk_limit(&mut self) {
        if let Some(old) = self.watchdog.take() {
            old.abort();
        }
    }

    /// Why a resource watchdog killed this machine, if it did.
    pub fn limit_violation(&self) -> Option<String> {
        self.limit_violation.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether QEMU has exited.
    pub fn exited(&mut self) -> Option<String> {
        self.process.try_exit_status()
    }

    /// The signal that ended QEMU, once [`Machine::exited`] saw it go.
    pub fn exit_signal(&self) -> Option<i32> {
        self.process.exit_signal()
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.abort();
        }
    }
}

mod host;
mod migration;
mod reset;

pub use host::{create_overlay, default_run_root, find_qemu, qemu_version, system_qemu, tail, RunDir, VmSettings};
pub use reset::ResetTimings;
