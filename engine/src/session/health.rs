//! Whether a fork's VM is still there, and what it uses: read from the host (its QEMU's exit,
//! `/proc`, its disk overlay), never from the guest, which may be hung or hostile.

use super::{Session, Vm};

/// How a fork's VM went without being asked to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmGone {
    /// A limit's watchdog stopped it (its disk grew past its cap): why.
    Limit(String),
    /// Its QEMU exited: the status as the host saw it, and the signal if one ended it.
    Exited { status: String, signal: Option<i32> },
}

/// What a live fork's VM uses now, as the host measures its QEMU.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct VmUsage {
    /// Its QEMU's process id (a new VM, after a pause or a fresh fork, has another).
    pub pid: u32,
    /// CPU time its QEMU has used (user + system) since it started.
    pub cpu_seconds: f64,
    /// Resident memory of its QEMU.
    pub memory_bytes: u64,
    /// Of which only it holds and has written (what it costs beyond its snapshot).
    pub private_dirty_bytes: u64,
    /// Allocated bytes of its disk overlay (its writes since its snapshot).
    pub disk_bytes: u64,
    /// Bytes its guest sent out and received through farm's egress.
    pub network_bytes_out: u64,
    pub network_bytes_in: u64,
}

impl Session {
    /// Whether its VM has gone on its own (its QEMU exited, or a limit stopped it). Reaps an
    /// exited QEMU; None while paused, ended, or running.
    pub fn vm_gone(&mut self) -> Option<VmGone> {
        let Vm::Live(live) = &mut self.vm else { return None };
        let machine = &mut live.fork.machine;
        // A watchdog says why before it kills: its QEMU may not be reaped yet.
        if let Some(why) = machine.limit_violation() {
            return Some(VmGone::Limit(why));
        }
        let status = machine.exited()?;
        Some(VmGone::Exited {
            status,
            signal: machine.exit_signal(),
        })
    }

    /// What its VM uses now (None while paused or ended, or once its QEMU is gone).
    pub fn usage(&self) -> Option<VmUsage> {
        let Vm::Live(live) = &self.vm else { return None };
        let machine = &live.fork.machine;
        let pid = machine.pid();
        let ticks = vmm::memory::cpu_ticks(pid)?.saturating_sub(live.cpu_base_ticks);
        let memory = vmm::memory::ProcessMemory::of(pid).unwrap_or_default();
        let disk_bytes = std::fs::metadata(&machine.spec().disk)
            .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
            .unwrap_or(0);
        let (network_bytes_out, network_bytes_in) = machine.network_bytes();
        Some(VmUsage {
            pid,
            cpu_seconds: ticks as f64 / vmm::memory::ticks_per_second() as f64,
            memory_bytes: memory.rss,
            private_dirty_bytes: memory.private_dirty,
            disk_bytes,
            network_bytes_out,
            network_bytes_in,
        })
    }
}

/// Processes the host's out-of-memory killer has killed since boot: a QEMU found killed by
/// SIGKILL just after this rose was most likely one of them.
pub fn host_oom_kills() -> Option<u64> {
    vmm::memory::oom_kills()
}
