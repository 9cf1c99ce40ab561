//! Running one command: spawn in its own process group (or session), as root or another user, feed stdin, collect capped output, enforce
//! the timeout on the whole process group.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use farm_protocol::{AgentError, ErrorKind, ExecRequest, ExecResult, Program};

use crate::sys;
use crate::users::{self, User};

/// How long output is still collected after the command exited, when a background process
/// it started keeps the pipes open.
const GRACE_AFTER_EXIT: Duration = Duration::from_millis(100);
/// Reads of a pipe per [`drain`] call: 1 MiB with the 64 KiB buffer, more than a pipe holds
/// by default.
const DRAIN_READS: usize = 16;

pub struct Output {
    pub result: ExecResult,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Output kept up to a cap; the rest is counted and dropped.
struct Capped {
    data: Vec<u8>,
    cap: usize,
    truncated: bool,
    open: bool,
}

impl Capped {
    fn new(cap: u64) -> Self {
        Capped {
            data: Vec::new(),
            cap: cap.min(usize::MAX as u64) as usize,
            truncated: false,
            open: true,
        }
    }

    fn take(&mut self, bytes: &[u8]) {
        let room = self.cap.saturating_sub(self.data.len());
        if bytes.len() > room {
            self.truncated = true;
        }
        self.data.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

/// A command to start, with everything resolved.
pub struct Launch<'a> {
    pub program: &'a Program,
    pub cwd: String,
    /// The whole environment of the command.
    pub env: Vec<(String, String)>,
    /// Run as this user (root: as the agent).
    pub user: User,
    pub timeout_ms: Option<u64>,
    pub stdout_cap: u64,
    pub stderr_cap: u64,
    /// A checker: it sees the workspace through a view that follows no link and opens no
    /// device ([`sys::checker_view_on_exec`]).
    pub checker_view: bool,
}

/// Runs an exec request: the agent's base environment, then the request's variables.
pub fn run(req: &ExecRequest, base_env: &[(String, String)], stdin: &[u8]) -> Result<Output, AgentError> {
    let user = match &req.user {
        None => User::ROOT,
        Some(spec) => users::resolve(spec).map_err(|e| AgentError {
            kind: ErrorKind::BadRequest,
            message: crate::describe(&e),
        })?,
    };
    let mut env: Vec<(String, String)> = base_env.to_vec();
    if let Some(home) = user.home.as_ref().filter(|_| !user.is_root()) {
        env.retain(|(k, _)| k != "HOME");
        env.push(("HOME".into(), home.clone()));
    }
    env.retain(|(k, _)| !req.env.contains_key(k));
    env.extend(req.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let launch = Launch {
        program: &req.program,
        cwd: req.cwd.clone().unwrap_or_else(default_cwd),
        env,
        user,
        timeout_ms: req.timeout_ms,
        stdout_cap: req.stdout_cap,
        stderr_cap: req.stderr_cap,
        checker_view: false,
    };
    run_launch(&launch, stdin).map(|(output, _)| output)
}

/// The command `launch` starts, ready to spawn (`look_up`: see [`command_for`]).
fn build(launch: &Launch, look_up: bool) -> Result<Command, AgentError> {
    let mut command = command_for(launch.program, &launch.env, look_up).map_err(|message| AgentError {
        kind: ErrorKind::BadRequest,
        message,
    })?;
    command
        .env_clear()
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&launch.cwd);
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if launch.checker_view {
        if launch.user.is_root() {
            command.process_group(0);
        }
        sys::checker_view_on_exec(&mut command, launch.user.uid, launch.user.gid);
    } else if launch.user.is_root() {
        // A process group of its own, so a timeout kills everything the command started. Set
        // through posix_spawn attributes (no pre_exec hook), which lets std spawn with vfork
        // semantics: much cheaper than fork in a freshly forked guest under TCG.
        command.process_group(0);
    } else {
        // Another user: std drops the supplementary groups, then the gid, then the uid; the
        // child then starts a session of its own (so a timeout reaches it as a group) with
        // core dumps off.
        command.uid(launch.user.uid).gid(launch.user.gid);
        sys::new_session_on_exec(&mut command);
    }
    Ok(command)
}

/// Runs a command to its end (or its deadline); returns its output and its process id,
/// which is also the id of its process group (and, for another user, of its session).
pub fn run_launch(launch: &Launch, stdin: &[u8]) -> Result<(Output, u32), AgentError> {
    // A checker's command is looked up in its own view of the files (its hook runs first).
    let look_up = launch.user.is_root() && !launch.checker_view;
    let cwd = &launch.cwd;
    let started = Instant::now();
    // What the agent found on the PATH failed to start (a missing `#!` interpreter, a noexec
    // mount, another architecture): std's own lookup then goes on as execvp would.
    let mut child = match build(launch, look_up)?.spawn() {
        Err(_) if look_up && matches!(launch.program, Program::Argv(_)) => build(launch, false)?.spawn(),
        spawned => spawned,
    }
    .map_err(|e| {
        let what = match launch.program {
            Program::Argv(argv) => format!("{:?}", argv[0]),
            Program::Shell(_) => "/bin/sh".to_string(),
        };
        AgentError {
            kind: ErrorKind::Spawn,
            message: format!("cannot start {what} in {cwd:?} as uid {}: {e}", launch.user.uid),
        }
    })?;
    let pid = child.id();
    let pipes = Pipes {
        stdin: child
            .stdin
            .take()
            .map(|p| std::fs::File::from(std::os::fd::OwnedFd::from(p))),
        stdout: std::fs::File::from(std::os::fd::OwnedFd::from(child.stdout.take().expect("piped"))),
        stderr: std::fs::File::from(std::os::fd::OwnedFd::from(child.stderr.take().expect("piped"))),
    };
    finish(&mut child, pipes, stdin, launch, started).map(|output| (output, pid))
}

/// The command that runs `program` (a shell script through `/bin/sh -c`). `env` is the
/// command's whole environment; with `look_up` (a command run as root, in the agent's view of
/// the files) a bare program name is
/// looked up on its `PATH` here, as `execvp` would, so that std can start it with
/// `posix_spawn` (vfork semantics): std falls back to a full `fork` of the agent for a name
/// it must look up on a `PATH` of the command's own, which costs a new guest process about
/// 10 ms more under TCG the first time. `argv[0]` stays the name given.
pub fn command_for(program: &Program, env: &[(String, String)], look_up: bool) -> Result<Command, String> {
    match program {
        Program::Argv(argv) => {
            let Some((program, args)) = argv.split_first() else {
                return Err("argv is empty".into());
            };
            let found = look_up.then(|| on_path(program, env)).flatten();
            let mut c = match found {
                Some(path) => {
                    let mut c = Command::new(path);
                    c.arg0(program);
                    c
                }
                None => Command::new(program),
            };
            c.args(args);
            Ok(c)
        }
        Program::Shell(script) => {
            let mut c = Command::new("/bin/sh");
            c.arg("-c").arg(script);
            Ok(c)
        }
    }
}

/// Where `execvp` finds the bare name `program` on `env`'s `PATH`: the first regular file
/// with an execute bit that starts as a binary or a script does (one without `#!`, which
/// `execvp` would hand to `/bin/sh`, is left to it, as is a `PATH` with an empty or relative
/// entry, which depends on the command's folder, or one under `/proc`, which depends on the
/// process that looks). None: std looks it up. The file is opened without blocking and
/// checked as opened (a FIFO swapped in holds nothing up). Should the path found fail to
/// start, the caller falls back to std's lookup, which goes on along the `PATH` as `execvp`.
fn on_path(program: &str, env: &[(String, String)]) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if program.is_empty() || program.contains('/') {
        return None;
    }
    let path = env.iter().rev().find(|(k, _)| k == "PATH").map(|(_, v)| v)?;
    for dir in path.split(':') {
        if !dir.starts_with('/') || dir == "/proc" || dir.starts_with("/proc/") {
            return None;
        }
        let candidate = std::path::Path::new(dir).join(program);
        let Ok(mut file) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits() | nix::fcntl::OFlag::O_NOCTTY.bits())
            .open(&candidate)
        else {
            continue;
        };
        let Ok(meta) = file.metadata() else { continue };
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            continue;
        }
        let mut head = [0u8; 4];
        let starts_known = file
            .read_exact(&mut head)
            .is_ok_and(|()| head == *b"\x7fELF" || head.starts_with(b"#!"));
        return starts_known.then_some(candidate);
    }
    None
}

/// A started command, as output collection sees it: a child process of the agent's, or a
/// check the harness zygote runs for it.
pub trait Running {
    /// The exit status, if the command has ended.
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>>;
    /// Waits for the exit status however long it takes.
    fn wait(&mut self) -> io::Result<ExitStatus>;
    /// Kills everything the command started.
    fn kill(&mut self);
}

impl Running for Child {
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        Child::try_wait(self)
    }

    fn wait(&mut self) -> io::Result<ExitStatus> {
        Child::wait(self)
    }

    fn kill(&mut self) {
        sys::kill_group(self.id());
    }
}

/// The agent's ends of a command's standard input, output and error.
pub struct Pipes {
    pub stdin: Option<std::fs::File>,
    pub stdout: std::fs::File,
    pub stderr: std::fs::File,
}

/// Feeds `stdin`, collects the output and waits for the command's end or its deadline
/// (then kills it).
pub fn finish(
    running: &mut dyn Running,
    pipes: Pipes,
    stdin: &[u8],
    launch: &Launch,
    started: Instant,
) -> Result<Output, AgentError> {
    let deadline = launch.timeout_ms.map(|ms| started + Duration::from_millis(ms));
    let (stdout, stderr, timed_out) = pump(running, pipes, stdin, launch, deadline).map_err(|e| AgentError {
        kind: ErrorKind::Internal,
        message: format!("collecting output failed: {e}"),
    })?;
    let status = wait(running, if timed_out { None } else { deadline });
    let (status, timed_out) = match status {
        Some(status) => (status, timed_out),
        None => {
            // Pipes closed but the process lives on past the deadline.
            running.kill();
            (
                running.wait().map_err(|e| AgentError {
                    kind: ErrorKind::Internal,
                    message: e.to_string(),
                })?,
                true,
            )
        }
    };
    let duration_us = started.elapsed().as_micros() as u64;
    Ok(Output {
        result: ExecResult {
            exit_code: status.code(),
            signal: status.signal(),
            timed_out,
            stdout_len: stdout.data.len() as u64,
            stderr_len: stderr.data.len() as u64,
            stdout_truncated: stdout.truncated,
            stderr_truncated: stderr.truncated,
            duration_us,
        },
        stdout: stdout.data,
        stderr: stderr.data,
    })
}

fn default_cwd() -> String {
    if std::path::Path::new("/workspace").is_dir() {
        "/workspace".into()
    } else {
        "/".into()
    }
}

/// Moves bytes between the command's pipes and memory until both output pipes close, the
/// command has exited and a short grace passed, or the deadline passes (then the process
/// group is killed and `timed_out` is true).
fn pump(
    child: &mut dyn Running,
    pipes: Pipes,
    stdin: &[u8],
    req: &Launch,
    deadline: Option<Instant>,
) -> io::Result<(Capped, Capped, bool)> {
    let Pipes {
        stdin: mut child_stdin,
        stdout: mut child_stdout,
        stderr: mut child_stderr,
    } = pipes;
    for fd in [child_stdout.as_raw_fd(), child_stderr.as_raw_fd()] {
        sys::set_nonblocking(fd, true)?;
    }
    if let Some(s) = &child_stdin {
        sys::set_nonblocking(s.as_raw_fd(), true)?;
    }
    if stdin.is_empty() {
        child_stdin = None; // closes it: the command sees end of input at once
    }
    let mut written = 0usize;
    let mut out = Capped::new(req.stdout_cap);
    let mut err = Capped::new(req.stderr_cap);
    let mut exited_at: Option<Instant> = None;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if !out.open && !err.open {
            return Ok((out, err, false));
        }
        let now = Instant::now();
        if let Some(deadline) = deadline {
            if now >= deadline {
                child.kill();
                return Ok((out, err, true));
            }
        }
        if let Some(at) = exited_at {
            if now >= at + GRACE_AFTER_EXIT {
                // What the command wrote before it exited may have arrived after the last
                // poll (the vCPU can be preempted for longer than the grace right here).
                // A descendant may still hold the pipes open, so no waiting for their end.
                // A read error now only loses that tail: the command's exit still counts.
                for (pipe, into) in [(&mut child_stdout, &mut out), (&mut child_stderr, &mut err)] {
                    if into.open {
                        let _ = drain(pipe, into, &mut buf);
                    }
                }
                return Ok((out, err, false));
            }
        }
        let mut timeout = Duration::from_millis(50);
        if let Some(deadline) = deadline {
            timeout = timeout.min(deadline.saturating_duration_since(now) + Duration::from_millis(1));
        }
        let (stdout_ready, stderr_ready, stdin_ready) =
            poll_pipes(&child_stdout, &out, &child_stderr, &err, child_stdin.as_ref(), timeout)?;
        if stdout_ready {
            drain(&mut child_stdout, &mut out, &mut buf)?;
        }
        if stderr_ready {
            drain(&mut child_stderr, &mut err, &mut buf)?;
        }
        if stdin_ready && feed_stdin(child_stdin.as_mut().expect("polled"), stdin, &mut written) {
            child_stdin = None;
        }
        if exited_at.is_none() && child.try_wait()?.is_some() {
            exited_at = Some(Instant::now());
        }
    }
}

/// Waits up to `timeout` for output on the open output pipes or room in the command's input;
/// says which are ready (stdout, stderr, stdin).
fn poll_pipes(
    child_stdout: &impl AsFd,
    out: &Capped,
    child_stderr: &impl AsFd,
    err: &Capped,
    child_stdin: Option<&impl AsFd>,
    timeout: Duration,
) -> io::Result<(bool, bool, bool)> {
    use nix::poll::PollFlags;
    let mut fds = Vec::with_capacity(3);
    if out.open {
        fds.push((child_stdout.as_fd(), PollFlags::POLLIN));
    }
    if err.open {
        fds.push((child_stderr.as_fd(), PollFlags::POLLIN));
    }
    if let Some(s) = child_stdin {
        fds.push((s.as_fd(), PollFlags::POLLOUT));
    }
    let mut ready = sys::poll(&fds, timeout)?.into_iter();
    Ok((
        out.open && ready.next() == Some(true),
        err.open && ready.next() == Some(true),
        child_stdin.is_some() && ready.next() == Some(true),
    ))
}

/// Writes what the command's input can take now; true once all of it is written (or the
/// command closed its input early, EPIPE: that is its business), when the pipe is to close.
fn feed_stdin(pipe: &mut impl Write, stdin: &[u8], written: &mut usize) -> bool {
    match pipe.write(&stdin[*written..]) {
        Ok(n) => *written += n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        Err(_) => *written = stdin.len(),
    }
    *written >= stdin.len()
}

fn drain(pipe: &mut impl Read, into: &mut Capped, buf: &mut [u8]) -> io::Result<()> {
    // Bounded: a descendant writing without pause on another vCPU would otherwise keep this
    // loop reading forever, past the command's deadline (checked between calls).
    for _ in 0..DRAIN_READS {
        match pipe.read(buf) {
            Ok(0) => {
                into.open = false;
                return Ok(());
            }
            Ok(n) => into.take(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Waits for the command to exit, until `deadline` if one is given.
fn wait(child: &mut dyn Running, deadline: Option<Instant>) -> Option<ExitStatus> {
    let mut pause = Duration::from_micros(100);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(_) => return child.wait().ok(),
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe a writer never lets run dry.
    struct Endless(usize);

    impl Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.0 += 1;
            buf.fill(b'y');
            Ok(buf.len())
        }
    }

    #[test]
    fn draining_a_pipe_that_never_runs_dry_returns() {
        let (mut pipe, mut into, mut buf) = (Endless(0), Capped::new(100), vec![0u8; 64 * 1024]);
        drain(&mut pipe, &mut into, &mut buf).unwrap();
        assert_eq!(pipe.0, DRAIN_READS);
        assert!(into.open && into.truncated && into.data.len() == 100);
    }

    #[test]
    fn a_bare_name_is_found_as_execvp_finds_it_and_keeps_its_argv0() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (first, second) = (dir.path().join("a"), dir.path().join("b"));
        for d in [&first, &second] {
            std::fs::create_dir(d).unwrap();
        }
        let put = |path: std::path::PathBuf, body: &[u8], mode: u32| {
            std::fs::write(&path, body).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        // Not executable in the first folder: the second's is the one.
        put(first.join("tool"), b"#!/bin/sh\necho first\n", 0o644);
        put(second.join("tool"), b"#!/bin/sh\necho $0 second\n", 0o755);
        // No `#!`: execvp hands it to /bin/sh, which only std's own lookup does.
        put(second.join("bare"), b"echo bare\n", 0o755);
        let path = format!("{}:{}", first.display(), second.display());
        let env = vec![("PATH".to_string(), path.clone())];
        assert_eq!(on_path("tool", &env), Some(second.join("tool")));
        assert_eq!(on_path("bare", &env), None);
        assert_eq!(on_path("missing", &env), None);
        assert_eq!(on_path("a/tool", &env), None);
        let relative = vec![("PATH".to_string(), format!("rel:{path}"))];
        assert_eq!(
            on_path("tool", &relative),
            None,
            "a relative entry depends on the folder"
        );
        assert_eq!(on_path("tool", &[]), None, "no PATH: std's lookup");

        let run = |argv: &[&str]| {
            let argv = Program::Argv(argv.iter().map(|a| a.to_string()).collect());
            command_for(&argv, &env, true)
                .unwrap()
                .env_clear()
                .env("PATH", &path)
                .output()
                .unwrap()
        };
        // A script's $0 is the path it was found at, as with execvp.
        let found = format!("{} second\n", second.join("tool").display());
        assert_eq!(String::from_utf8_lossy(&run(&["tool", "x"]).stdout), found);
        // A binary's argv[0] stays the name given (ls names itself by it in its errors).
        std::os::unix::fs::symlink("/bin/ls", second.join("myls")).unwrap();
        let out = run(&["myls", "--no-such-flag"]);
        assert!(String::from_utf8_lossy(&out.stderr).starts_with("myls:"), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&run(&["bare"]).stdout), "bare\n");
        // A FIFO named as the program, first on the PATH (an open for reading would wait for
        // a writer): passed over at once.
        nix::unistd::mkfifo(&first.join("piped"), nix::sys::stat::Mode::from_bits_truncate(0o755)).unwrap();
        put(second.join("piped"), b"#!/bin/sh\necho piped\n", 0o755);
        assert_eq!(on_path("piped", &env), Some(second.join("piped")));
        assert!(command_for(&Program::Argv(Vec::new()), &env, true).is_err());
        let proc_path = vec![("PATH".to_string(), format!("/proc/self/cwd:{path}"))];
        assert_eq!(on_path("tool", &proc_path), None, "/proc depends on who looks");
    }

    /// What the agent finds first may not start (its `#!` interpreter is missing): the
    /// command then runs what execvp would, further along the PATH.
    #[test]
    fn a_found_program_that_cannot_start_falls_back_to_the_next_on_the_path() {
        use std::os::unix::fs::PermissionsExt;
        if !nix::unistd::Uid::effective().is_root() {
            return; // the agent's lookup is for root's commands
        }
        let dir = tempfile::tempdir().unwrap();
        let (first, second) = (dir.path().join("a"), dir.path().join("b"));
        for (d, body) in [
            (&first, "#!/no/such/interpreter\n"),
            (&second, "#!/bin/sh\necho second\n"),
        ] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("tool"), body).unwrap();
            std::fs::set_permissions(d.join("tool"), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let program = Program::Argv(vec!["tool".into()]);
        let launch = Launch {
            program: &program,
            cwd: "/".into(),
            env: vec![("PATH".into(), format!("{}:{}", first.display(), second.display()))],
            user: User::ROOT,
            timeout_ms: Some(30_000),
            stdout_cap: 1024,
            stderr_cap: 1024,
            checker_view: false,
        };
        let (out, _) = run_launch(&launch, b"").unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "second\n");
    }
}
