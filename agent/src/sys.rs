//! Thin wrappers over the system calls the agent needs that std does not offer: mounts, the
//! kernel RNG, the clock, the hostname, the loopback interface, fork and reaping.
//!
//! `nix` makes the calls wherever it has them. Raw `libc` remains only where nix cannot be
//! used: ioctls nix lacks, system calls it lacks or wraps with a different meaning, and the
//! hooks that run between fork and exec where a nix call would allocate. Every `unsafe`
//! block of the agent lives here.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::mount::MsFlags;
use nix::sys::signal::Signal;
use nix::unistd::{Gid, Pid, Uid};

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Mounts `fstype` at `target`; an already mounted target is not an error.
pub fn mount(source: &str, target: &str, fstype: &str, flags: MsFlags, data: &str) -> io::Result<()> {
    let _ = std::fs::create_dir_all(target);
    match nix::mount::mount(Some(source), target, Some(fstype), flags, Some(data)) {
        Err(Errno::EBUSY) => Ok(()),
        other => Ok(other?),
    }
}

/// Adds entropy to the kernel RNG (credited) and forces a reseed of the CRNG, so every
/// fork of one snapshot draws different random numbers from here on.
pub fn add_entropy_and_reseed(entropy: &[u8]) -> io::Result<()> {
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info: Vec<u8> = Vec::with_capacity(8 + entropy.len());
    info.extend_from_slice(&((entropy.len() * 8) as i32).to_ne_bytes());
    info.extend_from_slice(&(entropy.len() as i32).to_ne_bytes());
    info.extend_from_slice(entropy);
    // Pad to a multiple of 4 bytes, as the kernel reads __u32 words.
    while !info.len().is_multiple_of(4) {
        info.push(0);
    }
    // Keep the buffer 4-byte aligned for the kernel's struct view.
    let words: Vec<u32> = info
        .chunks(4)
        .map(|c| u32::from_ne_bytes(c.try_into().expect("4 bytes")))
        .collect();
    let random = std::fs::OpenOptions::new().write(true).open("/dev/urandom")?;
    // Raw ioctls: nix has no wrappers for the kernel RNG's requests.
    const RNDADDENTROPY: libc::c_ulong = 0x4008_5203; // _IOW('R', 0x03, int[2])
    const RNDRESEEDCRNG: libc::c_ulong = 0x5207; // _IO('R', 0x07)
                                                 // SAFETY: `words` holds a complete rand_pool_info whose buf_size matches the bytes that
                                                 // follow the header; the fd is open for the duration of the call.
    check(unsafe { libc::ioctl(random.as_raw_fd(), RNDADDENTROPY as _, words.as_ptr()) })?;
    // SAFETY: RNDRESEEDCRNG takes no argument.
    check(unsafe { libc::ioctl(random.as_raw_fd(), RNDRESEEDCRNG as _) })?;
    Ok(())
}

/// Steps the wall clock.
pub fn set_realtime(unix_time_ns: u64) -> io::Result<()> {
    let now = nix::sys::time::TimeSpec::from_duration(Duration::from_nanos(unix_time_ns));
    Ok(nix::time::clock_settime(nix::time::ClockId::CLOCK_REALTIME, now)?)
}

pub fn set_hostname(name: &str) -> io::Result<()> {
    Ok(nix::unistd::sethostname(name)?)
}

/// Brings the loopback interface up so guest programs can use 127.0.0.1.
pub fn loopback_up() -> io::Result<()> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    let socket = socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)?;
    // SAFETY: an all-zero ifreq is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // Raw ioctls: nix has no wrappers for an interface's flags.
    // SAFETY: `req` is a valid ifreq naming "lo"; the ioctls read and write only it, on a
    // socket that is open for the duration of the calls.
    unsafe {
        check(libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req))?;
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        check(libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &req))
    }
}

pub enum Forked {
    Child,
    Parent(libc::pid_t),
}

/// fork(2). Only called while the process has a single thread.
pub fn fork() -> io::Result<Forked> {
    // SAFETY: the caller guarantees the process is single-threaded, so the child does not
    // inherit locks held by other threads.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => Ok(Forked::Child),
        nix::unistd::ForkResult::Parent { child } => Ok(Forked::Parent(child.as_raw())),
    }
}

/// Waits for any child; returns its pid, or None when there is no child.
pub fn wait_any() -> Option<libc::pid_t> {
    loop {
        let mut status = 0;
        // Raw: nix's waitpid decodes the status into its Signal type and fails (EINVAL) for a
        // child killed by a real-time signal, after reaping it: PID 1 would lose that pid.
        // SAFETY: `status` is a valid out pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid >= 0 {
            return Some(pid);
        }
        match Errno::last() {
            Errno::EINTR => continue,
            _ => return None,
        }
    }
}

/// Sends SIGKILL to a whole process group.
pub fn kill_group(pgid: u32) {
    // A stale group id only yields ESRCH.
    let _ = nix::sys::signal::killpg(Pid::from_raw(pgid as libc::pid_t), Signal::SIGKILL);
}

/// A System V IPC object kind, as `/proc/sysvipc` names its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SysvIpc {
    SharedMemory,
    MessageQueue,
    Semaphores,
}

/// Removes one System V IPC object by its id (nix has no System V IPC calls). A shared
/// memory segment still attached goes once its last user detaches.
pub fn remove_sysv_ipc(kind: SysvIpc, id: i32) -> io::Result<()> {
    // SAFETY: IPC_RMID takes no buffer (a null pointer is what the manual pages give), and
    // the id is a plain integer: no memory of ours is read or written.
    check(unsafe {
        match kind {
            SysvIpc::SharedMemory => libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()),
            SysvIpc::MessageQueue => libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()),
            SysvIpc::Semaphores => libc::semctl(id, 0, libc::IPC_RMID),
        }
    })
}

pub fn sync_all() {
    nix::unistd::sync();
}

/// Seconds since boot (CLOCK_BOOTTIME).
pub fn uptime_secs() -> f64 {
    let since_boot = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(Duration::from)
        .unwrap_or_default();
    since_boot.as_secs_f64()
}

/// Sets or clears O_NONBLOCK on an fd.
pub fn set_nonblocking(fd: std::os::fd::RawFd, nonblocking: bool) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let mut flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
    flags.set(OFlag::O_NONBLOCK, nonblocking);
    fcntl(fd, FcntlArg::F_SETFL(flags))?;
    Ok(())
}

/// poll(2) over `(fd, events)` pairs until one is ready or `timeout` passes; returns, per
/// pair, whether anything (an event, an error, a hang-up) is pending on it. An interrupted
/// wait is one where nothing is ready.
pub fn poll(fds: &[(BorrowedFd<'_>, nix::poll::PollFlags)], timeout: Duration) -> io::Result<Vec<bool>> {
    use nix::poll::{PollFd, PollTimeout};
    let mut polled: Vec<PollFd> = fds.iter().map(|(fd, events)| PollFd::new(*fd, *events)).collect();
    let timeout = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
    match nix::poll::poll(&mut polled, timeout) {
        Ok(_) => Ok(polled
            .iter()
            .map(|p| p.revents().is_some_and(|r| !r.is_empty()))
            .collect()),
        Err(Errno::EINTR) => Ok(vec![false; fds.len()]),
        Err(e) => Err(e.into()),
    }
}

/// openat(2) returning an owned descriptor.
pub fn openat<P: ?Sized + nix::NixPath>(
    dir: Option<std::os::fd::BorrowedFd>,
    path: &P,
    flags: nix::fcntl::OFlag,
    mode: nix::sys::stat::Mode,
) -> nix::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let raw = nix::fcntl::openat(dir.map(|d| d.as_raw_fd()), path, flags, mode)?;
    // SAFETY: openat just returned this descriptor; nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) })
}

/// The names in a directory (including `.` and `..`), consuming the descriptor.
pub fn read_dir(dir: std::os::fd::OwnedFd) -> nix::Result<Vec<std::ffi::CString>> {
    use std::os::fd::IntoRawFd;
    let mut listing = nix::dir::Dir::from_fd(dir.into_raw_fd())?;
    let mut names = Vec::new();
    for entry in listing.iter() {
        names.push(entry?.file_name().to_owned());
    }
    Ok(names)
}

/// Kills every process of a user at once: a short-lived thread takes that uid as its real
/// and effective uid (credentials belong to each thread under Linux, and the raw system call
/// changes only the calling one; the saved uid stays 0 so it can return) and sends SIGKILL
/// to -1. The kernel delivers a kill(-1) under the task-list lock and restarts a fork that
/// races with it, so no process of the user slips through by forking. The agent itself is
/// never a target (kill(-1) spares the caller's process, and its uids are 0).
pub fn kill_all_of_user(uid: u32) {
    if uid == 0 {
        return;
    }
    let killer = std::thread::spawn(move || {
        let (uid, root) = (uid as libc::c_long, 0 as libc::c_long);
        // Raw system call: nix's setresuid is glibc's, which changes every thread of the
        // process; this one must change only the calling thread.
        // SAFETY: setresuid with integer arguments; it changes the credentials of this
        // thread only, which exits right after restoring root.
        if unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, root) } == 0 {
            let _ = nix::sys::signal::kill(Pid::from_raw(-1), Signal::SIGKILL);
            // SAFETY: as above, back to root.
            unsafe { libc::syscall(libc::SYS_setresuid, root, root, root) };
        }
    });
    let _ = killer.join();
}

/// Closes every descriptor from `first` up (close_range(2), or one by one where the kernel
/// lacks it).
pub fn close_from(first: u32) {
    // Raw system call: nix 0.29 has no close_range.
    // SAFETY: close_range takes integers; closing descriptors the caller no longer needs.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_long,
            u32::MAX as libc::c_long,
            0 as libc::c_long,
        )
    };
    if ret != 0 {
        for fd in first..4096 {
            // EBADF for unused numbers is harmless.
            let _ = nix::unistd::close(fd as libc::c_int);
        }
    }
}

/// Sends SIGKILL to one process.
pub fn kill_pid(pid: i32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
}

/// Makes a command start a new session (and so a process group of its own) with core dumps
/// off, between fork and exec.
pub fn new_session_on_exec(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook runs between fork and exec and only makes the async-signal-safe system
    // calls setsid and setrlimit (nix wrappers that take integers); it allocates nothing.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid()?;
            let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
            Ok(())
        });
    }
}

/// The folder the checker sees through its own view ([`checker_view_on_exec`]).
pub const CHECKER_VIEW_OF: &str = "/workspace";

/// Makes the command a checker that cannot be pointed anywhere by the agent's files: it
/// starts in a mount namespace of its own where `/workspace` is a bind mount (not recursive:
/// mounts below it are not carried over) with `nosymfollow`, `nodev` and `nosuid`. Symbolic
/// links there are never followed by anything the checker runs (`open`, `cat`, Python), and
/// device nodes cannot be opened; `farm-sandbox` returns the agent's code to the namespace of
/// PID 1, where the workspace is the ordinary one. Then, for a user other than root, the hook
/// drops to it (groups, gid, uid: after the mounts, which need root) and starts a session;
/// root keeps the process group std gives it.
///
/// Fails closed: a checker whose view cannot be set up does not start.
pub fn checker_view_on_exec(command: &mut std::process::Command, uid: u32, gid: u32) {
    use std::os::unix::process::CommandExt;
    let workspace = CString::new(CHECKER_VIEW_OF).expect("no NUL");
    let root = CString::new("/").expect("no NUL");
    let none = CString::new("none").expect("no NUL");
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    // SAFETY: the hook runs between fork and exec and only makes async-signal-safe system
    // calls (unshare, mount, setgroups, setresgid, setresuid, setsid, setrlimit) through nix
    // wrappers that take integers, or strings made before the fork as `&CStr` (which nix
    // passes on as they are: no copy, no allocation); it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            let no_string: Option<&std::ffi::CStr> = None;
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
            // Nothing done here reaches the namespace the rest of the VM lives in.
            nix::mount::mount(
                Some(none.as_c_str()),
                root.as_c_str(),
                no_string,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                no_string,
            )?;
            nix::mount::mount(
                Some(workspace.as_c_str()),
                workspace.as_c_str(),
                no_string,
                MsFlags::MS_BIND,
                no_string,
            )?;
            // nix 0.29 has no name for MS_NOSYMFOLLOW (Linux 5.10); libc's bit is passed as is.
            let flags = MsFlags::MS_REMOUNT
                | MsFlags::MS_BIND
                | MsFlags::from_bits_retain(libc::MS_NOSYMFOLLOW)
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOSUID;
            nix::mount::mount(Some(none.as_c_str()), workspace.as_c_str(), no_string, flags, no_string)?;
            if !uid.is_root() {
                nix::unistd::setgroups(&[])?;
                nix::unistd::setresgid(gid, gid, gid)?;
                nix::unistd::setresuid(uid, uid, uid)?;
                nix::unistd::setsid()?;
                let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
            }
            Ok(())
        });
    }
}

/// While alive, file system permission checks of the calling thread are made as another user
/// (setfsuid/setfsgid are per thread, and dropping the fsuid from 0 clears the thread's file
/// system capabilities). Dropping it restores root.
pub struct FsUser(());

impl FsUser {
    pub fn assume(uid: u32, gid: u32) -> FsUser {
        // glibc's setfsgid/setfsuid are plain system calls (unlike setresuid, they are not
        // applied to every thread), so nix's wrappers change only this thread.
        nix::unistd::setfsgid(Gid::from_raw(gid));
        nix::unistd::setfsuid(Uid::from_raw(uid));
        FsUser(())
    }
}

impl Drop for FsUser {
    fn drop(&mut self) {
        nix::unistd::setfsuid(Uid::from_raw(0));
        nix::unistd::setfsgid(Gid::from_raw(0));
    }
}

/// Sends `bytes` on a unix socket with this process's standard input, output and error
/// attached (SCM_RIGHTS).
pub fn send_with_stdio(stream: &std::os::unix::net::UnixStream, bytes: &[u8]) -> io::Result<()> {
    send_with_fds(stream, bytes, &[0, 1, 2])
}

/// Sends `bytes` on a unix socket with `fds` attached (SCM_RIGHTS).
pub fn send_with_fds(
    stream: &std::os::unix::net::UnixStream,
    bytes: &[u8],
    fds: &[std::os::fd::RawFd],
) -> io::Result<()> {
    let control = [nix::sys::socket::ControlMessage::ScmRights(fds)];
    let sent = nix::sys::socket::sendmsg::<()>(
        stream.as_raw_fd(),
        &[io::IoSlice::new(bytes)],
        &control,
        nix::sys::socket::MsgFlags::empty(),
        None,
    )?;
    if sent < bytes.len() {
        use std::io::Write;
        (&*stream).write_all(&bytes[sent..])?;
    }
    Ok(())
}

/// Sends `signal` to a whole process group.
pub fn signal_group(pgid: u32, signal: i32) -> io::Result<()> {
    let signal = Signal::try_from(signal).map_err(|_| io::Error::other(format!("{signal} is not a signal")))?;
    nix::sys::signal::killpg(Pid::from_raw(pgid as libc::pid_t), signal)?;
    Ok(())
}

/// A new terminal of `rows` x `cols`: its master and its other end, both close-on-exec.
pub fn open_terminal(rows: u16, cols: u16) -> io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    let size = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let ends = nix::pty::openpty(Some(&size), None)?;
    for fd in [&ends.master, &ends.slave] {
        nix::fcntl::fcntl(
            fd.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )?;
    }
    Ok((ends.master, ends.slave))
}

/// Gives a terminal's other end to a user (mode 0620), so programs that open it by name can.
pub fn give_terminal(slave: &std::os::fd::OwnedFd, uid: u32, gid: u32) -> io::Result<()> {
    nix::unistd::fchown(slave.as_raw_fd(), Some(uid.into()), Some(gid.into()))?;
    Ok(())
}

/// Resizes a terminal (through its master).
pub fn set_window_size(master: std::os::fd::RawFd, rows: u16, cols: u16) -> io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which points at a live one.
    check(unsafe { libc::ioctl(master, libc::TIOCSWINSZ, &size) })?;
    Ok(())
}

/// Makes a command start a session whose controlling terminal is its standard input (a
/// terminal's other end), with core dumps off, between fork and exec.
pub fn terminal_session_on_exec(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook runs between fork and exec and only makes the async-signal-safe system
    // calls setsid, ioctl(TIOCSCTTY) and setrlimit, with integer arguments; it allocates
    // nothing.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid()?;
            if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
            Ok(())
        });
    }
}

/// Raises this process's open-file limit, soft and hard, to at least `count` (as root).
pub fn raise_open_files(count: u64) -> io::Result<()> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    setrlimit(Resource::RLIMIT_NOFILE, soft.max(count), hard.max(count))?;
    Ok(())
}

/// A descriptor that becomes readable when process `pid` (a child of this one) ends.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new descriptor (close-on-exec) or
    // -1; a non-negative result is owned by nobody else.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A pipe whose ends are both non-blocking and close-on-exec: (read end, write end).
pub fn wake_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(
        nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK,
    )?)
}

/// Waits until one of `fds` is ready to read (or hung up): each entry's second half says
/// whether it is. An interrupted wait returns with none ready.
pub fn wait_readable(fds: &mut [(RawFd, bool)]) -> io::Result<()> {
    let mut polled: Vec<libc::pollfd> = fds
        .iter()
        .map(|&(fd, _)| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `polled` is a live array of `polled.len()` pollfd entries for the call.
    let n = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, -1) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(())
        } else {
            Err(e)
        };
    }
    for (entry, p) in fds.iter_mut().zip(&polled) {
        entry.1 = p.revents != 0;
    }
    Ok(())
}
