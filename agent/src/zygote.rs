//! Function-call checks in the harness zygote, from the agent itself.
//!
//! The host asks for a check as `farm-agent --check-with-zygote SOCKET -- python3 -I
//! HARNESS ARGS...` (see `farm-agent --help` and `datasets/src/harness/function_call.py`).
//! Run as a command, that is one more process to start, and in a freshly forked VM under TCG
//! the kernel's fork and exec paths are translated anew: about a fifth of a check. So when
//! the agent runs such a command as root and the zygote answers on its socket, it does what
//! that program would do without starting it: it hands the zygote three pipes as the check's
//! standard input, output and error, and takes the exit status from the socket. When the
//! socket does not answer, the command runs as it is (and falls back to starting Python).

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Instant;

use farm_protocol::{AgentError, ErrorKind, Program};

use crate::exec::{self, Launch, Output, Pipes, Running};
use crate::sys;

/// The program that runs a check in the zygote.
pub const CLIENT: &str = "/sbin/farm-agent";
/// Its flag.
pub const FLAG: &str = "--check-with-zygote";

/// A check request read from a command line.
#[derive(Debug, PartialEq, Eq)]
pub struct Check<'a> {
    pub socket: &'a str,
    /// The harness arguments (after the interpreter, its flag and the harness path).
    pub args: &'a [String],
}

/// `farm-agent --check-with-zygote SOCKET -- PYTHON -I HARNESS ARGS...`, or None.
pub fn parse(program: &Program) -> Option<Check<'_>> {
    let Program::Argv(argv) = program else { return None };
    match argv.as_slice() {
        [client, flag, socket, dashes, fallback @ ..]
            if client == CLIENT && flag == FLAG && dashes == "--" && fallback.len() >= 3 =>
        {
            Some(Check {
                socket,
                args: &fallback[3..],
            })
        }
        _ => None,
    }
}

/// Connects to the zygote's socket; None when nothing (or something not root's) answers.
pub fn connect(socket: &str) -> Option<(UnixStream, i32)> {
    let stream = UnixStream::connect(socket).ok()?;
    let peer = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials).ok()?;
    (peer.uid() == 0 && peer.pid() > 1).then_some((stream, peer.pid()))
}

/// A check in the zygote: the process that runs it (the zygote itself, or a check process it
/// forked) answers on the socket with its pid, then its exit status (4 bytes each, big
/// endian).
struct ZygoteCheck {
    stream: UnixStream,
    /// The zygote, until the check's own process says who it is.
    pid: i32,
    /// Whether `pid` is the check's process (its first answer came).
    pid_known: bool,
    received: Vec<u8>,
    status: Option<ExitStatus>,
    killed: bool,
}

impl ZygoteCheck {
    /// Takes what arrived: the pid first, then the status.
    fn take(&mut self, bytes: &[u8]) {
        self.received.extend_from_slice(bytes);
        if !self.pid_known && self.received.len() >= 4 {
            self.pid = i32::from_be_bytes(self.received[..4].try_into().expect("4 bytes"));
            self.pid_known = true;
            self.received.drain(..4);
        }
        if self.pid_known && self.received.len() >= 4 {
            let code = i32::from_be_bytes(self.received[..4].try_into().expect("4 bytes"));
            self.status = Some(exit_status(code));
        }
    }
}

impl Running for ZygoteCheck {
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        while self.status.is_none() {
            let mut buf = [0u8; 8];
            let want = 8 - self.received.len() - if self.pid_known { 4 } else { 0 };
            match (&self.stream).read(&mut buf[..want]) {
                Ok(0) => {
                    // Gone without a status: killed (by a timeout), or broken; as the
                    // client would have said it.
                    self.status = Some(if self.killed {
                        ExitStatus::from_raw(libc::SIGKILL)
                    } else {
                        exit_status(70)
                    });
                }
                Ok(n) => self.take(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.status = Some(exit_status(70)),
            }
        }
        Ok(self.status)
    }

    fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    fn kill(&mut self) {
        self.killed = true;
        // The check's process leads a session (and group) of its own.
        sys::kill_group(self.pid as u32);
        sys::kill_pid(self.pid);
    }
}

/// What `exit(code)` would have given.
fn exit_status(code: i32) -> ExitStatus {
    ExitStatus::from_raw((code & 0xff) << 8)
}

fn io_error(what: &str, e: impl std::fmt::Display) -> AgentError {
    AgentError {
        kind: ErrorKind::Spawn,
        message: format!("the harness zygote {what}: {e}"),
    }
}

/// Runs the check in the zygote behind `stream` (in a check process the zygote forks, with
/// `fork`); returns the output and the pid of the process that ran it (the leader of its
/// session, for the sweep).
pub fn run(
    stream: UnixStream,
    zygote_pid: i32,
    check: &Check,
    launch: &Launch,
    stdin: &[u8],
    fork: bool,
) -> Result<(Output, u32), AgentError> {
    let started = Instant::now();
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| io_error("could not get pipes", e));
    let (stdin_read, stdin_write) = pipe()?;
    let (stdout_read, stdout_write) = pipe()?;
    let (stderr_read, stderr_write) = pipe()?;
    let request =
        serde_json::to_vec(&serde_json::json!({ "args": check.args, "fork": fork })).expect("strings serialize");
    let fds = [
        stdin_read.as_raw_fd(),
        stdout_write.as_raw_fd(),
        stderr_write.as_raw_fd(),
    ];
    sys::send_with_fds(&stream, &request, &fds).map_err(|e| io_error("did not take the check", e))?;
    // Only the zygote holds these ends now: the output ends when it (and the candidate it
    // handed standard error to) are gone.
    drop((stdin_read, stdout_write, stderr_write));
    sys::set_nonblocking(stream.as_raw_fd(), true).map_err(|e| io_error("socket", e))?;
    let file = |fd: OwnedFd| File::from(fd);
    let pipes = Pipes {
        stdin: Some(file(stdin_write)),
        stdout: file(stdout_read),
        stderr: file(stderr_read),
    };
    let mut running = ZygoteCheck {
        stream,
        pid: zygote_pid,
        pid_known: false,
        received: Vec::new(),
        status: None,
        killed: false,
    };
    let output = exec::finish(&mut running, pipes, stdin, launch, started)?;
    Ok((output, running.pid as u32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn argv(words: &[&str]) -> Program {
        Program::Argv(words.iter().map(|w| w.to_string()).collect())
    }

    #[test]
    fn only_the_exact_client_command_is_a_zygote_check() {
        let program = argv(&[
            CLIENT,
            FLAG,
            "/run/farm/zygote.sock",
            "--",
            "/usr/bin/python3",
            "-I",
            "/opt/farm-tests/harness.py",
            "--module",
            "solution",
        ]);
        let check = parse(&program).expect("a check");
        assert_eq!(check.socket, "/run/farm/zygote.sock");
        assert_eq!(check.args, ["--module", "solution"]);
        assert_eq!(
            parse(&argv(&[CLIENT, FLAG, "/s", "--", "python3", "-I"])),
            None,
            "no harness path"
        );
        assert_eq!(
            parse(&argv(&["/usr/bin/farm-agent", FLAG, "/s", "--", "p", "-I", "h"])),
            None
        );
        assert_eq!(parse(&argv(&[CLIENT, FLAG, "/s", "-x", "p", "-I", "h"])), None);
        assert_eq!(parse(&Program::Shell(format!("{CLIENT} {FLAG} /s -- p -I h"))), None);
        assert_eq!(exit_status(3).code(), Some(3));
        assert_eq!(exit_status(-1).code(), Some(255));
    }

    /// A stand-in zygote on the host: serves one check as the harness does (arguments as
    /// JSON with three descriptors, the status as 4 bytes), as `uid`, doing `behaviour`.
    fn fake_zygote(dir: &std::path::Path, uid: u32, behaviour: &str) -> (String, std::process::Child) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let socket = dir.join("zygote.sock").to_string_lossy().into_owned();
        let script = format!(
            r#"
import json, os, socket, struct, sys, time
os.setsid(); os.setgid({uid}); os.setuid({uid})
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777); server.listen(1)
print("listening", flush=True)
conn, _ = server.accept()
message, fds, _, _ = socket.recv_fds(conn, 65536, 3)
stdin, stdout, stderr = fds
request = json.loads(message)
args = request["args"]
conn.sendall(struct.pack(">i", os.getpid()))
line = os.read(stdin, 100)
if "{behaviour}" == "hang":
    time.sleep(600)
os.write(stdout, b"args=" + " ".join(args).encode() + b" stdin=" + line)
os.write(stderr, b"to stderr")
conn.sendall(struct.pack(">i", 3))
"#
        );
        let mut child = std::process::Command::new("python3")
            .args(["-c", &script, &socket])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = [0u8; 10];
        child.stdout.as_mut().unwrap().read_exact(&mut line).unwrap();
        (socket, child)
    }

    fn launch(program: &Program, timeout_ms: u64) -> Launch<'_> {
        Launch {
            program,
            cwd: "/".into(),
            env: Vec::new(),
            user: crate::users::User::ROOT,
            timeout_ms: Some(timeout_ms),
            stdout_cap: 1 << 16,
            stderr_cap: 1 << 16,
            checker_view: false,
        }
    }

    fn root() -> bool {
        let ok = nix::unistd::geteuid().is_root()
            && std::process::Command::new("python3")
                .arg("-c")
                .arg("pass")
                .status()
                .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipped: needs root and python3");
        }
        ok
    }

    #[test]
    fn a_check_in_the_zygote_gets_stdio_and_the_status_without_a_process() {
        if !root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (socket, mut child) = fake_zygote(dir.path(), 0, "answer");
        let program = argv(&[
            CLIENT, FLAG, &socket, "--", "python3", "-I", "h.py", "--module", "solution",
        ]);
        let check = parse(&program).unwrap();
        let (stream, pid) = connect(check.socket).expect("a root zygote is taken");
        assert_eq!(pid as u32, child.id());
        let (output, group) = run(stream, pid, &check, &launch(&program, 30_000), b"reward-path\n", false).unwrap();
        assert_eq!(group, child.id());
        assert_eq!(output.result.exit_code, Some(3));
        assert!(!output.result.timed_out);
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            "args=--module solution stdin=reward-path\n"
        );
        assert_eq!(output.stderr, b"to stderr");
        let _ = child.wait();
    }

    /// Hostile: something else listening where the zygote's socket should be gets no check
    /// (and no descriptor of the agent's): the check starts as a command instead.
    #[test]
    fn a_socket_that_is_not_roots_gets_no_check() {
        if !root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (socket, mut child) = fake_zygote(dir.path(), 65534, "answer");
        assert!(
            connect(&socket).is_none(),
            "a zygote socket served by uid 65534 was taken"
        );
        let _ = child.kill();
        let _ = child.wait();
    }

    /// A check past its deadline: the zygote (its whole session) is killed and the result
    /// says timed out.
    #[test]
    fn a_check_past_its_deadline_kills_the_zygote() {
        if !root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (socket, mut child) = fake_zygote(dir.path(), 0, "hang");
        let program = argv(&[CLIENT, FLAG, &socket, "--", "python3", "-I", "h.py"]);
        let check = parse(&program).unwrap();
        let (stream, pid) = connect(check.socket).unwrap();
        let (output, _) = run(stream, pid, &check, &launch(&program, 1_000), b"x\n", false).unwrap();
        assert!(output.result.timed_out, "{:?}", output.result);
        assert_eq!(output.result.exit_code, None);
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "the zygote outlived its check");
    }
}
