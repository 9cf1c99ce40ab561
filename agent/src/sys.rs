//! Thin wrappers over the system calls the agent needs that std does not offer: mounts, the
//! kernel RNG, the clock, the hostname, the loopback interface, fork and reaping.
//!
//! Every `unsafe` block of the agent lives here.

use std::ffi::CString;
use std::io;

fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{s:?} contains a NUL byte")))
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Mounts `fstype` at `target`; an already mounted target is not an error.
pub fn mount(source: &str, target: &str, fstype: &str, flags: libc::c_ulong, data: &str) -> io::Result<()> {
    let _ = std::fs::create_dir_all(target);
    let (source, target, fstype, data) = (cstring(source)?, cstring(target)?, cstring(fstype)?, cstring(data)?);
    // SAFETY: all pointers are valid NUL-terminated strings that outlive the call.
    let ret = unsafe { libc::mount(source.as_ptr(), target.as_ptr(), fstype.as_ptr(), flags, data.as_ptr().cast()) };
    match check(ret) {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(()),
        other => other,
    }
}

/// Adds entropy to the kernel RNG (credited) and forces a reseed of the CRNG, so every
/// fork of one snapshot draws different random numbers from here on.
pub fn add_entropy_and_reseed(entropy: &[u8]) -> io::Result<()> {
    use std::os::fd::AsRawFd;
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
    let words: Vec<u32> = info.chunks(4).map(|c| u32::from_ne_bytes(c.try_into().expect("4 bytes"))).collect();
    let random = std::fs::OpenOptions::new().write(true).open("/dev/urandom")?;
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
    let ts = libc::timespec {
        tv_sec: (unix_time_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (unix_time_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `ts` is a valid timespec on the stack.
    check(unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) })
}

pub fn set_hostname(name: &str) -> io::Result<()> {
    // SAFETY: the pointer and length describe `name`'s bytes.
    check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) })
}

/// Brings the loopback interface up so guest programs can use 127.0.0.1.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket(2) call; the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: an all-zero ifreq is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq naming "lo"; the ioctls read and write only it.
    let result = unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) < 0 {
            Err(io::Error::last_os_error())
        } else {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            check(libc::ioctl(fd, libc::SIOCSIFFLAGS, &req))
        }
    };
    // SAFETY: fd was returned by socket() above and is not used afterwards.
    unsafe { libc::close(fd) };
    result
}

pub enum Forked {
    Child,
    Parent(libc::pid_t),
}

/// fork(2). Only called while the process has a single thread.
pub fn fork() -> io::Result<Forked> {
    // SAFETY: the caller guarantees the process is single-threaded, so the child does not
    // inherit locks held by other threads.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid)),
    }
}

/// Waits for any child; returns its pid, or None when there is no child.
pub fn wait_any() -> Option<libc::pid_t> {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid >= 0 {
            return Some(pid);
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            _ => return None,
        }
    }
}

/// Sends SIGKILL to a whole process group.
pub fn kill_group(pgid: u32) {
    // SAFETY: plain kill(2); a stale group id only yields ESRCH.
    unsafe { libc::kill(-(pgid as libc::pid_t), libc::SIGKILL) };
}

pub fn sync_all() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// Seconds since boot (CLOCK_BOOTTIME).
pub fn uptime_secs() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Sets or clears O_NONBLOCK on an fd.
pub fn set_nonblocking(fd: std::os::fd::RawFd, nonblocking: bool) -> io::Result<()> {
    // SAFETY: fcntl on an fd the caller owns.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = if nonblocking { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
        check(libc::fcntl(fd, libc::F_SETFL, flags))
    }
}

/// poll(2) over the given fds; returns revents per fd.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<()> {
    // SAFETY: the pointer and length describe a valid slice of pollfd.
    let ret = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if ret < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

/// openat(2) returning an owned descriptor.
pub fn openat<P: ?Sized + nix::NixPath>(
    dir: Option<std::os::fd::BorrowedFd>,
    path: &P,
    flags: nix::fcntl::OFlag,
    mode: nix::sys::stat::Mode,
) -> nix::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
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
        // SAFETY: raw setresuid/kill system calls with integer arguments; they change the
        // credentials of this thread only, which exits right after restoring root.
        unsafe {
            let (uid, root) = (uid as libc::c_long, 0 as libc::c_long);
            if libc::syscall(libc::SYS_setresuid, uid, uid, root) == 0 {
                libc::syscall(libc::SYS_kill, -1 as libc::c_long, libc::SIGKILL as libc::c_long);
                libc::syscall(libc::SYS_setresuid, root, root, root);
            }
        }
    });
    let _ = killer.join();
}

/// Closes every descriptor from `first` up (close_range(2), or one by one where the kernel
/// lacks it).
pub fn close_from(first: u32) {
    // SAFETY: close_range takes integers; closing descriptors the caller no longer needs.
    let ret = unsafe { libc::syscall(libc::SYS_close_range, first as libc::c_long, u32::MAX as libc::c_long, 0 as libc::c_long) };
    if ret != 0 {
        for fd in first..4096 {
            // SAFETY: closing an fd number; EBADF for unused ones is harmless.
            unsafe { libc::close(fd as libc::c_int) };
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
    // calls setsid and setrlimit; it allocates nothing.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
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
    // SAFETY: the hook runs between fork and exec and only makes system calls (unshare,
    // mount, setgroups, setresgid, setresuid, setsid, setrlimit) with pointers to strings
    // made before the fork; it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(io::Error::last_os_error());
            }
            // Nothing done here reaches the namespace the rest of the VM lives in.
            if libc::mount(none.as_ptr(), root.as_ptr(), std::ptr::null(), libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::mount(workspace.as_ptr(), workspace.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) != 0 {
                return Err(io::Error::last_os_error());
            }
            let flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSYMFOLLOW | libc::MS_NODEV | libc::MS_NOSUID;
            if libc::mount(none.as_ptr(), workspace.as_ptr(), std::ptr::null(), flags, std::ptr::null()) != 0 {
                return Err(io::Error::last_os_error());
            }
            if uid != 0 {
                if libc::setgroups(0, std::ptr::null()) != 0 || libc::setresgid(gid, gid, gid) != 0 || libc::setresuid(uid, uid, uid) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                libc::setrlimit(libc::RLIMIT_CORE, &no_core);
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
        // SAFETY: raw setfsgid/setfsuid with integer arguments; they affect only this thread,
        // which is why the raw calls are used (glibc's wrappers behave the same but say less).
        unsafe {
            libc::syscall(libc::SYS_setfsgid, gid as libc::c_long);
            libc::syscall(libc::SYS_setfsuid, uid as libc::c_long);
        }
        FsUser(())
    }
}

impl Drop for FsUser {
    fn drop(&mut self) {
        // SAFETY: as in `assume`, back to root.
        unsafe {
            libc::syscall(libc::SYS_setfsuid, 0 as libc::c_long);
            libc::syscall(libc::SYS_setfsgid, 0 as libc::c_long);
        }
    }
}

/// Sends `bytes` on a unix socket with this process's standard input, output and error
/// attached (SCM_RIGHTS).
pub fn send_with_stdio(stream: &std::os::unix::net::UnixStream, bytes: &[u8]) -> io::Result<()> {
    send_with_fds(stream, bytes, &[0, 1, 2])
}

/// Sends `bytes` on a unix socket with `fds` attached (SCM_RIGHTS).
pub fn send_with_fds(stream: &std::os::unix::net::UnixStream, bytes: &[u8], fds: &[std::os::fd::RawFd]) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let control = [nix::sys::socket::ControlMessage::ScmRights(fds)];
    let sent = nix::sys::socket::sendmsg::<()>(stream.as_raw_fd(), &[io::IoSlice::new(bytes)], &control, nix::sys::socket::MsgFlags::empty(), None)?;
    if sent < bytes.len() {
        use std::io::Write;
        (&*stream).write_all(&bytes[sent..])?;
    }
    Ok(())
}
