//! Starting QEMU processes so that none outlives its owner.
//!
//! Three layers make the guarantee:
//! 1. Every QEMU is started with `PR_SET_PDEATHSIG = SIGKILL`. The kernel sends it when the
//!    *thread* that forked the child exits, so all QEMUs are forked from one dedicated thread
//!    that lives as long as the process: any death of the owner (exit, panic, SIGTERM,
//!    SIGKILL) kills every QEMU.
//! 2. [`QemuProcess`] kills and reaps its child on drop (normal exit and errors).
//! 3. A registry of live children lets a signal handler or panic hook kill them all before
//!    the process exits ([`kill_all`]).
//!
//! QEMU also gets its own process group, so a Ctrl-C on the terminal reaches only farm, which
//! then shuts its VMs down in order.
//!
//! Between fork and exec the child also enters its jail ([`crate::jail`]): it joins its
//! cgroup, takes its rlimits, drops to its own uid (groups, then gid, then uid, every one of
//! the real, effective and saved ids), sets no_new_privs, and keeps no descriptor but the
//! ones passed. The death signal is set after the uid change, which would clear it.

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::jail::Confinement;

struct SpawnJob {
    command: Command,
    /// (fd in this process, fd number in the child)
    fds: Vec<(OwnedFd, i32)>,
    confinement: Confinement,
    reply: mpsc::Sender<io::Result<Child>>,
}

/// Descriptors a child can be given at most.
pub const MAX_PASSED_FDS: usize = 32;

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnJob>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("farm-qemu-spawner".into())
            .spawn(move || {
                // This thread never exits while the process lives (the sender is in a static),
                // which is what keeps PR_SET_PDEATHSIG from firing early.
                for job in rx {
                    let SpawnJob {
                        mut command,
                        fds,
                        confinement,
                        reply,
                    } = job;
                    let result = spawn_here(&mut command, &fds, &confinement);
                    drop(fds);
                    let _ = reply.send(result);
                }
            })
            .expect("starting the QEMU spawner thread");
        Mutex::new(tx)
    })
}

fn live_children() -> &'static Mutex<HashSet<u32>> {
    static LIVE: OnceLock<Mutex<HashSet<u32>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(HashSet::new()))
}

/// What the child needs to enter its jail, all made before the fork: the hook that runs
/// between fork and exec may not allocate.
struct ChildJail {
    parent: Pid,
    /// (fd in this process, fd number in the child)
    mapping: Vec<(i32, i32)>,
    /// The lowest descriptor number above the passed ones.
    first_free: i32,
    groups: Vec<nix::unistd::Gid>,
    uid: Option<u32>,
    max_file_bytes: u64,
    ksm: crate::Ksm,
    /// Opened here, written in the child before it drops root; closed when the command (which
    /// owns the hook) is dropped.
    cgroup: Option<std::fs::File>,
}

impl ChildJail {
    /// Everything the hook uses, built here in the parent.
    fn prepare(fds: &[(OwnedFd, i32)], confinement: &Confinement) -> io::Result<ChildJail> {
        use nix::unistd::{getpid, Gid};

        let parent = getpid();
        let mapping: Vec<(i32, i32)> = fds.iter().map(|(fd, target)| (fd.as_raw_fd(), *target)).collect();
        let first_free = mapping.iter().map(|(_, target)| *target).max().unwrap_or(2).max(2) + 1;
        let groups: Vec<Gid> = confinement.groups.iter().map(|g| Gid::from_raw(*g)).collect();
        let uid = confinement.uid;
        let max_file_bytes = confinement.max_file_bytes;
        let ksm = confinement.ksm;
        let cgroup = match &confinement.cgroup_procs {
            Some(path) => Some(std::fs::OpenOptions::new().write(true).open(path)?),
            None => None,
        };
        Ok(ChildJail {
            parent,
            mapping,
            first_free,
            groups,
            uid,
            max_file_bytes,
            ksm,
            cgroup,
        })
    }

    /// The child joins its cgroup, takes its limits (all but RLIMIT_NOFILE), drops to its
    /// own uid, sets same-page merging, no_new_privs and the death signal, and ends itself if
    /// the owner is already gone.
    ///
    /// # Safety
    ///
    /// Only in the child between fork and exec ([`spawn_here`]'s hook): it changes the
    /// calling process's ids and limits, and exits it.
    unsafe fn enter(&self) -> io::Result<()> {
        use nix::sys::resource::{setrlimit, Resource};
        use nix::sys::signal::{signal, SigHandler, Signal};
        use nix::unistd::{getppid, setgroups, setresgid, setresuid, Gid, Uid};

        let (cgroup, groups) = (&self.cgroup, &self.groups);
        let (parent, uid, max_file_bytes, ksm) = (self.parent, self.uid, self.max_file_bytes, self.ksm);
        // SAFETY: the caller runs this between fork and exec. It allocates nothing and makes
        // only async-signal-safe system calls: the nix functions used take integers,
        // descriptors or slices built before the fork and wrap one call each (write,
        // setrlimit, signal, setgroups, setresgid, setresuid, prctl, getppid); the raw ones
        // are prctl, personality and _exit.
        unsafe {
            if let Some(file) = &cgroup {
                // "0" moves the writing process into the group.
                if nix::unistd::write(file, b"0")? != 1 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
            }
            // RLIMIT_NOFILE comes last, after the passed descriptors are in place: in
            // pass_descriptors each is first duplicated above 64, which needs a free number
            // under the limit, and farm itself may hold thousands (one set per VM).
            setrlimit(Resource::RLIMIT_CORE, 0, 0)?;
            setrlimit(Resource::RLIMIT_FSIZE, max_file_bytes, max_file_bytes)?;
            // Past the file size cap a write fails (the guest sees an I/O error) instead of
            // killing QEMU.
            signal(Signal::SIGXFSZ, SigHandler::SigIgn)?;
            if let Some(uid) = uid {
                // The uid is this QEMU's alone, so its process limit bounds its threads.
                setrlimit(Resource::RLIMIT_NPROC, crate::jail::MAX_PIDS, crate::jail::MAX_PIDS)?;
                let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(uid));
                setgroups(groups)?;
                setresgid(gid, gid, gid)?;
                setresuid(uid, uid, uid)?;
            }
            // Both survive the exec (Linux 6.4+ keeps PR_SET_MEMORY_MERGE across it).
            if ksm != crate::Ksm::Off && libc::prctl(libc::PR_SET_MEMORY_MERGE, 1, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if ksm == crate::Ksm::OnNoAslr {
                let current = libc::personality(0xffff_ffff);
                if current == -1
                    || libc::personality(current as libc::c_ulong | libc::ADDR_NO_RANDOMIZE as libc::c_ulong) == -1
                {
                    return Err(io::Error::last_os_error());
                }
            }
            nix::sys::prctl::set_no_new_privs()?;
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The owner may have died between fork and prctl; then no signal would come.
            if getppid() != parent {
                // Raw: nix has no _exit, and std's exit runs atexit handlers, which is not
                // allowed between fork and exec.
                libc::_exit(1);
            }
            Ok(())
        }
    }

    /// Passes the descriptors: each to its number in the child, every other one closed at
    /// exec; then the open-file limit.
    ///
    /// # Safety
    ///
    /// Only in the child between fork and exec ([`spawn_here`]'s hook): it moves the calling
    /// process's descriptors and lowers its open-file limit.
    unsafe fn pass_descriptors(&self) -> io::Result<()> {
        use nix::fcntl::{fcntl, FcntlArg, FdFlag};
        use nix::sys::resource::{setrlimit, Resource};
        use nix::unistd::dup2;

        let (mapping, first_free) = (&self.mapping, self.first_free);
        // SAFETY: the caller runs this between fork and exec. It allocates nothing (`moved`
        // is on the stack) and makes only async-signal-safe system calls: fcntl, dup2 and
        // setrlimit through nix, close_range raw.
        unsafe {
            // Move each passed fd to its number: first above every target so a source that
            // happens to equal another's target is not overwritten, then into place.
            let mut moved = [0i32; MAX_PASSED_FDS];
            for (i, (source, _)) in mapping.iter().enumerate().take(MAX_PASSED_FDS) {
                moved[i] = fcntl(*source, FcntlArg::F_DUPFD_CLOEXEC(64))?;
            }
            for (i, (_, target)) in mapping.iter().enumerate().take(MAX_PASSED_FDS) {
                // dup2 clears FD_CLOEXEC on the new descriptor, so QEMU inherits it.
                dup2(moved[i], *target)?;
            }
            // Nothing else crosses: every descriptor above the passed ones is marked
            // close-on-exec (rather than closed now, so std's own pipe that reports a failed
            // exec keeps working until the exec). Raw: nix 0.29 has no close_range.
            const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
            if libc::syscall(
                libc::SYS_close_range,
                first_free as libc::c_uint,
                libc::c_uint::MAX,
                CLOSE_RANGE_CLOEXEC,
            ) != 0
            {
                for fd in first_free..65536 {
                    let _ = fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
                }
            }
            // Only now the open-file limit: every descriptor above the passed ones closes at
            // exec, so QEMU starts with a handful however many farm holds.
            setrlimit(
                Resource::RLIMIT_NOFILE,
                crate::jail::MAX_OPEN_FILES,
                crate::jail::MAX_OPEN_FILES,
            )?;
            Ok(())
        }
    }
}

fn spawn_here(command: &mut Command, fds: &[(OwnedFd, i32)], confinement: &Confinement) -> io::Result<Child> {
    use nix::unistd::{setpgid, Pid};

    let jail = ChildJail::prepare(fds, confinement)?;
    // SAFETY: the hook runs between fork and exec. It allocates nothing (`jail` was built
    // before the fork) and makes only async-signal-safe system calls: the nix functions used
    // take integers, descriptors or slices built before the fork and wrap one call each
    // (write, setrlimit, signal, setgroups, setresgid, setresuid, prctl, getppid, fcntl, dup2,
    // setpgid); the raw ones are prctl, personality, close_range and _exit.
    unsafe {
        command.pre_exec(move || {
            jail.enter()?;
            jail.pass_descriptors()?;
            setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
            Ok(())
        });
    }
    command.spawn()
}

/// A running QEMU. Dropping it kills and reaps the process.
#[derive(Debug)]
pub struct QemuProcess {
    child: Option<Child>,
    pid: u32,
    /// How it ended, once reaped by [`QemuProcess::try_exit_status`].
    exit_status: Option<String>,
    /// The signal that ended it, if one did (once reaped).
    exit_signal: Option<i32>,
}

impl QemuProcess {
    /// Starts `command` from the spawner thread, passing each `(fd, number)` to the child,
    /// confined as `confinement` says.
    pub fn spawn(command: Command, fds: Vec<(OwnedFd, i32)>, confinement: Confinement) -> io::Result<QemuProcess> {
        assert!(
            fds.len() <= MAX_PASSED_FDS,
            "at most {MAX_PASSED_FDS} fds are passed to a child"
        );
        let (reply, result) = mpsc::channel();
        spawner()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(SpawnJob {
                command,
                fds,
                confinement,
                reply,
            })
            .map_err(|_| io::Error::other("the QEMU spawner thread is gone"))?;
        let child = result
            .recv()
            .map_err(|_| io::Error::other("the QEMU spawner thread is gone"))??;
        let pid = child.id();
        live_children().lock().unwrap_or_else(|p| p.into_inner()).insert(pid);
        Ok(QemuProcess {
            child: Some(child),
            pid,
            exit_status: None,
            exit_signal: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process has exited (reaping it if so), with its status text; the same
    /// answer on every later call.
    pub fn try_exit_status(&mut self) -> Option<String> {
        if let Some(status) = &self.exit_status {
            return Some(status.clone());
        }
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.child = None;
                live_children()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&self.pid);
                self.exit_status = Some(status.to_string());
                self.exit_signal = std::os::unix::process::ExitStatusExt::signal(&status);
                self.exit_status.clone()
            }
            _ => None,
        }
    }

    /// The signal that ended it, once [`QemuProcess::try_exit_status`] reaped it.
    pub fn exit_signal(&self) -> Option<i32> {
        self.exit_signal
    }

    /// Kills the process and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            live_children()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&self.pid);
        }
    }

    /// Waits for the process to exit on its own (after `quit`), reaping it.
    pub fn wait(&mut self) -> io::Result<std::process::ExitStatus> {
        let status = self
            .child
            .as_mut()
            .map(|c| c.wait())
            .unwrap_or_else(|| Err(io::Error::other("already reaped")))?;
        self.child = None;
        live_children()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.pid);
        Ok(status)
    }
}

impl Drop for QemuProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Kills every QEMU this process started that is still alive. For signal handlers and
/// panic hooks; normal paths rely on [`QemuProcess`]'s drop.
pub fn kill_all() {
    let pids: Vec<u32> = live_children()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .copied()
        .collect();
    for pid in pids {
        // A child is removed from the registry as soon as it is reaped; only a reap racing
        // with this loop could leave a stale pid.
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
}

/// Kills one QEMU this process started, if it is still registered as alive.
pub fn kill_pid(pid: u32) {
    if live_children().lock().unwrap_or_else(|p| p.into_inner()).contains(&pid) {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
}

/// The QEMU processes this process started that are still alive.
pub fn live_pids() -> Vec<u32> {
    live_children()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .copied()
        .collect()
}

/// Descriptors farm holds per live VM (QMP, agent and network channels, console, pidfd, run
/// folder), with room to spare; measured at about 6.
pub const DESCRIPTORS_PER_VM: u64 = 10;
/// Host threads per live VM (QEMU's main loop, vCPU, I/O, RCU and worker threads).
pub const THREADS_PER_VM: u64 = 8;

/// The host limits that many VMs meet, as read now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostLimits {
    /// This process's hard open-file limit.
    pub open_files: u64,
    /// `kernel.threads-max`.
    pub threads_max: u64,
    /// `kernel.pid_max`.
    pub pid_max: u64,
    /// Tasks on the host now.
    pub tasks_now: u64,
    /// The `pids.max` of this process's cgroup, when one is set.
    pub cgroup_pids_max: Option<u64>,
}

impl HostLimits {
    pub fn probe() -> HostLimits {
        let read_u64 = |path: &str| {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
        };
        let open_files = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map(|(_, hard)| hard)
            .unwrap_or(1024);
        // /proc/loadavg: "0.00 0.01 0.05 1/234 5678": running/total tasks.
        let tasks_now = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|t| {
                t.split_whitespace()
                    .nth(3)
                    .and_then(|f| f.split('/').nth(1))
                    .and_then(|n| n.parse().ok())
            })
            .unwrap_or(0);
        let cgroup_pids_max = std::fs::read_to_string("/proc/self/cgroup").ok().and_then(|text| {
            text.lines().find_map(|line| {
                let mut parts = line.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                let base = if controllers.split(',').any(|c| c == "pids") {
                    "/sys/fs/cgroup/pids"
                } else if controllers.is_empty() {
                    "/sys/fs/cgroup"
                } else {
                    return None;
                };
                read_u64(&format!("{base}{path}/pids.max"))
            })
        });
        HostLimits {
            open_files,
            threads_max: read_u64("/proc/sys/kernel/threads-max").unwrap_or(u64::MAX),
            pid_max: read_u64("/proc/sys/kernel/pid_max").unwrap_or(u64::MAX),
            tasks_now,
            cgroup_pids_max,
        }
    }

    /// What stops `vms` VMs from running at once here, each with the setting that lifts it.
    pub fn problems(&self, vms: u64) -> Vec<String> {
        let mut out = Vec::new();
        let files = vms * DESCRIPTORS_PER_VM + 256;
        if self.open_files < files {
            out.push(format!(
                "{vms} VMs need about {files} open files and farm may open {} (its hard limit): raise it with `ulimit -Hn {files}` in the shell that starts farm, or LimitNOFILE={files} in its systemd unit",
                self.open_files
            ));
        }
        let tasks = self.tasks_now + vms * THREADS_PER_VM;
        if self.threads_max < tasks {
            out.push(format!(
                "{vms} VMs need about {} more threads and kernel.threads-max is {}: `sysctl -w kernel.threads-max={}`",
                vms * THREADS_PER_VM,
                self.threads_max,
                tasks * 2
            ));
        }
        if self.pid_max < tasks {
            out.push(format!(
                "{vms} VMs need about {} more process ids and kernel.pid_max is {}: `sysctl -w kernel.pid_max={}`",
                vms * THREADS_PER_VM,
                self.pid_max,
                (tasks * 2).min(4_194_304)
            ));
        }
        if let Some(max) = self.cgroup_pids_max {
            if max < vms * THREADS_PER_VM + 64 {
                out.push(format!("{vms} VMs need about {} tasks and farm's cgroup allows {max} (pids.max): raise it, or TasksMax= in farm's systemd unit", vms * THREADS_PER_VM + 64));
            }
        }
        out
    }
}

/// Raises this process's soft open-file limit to its hard limit. farm holds a few
/// descriptors per VM, so the usual soft limit of 1,024 would stop it near 160 VMs; the hard
/// limit is the operator's to set (`ulimit -Hn`, `LimitNOFILE=`). Returns the limit now in
/// force.
pub fn raise_open_file_limit() -> io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(io::Error::from)?;
    }
    Ok(hard.max(soft))
}

#[cfg(test)]
mod limits_tests {
    use super::*;

    #[test]
    fn each_limit_that_stops_many_vms_is_named_with_the_setting_that_lifts_it() {
        let roomy = HostLimits {
            open_files: 1 << 20,
            threads_max: 1 << 20,
            pid_max: 4_194_304,
            tasks_now: 300,
            cgroup_pids_max: None,
        };
        assert!(roomy.problems(1000).is_empty());
        let tight = HostLimits {
            open_files: 4096,
            threads_max: 6000,
            pid_max: 32768,
            tasks_now: 300,
            cgroup_pids_max: Some(4000),
        };
        let problems = tight.problems(1000);
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(
            problems[0].contains("ulimit -Hn 10256") && problems[0].contains("LimitNOFILE"),
            "{}",
            problems[0]
        );
        assert!(problems[1].contains("kernel.threads-max"), "{}", problems[1]);
        assert!(
            problems[2].contains("pids.max") && problems[2].contains("TasksMax"),
            "{}",
            problems[2]
        );
        assert!(tight.problems(100).is_empty(), "100 VMs fit");
    }
}
