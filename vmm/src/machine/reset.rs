//! Reset in place: a running fork put back exactly where it started, in the same QEMU
//! process, instead of a new process per fork.
//!
//! A resettable machine ([`RamBacking::resettable`](crate::qemu::RamBacking)) has three
//! parts to put back, and each goes back by its own mechanism:
//! - **guest RAM**: the snapshot's file is mapped privately, so everything the guest wrote
//!   is a private page of QEMU's. The RAM shim drops them all (`MADV_DONTNEED`) when asked on
//!   the reset channel; the mapping then reads the file again, byte for byte;
//! - **CPU and device state, and the disk**: an internal snapshot in the fork's own qcow2
//!   overlay, taken once right after the snapshot's state was loaded (before the guest ran),
//!   holds the device state (RAM stays out: QEMU takes the RAM for shared, and
//!   `x-ignore-shared` is on) and the overlay's clusters at that moment. QMP
//!   `snapshot-load` resets every device, reverts the overlay and loads the state. Loading
//!   the CPU state makes QEMU throw away all translated code (`cpu_common_post_load`), so
//!   no code translated from a page the reset changed can run;
//! - **the host's channels**: the agent's and the network port's sockets are replaced by
//!   new ones (QMP `chardev-change`), so no byte the guest wrote before the reset can reach
//!   the host after it, and every connection the guest had through its network port is gone.
//!
//! The order matters: new channels (QEMU swaps them only while the guest runs), stop, RAM,
//! the device state, then the new channels drained of what the guest wrote in between.

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::migration::{ignore_shared, IGNORE_SHARED};
use super::{io_err, to_tokio, Machine, MachineError};
use crate::agent::{AgentClient, DEFAULT_MAX_RESPONSE_BYTES};
use crate::qemu::DISK_NODE;

/// The internal snapshot a reset returns to, in the fork's own overlay.
const RESET_TAG: &str = "farm-reset";

/// Where the time of one reset went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ResetTimings {
    /// QMP `stop` and the three new channels.
    pub stop_and_channels: Duration,
    /// Dropping the private RAM pages (in the RAM shim).
    pub ram: Duration,
    /// QMP `snapshot-load`: device reset, disk revert, device state.
    pub devices: Duration,
}

impl Machine {
    /// Whether this machine can be reset in place.
    pub fn resettable(&self) -> bool {
        self.reset.is_some()
    }

    /// Takes the point [`Machine::reset_paused`] returns to. Call it on a machine that has
    /// just loaded its snapshot's state and has not run yet.
    pub async fn mark_reset_point(&self) -> Result<(), MachineError> {
        if self.reset.is_none() {
            return Err(not_resettable());
        }
        self.run_snapshot_job("snapshot-save").await
    }

    /// Stops the whole QEMU process (`SIGSTOP`): an idle VM kept for a reset runs nothing,
    /// neither the guest nor anything its last user left in it, until [`Machine::thaw`].
    pub fn freeze(&self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid() as i32),
            nix::sys::signal::Signal::SIGSTOP,
        );
    }

    /// Lets a frozen QEMU process go on (`SIGCONT`).
    pub fn thaw(&self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid() as i32),
            nix::sys::signal::Signal::SIGCONT,
        );
    }

    /// Deletes the reset point, so that the next reset fails (for tests of what a failed
    /// reset leads to: `FARM_TEST_LOSE_RESET_POINT` in the engine).
    pub async fn forget_reset_point(&self) -> Result<(), MachineError> {
        if self.reset.is_none() {
            return Err(not_resettable());
        }
        self.run_snapshot_job("snapshot-delete").await
    }

    /// Puts the guest back to its reset point and leaves it paused; [`Machine::resume`]
    /// continues it. The agent client and the guest connector are new afterwards: clones of
    /// the old ones fail (the channel closed).
    pub async fn reset_paused(&mut self) -> Result<ResetTimings, MachineError> {
        let Some(channel) = self.reset.as_ref() else {
            return Err(not_resettable());
        };
        let channel = channel.clone();
        let started = Instant::now();
        // QEMU swaps a virtio-serial port's backend only while the guest runs (a stopped
        // VM's ports have no handlers), so the new sockets go in first, and whatever the
        // guest writes to them before it stops is drained after the load.
        let status = self.qmp("query-status", None).await?;
        if status.get("running").and_then(|r| r.as_bool()) != Some(true) {
            self.resume().await?;
        }
        let (agent_host, agent_child) = UnixStream::pair().map_err(io_err("creating the agent socket pair"))?;
        let (net_host, net_child) = UnixStream::pair().map_err(io_err("creating the network socket pair"))?;
        // The console too: its log is the next user's, not a record of the last one's.
        let (console_host, console_child) = UnixStream::pair().map_err(io_err("creating the console socket pair"))?;
        // Each descriptor goes alone (it travels with its command's bytes); the swaps and the
        // stop then go together (a refused swap fails the reset, with the VM stopped all the
        // same).
        let mut commands = Vec::new();
        for (id, socket) in [("agent", agent_child), ("net", net_child), ("console", console_child)] {
            let name = format!("farm-{id}");
            self.pass_fd(&name, socket.into()).await?;
            commands.push(("chardev-change", Some(chardev_socket(id, &name))));
        }
        commands.push(("stop", None));
        self.qmp_all(&commands).await?;
        let stop_and_channels = started.elapsed();
        let ram_started = Instant::now();
        if !self.spec.selective_reset {
            // A patched QEMU does this itself in `snapshot-load`, after it has read which
            // pages are private.
            drop_private_pages(&channel).await?;
        }
        let ram = ram_started.elapsed();
        let devices_started = Instant::now();
        self.run_snapshot_job("snapshot-load").await?;
        let devices = devices_started.elapsed();
        // Nothing more can come from the guest: it is stopped, and the load reset every
        // device (data QEMU held for the sockets went with it).
        drain(&agent_host)?;
        drain(&net_host)?;
        drain(&console_host)?;
        // Its reader blocks on the socket (the drain left it non-blocking).
        console_host
            .set_nonblocking(false)
            .map_err(io_err("configuring the console socket"))?;
        // A new log file (the old reader writes to the old one, unlinked, until its socket
        // closes).
        let _ = std::fs::remove_file(&self.spec.console_log);
        crate::console::capture(console_host, self.spec.console_log.clone())
            .map_err(io_err("starting the console reader"))?;
        let (read, write) = to_tokio(agent_host, "agent")?.into_split();
        self.agent = AgentClient::new(read, write, DEFAULT_MAX_RESPONSE_BYTES);
        self.net_port =
            egress::spawn(net_host, self.network.clone()).map_err(io_err("starting the network port's server"))?;
        Ok(ResetTimings {
            stop_and_channels,
            ram,
            devices,
        })
    }

    /// Runs `snapshot-save`, `snapshot-load` or `snapshot-delete` of the reset point as a QMP
    /// job, waits for QEMU's event that it concluded, then reads its outcome and dismisses it
    /// (those two together: the outcome is read first, and a refused dismissal does not hide
    /// it).
    async fn run_snapshot_job(&self, command: &str) -> Result<(), MachineError> {
        let job = format!(
            "{command}-{}",
            self.next_job.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let mut arguments = json!({
            "job-id": job,
            "tag": RESET_TAG,
            "devices": [DISK_NODE],
        });
        if command != "snapshot-delete" {
            arguments["vmstate"] = json!(DISK_NODE);
        }
        // The state leaves the RAM out (QEMU takes it for shared), on the way in as on the way
        // out: a branch's migration turns the capability off in between, and a load without
        // it refuses the stream.
        // Not sent together: a refused capability must stop the job (a state with the RAM).
        self.qmp(IGNORE_SHARED, Some(ignore_shared(true))).await?;
        self.qmp(command, Some(arguments)).await?;
        let ours = |event: &serde_json::Value| {
            event.get("event").and_then(|e| e.as_str()) == Some("JOB_STATUS_CHANGE")
                && event.pointer("/data/id").and_then(|i| i.as_str()) == Some(job.as_str())
        };
        let concluded = |event: &serde_json::Value| {
            ours(event) && event.pointer("/data/status").and_then(|s| s.as_str()) == Some("concluded")
        };
        let waited = {
            let mut qmp = self.qmp.lock().await;
            // A wait cut off midway (here, or by a caller's own timeout) leaves the QMP
            // connection out of step, and every later command on it fails at once.
            let waited = tokio::time::timeout(Duration::from_secs(120), qmp.wait_event(concluded)).await;
            // The job's earlier events (created, running, ...) are of no more use.
            qmp.events.retain(|e| !ours(e));
            waited
        };
        let outcome = match waited {
            Err(_) => Err("did not finish within 120 s".to_string()),
            Ok(Err(source)) => {
                return Err(MachineError::Qmp {
                    what: format!("{command} (waiting for it to conclude)"),
                    source,
                })
            }
            Ok(Ok(_)) => {
                // The outcome is read before the dismissal, which cannot hide it.
                let mut answers = self
                    .qmp_each(&[("query-jobs", None), ("job-dismiss", Some(json!({ "id": job })))])
                    .await?;
                job_outcome(&answers.swap_remove(0)?, &job)
            }
        };
        outcome.map_err(|detail| MachineError::Migration {
            what: command.to_string(),
            detail,
        })
    }
}

/// QMP `chardev-change`'s arguments: the chardev `id` becomes a client socket on the
/// descriptor passed as `name`.
fn chardev_socket(id: &str, name: &str) -> serde_json::Value {
    json!({
        "id": id,
        "backend": { "type": "socket", "data": {
            "addr": { "type": "fd", "data": { "str": name } },
            "server": false,
        } },
    })
}

/// A concluded job's outcome in `query-jobs`' answer: its error, if it has one.
fn job_outcome(jobs: &serde_json::Value, job: &str) -> Result<(), String> {
    let ours = jobs
        .as_array()
        .and_then(|all| all.iter().find(|j| j.get("id").and_then(|v| v.as_str()) == Some(job)));
    match ours {
        None => Err(format!("QEMU has no job {job}")),
        Some(ours) => match ours.get("error").and_then(|e| e.as_str()) {
            Some(error) => Err(error.to_string()),
            None => Ok(()),
        },
    }
}

/// Reads and discards whatever is waiting on `socket`.
fn drain(socket: &UnixStream) -> Result<(), MachineError> {
    use std::io::Read;
    socket
        .set_nonblocking(true)
        .map_err(io_err("configuring a new channel socket"))?;
    let mut buffer = [0u8; 64 << 10];
    loop {
        match (&*socket).read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err("draining a new channel socket")(e)),
        }
    }
}

fn not_resettable() -> MachineError {
    MachineError::Migration {
        what: "reset".into(),
        detail: "this machine was not started resettable".into(),
    }
}

/// Asks the RAM shim to drop every private page of guest RAM, and waits for its answer.
async fn drop_private_pages(channel: &ResetChannel) -> Result<(), MachineError> {
    let mut stream = channel.0.lock().await;
    let failed = |detail: String| MachineError::Migration {
        what: "reset of guest RAM".into(),
        detail,
    };
    let exchange = async {
        stream.write_all(b"R").await?;
        let mut answer = [0u8; 1];
        stream.read_exact(&mut answer).await?;
        if answer[0] == b'K' {
            return Ok(None);
        }
        let mut errno = [0u8; 4];
        stream.read_exact(&mut errno).await?;
        Ok::<_, std::io::Error>(Some(i32::from_be_bytes(errno)))
    };
    match tokio::time::timeout(Duration::from_secs(30), exchange).await {
        Ok(Ok(None)) => Ok(()),
        Ok(Ok(Some(errno))) => Err(failed(format!(
            "the RAM shim could not drop the pages: {}",
            std::io::Error::from_raw_os_error(errno)
        ))),
        Ok(Err(e)) => Err(failed(format!("the RAM shim's channel failed: {e}"))),
        Err(_) => Err(failed("the RAM shim did not answer within 30 s".into())),
    }
}

/// The host's end of the RAM shim's reset channel.
#[derive(Clone)]
pub(super) struct ResetChannel(std::sync::Arc<tokio::sync::Mutex<tokio::net::UnixStream>>);

impl ResetChannel {
    pub(super) fn new(stream: UnixStream) -> Result<ResetChannel, MachineError> {
        Ok(ResetChannel(std::sync::Arc::new(tokio::sync::Mutex::new(to_tokio(
            stream, "reset",
        )?))))
    }
}
