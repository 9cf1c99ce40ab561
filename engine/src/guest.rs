//! A live fork's guest as a client drives it directly (the sandbox API): commands, whole or
//! streamed as their output grows, and files and folders, each while the guest is checked to
//! answer. A [`Guest`] is taken from a fork ([`LiveFork::guest`]) and used without holding
//! the fork's lock, so a long command never blocks a file read, a second command or a delete
//! (a delete stops the VM, and the command ends with [`GuestError::ChannelClosed`]).
//!
//! Streamed commands write their output to a folder of their own in the guest's `/tmp`,
//! read from the host as it grows; folders travel as tar archives made and unpacked by the
//! guest's own `tar`, never on the host.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use farm_protocol::process::{OutputRead, ProcessInfo, ReadOutputRequest, SpawnRequest, Stream, TermSize};
use farm_protocol::Program;
use serde::Serialize;

use crate::live::LiveFork;

/// While a request runs, the guest is pinged this often; this many pings in a row unanswered
/// within [`PING_TIMEOUT`] mean the guest is gone (halted, hung).
const LIVENESS_EVERY: Duration = Duration::from_secs(10);
const PING_TIMEOUT: Duration = Duration::from_secs(20);
const MISSED_PINGS: u32 = 3;

/// Largest file a client may upload or download in one request.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// Largest folder archive a client may download.
pub const MAX_FOLDER_BYTES: u64 = 256 << 20;

/// Names of the guest's temporary files, unique within this process.
static COUNTER: AtomicU64 = AtomicU64::new(0);

fn temporary(what: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("/tmp/.farm-{what}-{}-{n}", std::process::id())
}

/// Why a request to a guest failed. The first three say the guest did not answer, which is
/// not yet a death: a reset or a pause swaps the VM under a request in flight, and its owner
/// tells which it was ([`crate::session::Session::judge`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuestError {
    /// The channel to the guest closed: its VM ended, the guest broke the channel, or the
    /// fork under the request changed.
    #[error("the channel to its guest closed: {0}")]
    ChannelClosed(String),
    /// The guest missed [`MISSED_PINGS`] pings in a row while the request ran.
    #[error("{0}")]
    MissedPings(String),
    /// This request went unanswered past its deadline, while the guest answered its pings.
    #[error("{0}")]
    Unanswered(String),
    /// The guest's agent answered badly or restarted while the request ran.
    #[error("{0}")]
    Broken(String),
    /// The guest refused the request as asked (a bad path, a program it cannot start).
    #[error("the guest refused it: {0}")]
    Refused(String),
    /// A file or folder that is not there.
    #[error("{0}")]
    Missing(String),
    /// Larger than a caller may receive.
    #[error("{0}")]
    TooLarge(String),
    /// The guest did it and it failed (a tar that would not unpack).
    #[error("{0}")]
    Failed(String),
}

/// What a sandbox's command asks beyond the program: each `None` takes the fork's place.
#[derive(Debug, Clone, Default)]
pub struct Command {
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
    pub user: Option<String>,
    pub stdin: Vec<u8>,
    pub timeout: Option<std::time::Duration>,
    /// Caps of stdout and stderr, each.
    pub output_cap: u64,
}

/// How a command ended, with its output.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct CommandOutput {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub output_cap_bytes: u64,
    pub duration_ms: u64,
}

/// How a streamed command ended (its output went out as it came).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct CommandEnd {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub output_cap_bytes: u64,
    pub duration_ms: u64,
}

/// A streamed command's output, as it comes.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    Stdout(String),
    Stderr(String),
}

/// A fork's guest, usable without the fork's lock: its agent, the way to its own services,
/// and the fork's place.
#[derive(Clone)]
pub struct Guest {
    agent: vmm::AgentClient,
    connector: egress::GuestConnector,
    /// Who files are written as (the fork's user; None: root).
    user: Option<String>,
    /// Commands' options, from the fork's place.
    place: crate::harbor::Place,
    /// How many changes its session's VM had seen when it was taken (see
    /// [`crate::session::Session::judge`]).
    pub(crate) stamp: u64,
}

impl LiveFork {
    /// Its guest, to use after the fork's lock is given back.
    pub(crate) fn guest(&self) -> Guest {
        Guest {
            agent: self.fork.agent().clone(),
            connector: self.fork.machine.guest_connector(),
            user: self.place.user.clone(),
            place: self.place.clone(),
            stamp: 0,
        }
    }
}

fn exec_options(place: &crate::harbor::Place, program: Program, command: Command) -> vmm::ExecOptions {
    let mut env = place.env.clone();
    for (k, v) in command.env {
        env.retain(|(key, _)| *key != k);
        env.push((k, v));
    }
    vmm::ExecOptions {
        program,
        cwd: Some(command.cwd.unwrap_or_else(|| place.workdir.clone())),
        env,
        stdin: command.stdin,
        timeout: command.timeout,
        stdout_cap: command.output_cap,
        stderr_cap: command.output_cap,
        user: match command.user {
            Some(u) if u.is_empty() || u == "root" || u == "0" => None,
            Some(u) => Some(u),
            None => place.user.clone(),
        },
    }
}

/// An agent's failure as a [`GuestError`].
fn classify(e: vmm::AgentError) -> GuestError {
    match e {
        vmm::AgentError::Refused {
            kind: farm_protocol::ErrorKind::NotFound,
            message,
            ..
        } => GuestError::Missing(message),
        e @ vmm::AgentError::ChannelClosed(_) => GuestError::ChannelClosed(e.to_string()),
        e @ vmm::AgentError::Timeout { .. } => GuestError::Unanswered(e.to_string()),
        vmm::AgentError::Refused { message, .. }
            if message.contains("No such file") || message.contains("(os error 2)") =>
        {
            GuestError::Missing(message)
        }
        e @ (vmm::AgentError::Refused { .. } | vmm::AgentError::InvalidRequest { .. }) => {
            GuestError::Refused(e.to_string())
        }
        e @ (vmm::AgentError::BadResponse { .. } | vmm::AgentError::AgentRestarted { .. }) => {
            GuestError::Broken(e.to_string())
        }
    }
}

impl Guest {
    /// `work` (a request to the agent), while the guest is checked to answer.
    async fn watched<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, vmm::AgentError>>,
    ) -> Result<T, GuestError> {
        tokio::pin!(work);
        let mut missed = 0;
        loop {
            tokio::select! {
                result = &mut work => return result.map_err(classify),
                _ = tokio::time::sleep(LIVENESS_EVERY) => match self.agent.ping_within(PING_TIMEOUT).await {
                    Ok(_) => missed = 0,
                    Err(vmm::AgentError::Timeout { .. }) => {
                        missed += 1;
                        if missed >= MISSED_PINGS {
                            return Err(GuestError::MissedPings(format!(
                                "its guest stopped answering ({MISSED_PINGS} pings in a row unanswered within {} s): it halted, hung or is starved",
                                PING_TIMEOUT.as_secs()
                            )));
                        }
                    }
                    Err(e) => return Err(classify(e)),
                },
            }
        }
    }

    /// Runs `program` as `command` asks, in the fork's place (its folder, user and
    /// variables, the command's over them).
    pub async fn exec(&self, program: Program, command: Command) -> Result<CommandOutput, GuestError> {
        let cap = command.output_cap;
        let options = exec_options(&self.place, program, command);
        let out = self.watched(self.agent.exec(options)).await?;
        let r = &out.result;
        Ok(CommandOutput {
            exit_code: r.exit_code,
            signal: r.signal,
            timed_out: r.timed_out,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            stdout_truncated: r.stdout_truncated,
            stderr_truncated: r.stderr_truncated,
            output_cap_bytes: cap,
            duration_ms: r.duration_us / 1000,
        })
    }

    /// Runs `program` and sends its output on `tx` as it grows; returns its end. Its
    /// output goes to files of its own in the guest's `/tmp`, removed before this returns: a
    /// client that runs its next command on the end finds the guest as the command left it.
    pub async fn exec_streamed(
        &self,
        program: Program,
        command: Command,
        tx: &tokio::sync::mpsc::Sender<Output>,
    ) -> Result<CommandEnd, GuestError> {
        let cap = command.output_cap;
        let dir = temporary("stream");
        let mut options = exec_options(&self.place, wrap_for_stream(&program, &dir), command);
        // The real output goes to the files; the wrapper's own is small.
        options.stdout_cap = 64 << 10;
        options.stderr_cap = 64 << 10;
        let end = self.watched(stream_command(&self.agent, options, &dir, cap, tx)).await;
        let _ = self.agent.remove_tree(&dir).await;
        end
    }

    /// Writes a file as the fork's user.
    pub async fn write_file(&self, path: &str, mode: u32, bytes: Vec<u8>) -> Result<(), GuestError> {
        let placement = vmm::FilePlacement {
            beneath: None,
            owner: self.user.clone(),
        };
        self.watched(self.agent.write_file_placed(path, bytes, mode, &placement))
            .await
    }

    /// A file, up to [`MAX_FILE_BYTES`].
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>, GuestError> {
        let (bytes, size) = self.watched(self.agent.read_file(path, MAX_FILE_BYTES)).await?;
        if size > MAX_FILE_BYTES {
            return Err(GuestError::TooLarge(format!(
                "{path} is {size} bytes, past the {} MiB a file download may be (download its folder as a tar)",
                MAX_FILE_BYTES >> 20
            )));
        }
        Ok(bytes)
    }

    /// A path's facts, without following a link.
    pub async fn stat(&self, path: &str) -> Result<farm_protocol::folder::Entry, GuestError> {
        self.watched(self.agent.stat(path)).await
    }

    /// A folder's entries, sorted by name (at most `max`), and whether there were more.
    pub async fn list_folder(
        &self,
        path: &str,
        max: u32,
    ) -> Result<(Vec<farm_protocol::folder::Entry>, bool), GuestError> {
        self.watched(self.agent.list_folder(path, max)).await
    }

    /// Unpacks a tar archive under `path` (made if missing), with the guest's own `tar`.
    pub async fn write_folder(&self, path: &str, archive: Vec<u8>) -> Result<(), GuestError> {
        self.unpack(path, archive, false).await
    }

    /// Makes `path` hold exactly what a tar archive holds: what was there goes first.
    pub async fn replace_folder(&self, path: &str, archive: Vec<u8>) -> Result<(), GuestError> {
        self.unpack(path, archive, true).await
    }

    async fn unpack(&self, path: &str, archive: Vec<u8>, replace: bool) -> Result<(), GuestError> {
        let tmp = format!("{}.tar", temporary("upload"));
        self.watched(self.agent.write_file(&tmp, archive, 0o600)).await?;
        let clear = if replace {
            format!("rm -rf -- {dir} && ", dir = shell_quote(path))
        } else {
            String::new()
        };
        let script = format!(
            "{clear}mkdir -p -- {dir} && tar -x -o -f {tmp} -C {dir}; rc=$?; rm -f {tmp}; exit $rc",
            dir = shell_quote(path)
        );
        let out = self.sh(&script).await?;
        if out.result.exit_code != Some(0) {
            return Err(GuestError::Failed(format!(
                "unpacking the archive in {path} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// A tar archive of the folder `path`, made by the guest's own `tar`, up to
    /// [`MAX_FOLDER_BYTES`].
    pub async fn read_folder(&self, path: &str) -> Result<Vec<u8>, GuestError> {
        let tmp = format!("{}.tar", temporary("download"));
        let script = format!(
            "[ -d {dir} ] || {{ echo 'no such folder' >&2; exit 3; }}; tar -c -f {tmp} -C {dir} .",
            dir = shell_quote(path)
        );
        let result = match self.sh(&script).await {
            Ok(out) if out.result.exit_code == Some(0) => self.read_whole(&tmp).await,
            Ok(out) if out.result.exit_code == Some(3) => Err(GuestError::Missing(format!("{path}: no such folder"))),
            Ok(out) => Err(GuestError::Failed(format!(
                "packing {path} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))),
            Err(e) => Err(e),
        };
        let _ = self.agent.remove_file(&tmp, None).await;
        result
    }

    /// A guest file in chunks, up to [`MAX_FOLDER_BYTES`].
    async fn read_whole(&self, path: &str) -> Result<Vec<u8>, GuestError> {
        const CHUNK: u64 = 16 << 20;
        let mut out = Vec::new();
        loop {
            let (bytes, size) = self
                .watched(self.agent.read_file_at(path, out.len() as u64, CHUNK, None))
                .await?;
            if size > MAX_FOLDER_BYTES {
                return Err(GuestError::TooLarge(format!(
                    "the folder's archive is {size} bytes, past the {} MiB a download may be",
                    MAX_FOLDER_BYTES >> 20
                )));
            }
            let done = bytes.is_empty();
            out.extend_from_slice(&bytes);
            if done || out.len() as u64 >= size {
                return Ok(out);
            }
        }
    }

    async fn sh(&self, script: &str) -> Result<vmm::ExecOutput, GuestError> {
        let options = vmm::ExecOptions {
            timeout: Some(Duration::from_secs(600)),
            ..vmm::ExecOptions::argv(&["/bin/sh", "-c", script])
        };
        self.watched(self.agent.exec(options)).await
    }
}

/// What a background process is started with, beside its program.
#[derive(Debug, Clone, Default)]
pub struct Background {
    /// Its folder, variables and user (each None: the fork's).
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
    pub user: Option<String>,
    /// Bytes kept of each output stream.
    pub ring_bytes: u64,
    /// Run on a terminal of this size.
    pub pty: Option<TermSize>,
}

impl Guest {
    /// Starts a background process in the fork's place (its folder, user and variables,
    /// the process's over them).
    pub async fn spawn(&self, program: Program, background: Background) -> Result<ProcessInfo, GuestError> {
        let command = Command {
            cwd: background.cwd,
            env: background.env,
            user: background.user,
            ..Command::default()
        };
        let options = exec_options(&self.place, program, command);
        let request = SpawnRequest {
            program: options.program,
            cwd: options.cwd,
            env: options.env.into_iter().collect(),
            user: options.user,
            ring_bytes: background.ring_bytes,
            pty: background.pty,
        };
        self.watched(self.agent.spawn(request)).await
    }

    pub async fn processes(&self) -> Result<Vec<ProcessInfo>, GuestError> {
        self.watched(self.agent.processes()).await
    }

    pub async fn process(&self, pid: u32) -> Result<ProcessInfo, GuestError> {
        self.watched(self.agent.process_info(pid)).await
    }

    /// A process's output from `offset`, waiting up to `wait` for a byte past it.
    pub async fn read_output(
        &self,
        pid: u32,
        stream: Stream,
        offset: u64,
        max_bytes: u64,
        wait: Duration,
    ) -> Result<(OutputRead, Vec<u8>), GuestError> {
        let request = ReadOutputRequest {
            pid,
            stream,
            offset,
            max_bytes,
            wait_ms: wait.as_millis() as u64,
        };
        self.watched(self.agent.read_output(request)).await
    }

    /// Bytes to a process's standard input: how many it took (fewer when it does not read
    /// them; the rest was not written).
    pub async fn write_stdin(&self, pid: u32, bytes: Vec<u8>, close: bool) -> Result<u64, GuestError> {
        self.watched(self.agent.write_stdin(pid, bytes, close)).await
    }

    pub async fn signal(&self, pid: u32, signal: i32) -> Result<(), GuestError> {
        self.watched(self.agent.signal(pid, signal)).await
    }

    /// Waits up to `timeout` for a process to end; its handle either way.
    pub async fn wait_process(&self, pid: u32, timeout: Duration) -> Result<ProcessInfo, GuestError> {
        self.watched(self.agent.wait_process(pid, timeout)).await
    }

    pub async fn resize(&self, pid: u32, size: TermSize) -> Result<(), GuestError> {
        self.watched(self.agent.resize(pid, size)).await
    }

    /// A connection to the guest's own `127.0.0.1:port` (nothing listening closes it at
    /// once).
    pub async fn connect(&self, port: u16) -> std::io::Result<tokio::io::DuplexStream> {
        self.connector.connect(port).await
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// `program` with its output sent to `dir/out` and `dir/err` (the folder is made by the
/// wrapper, as whoever the command runs as).
fn wrap_for_stream(program: &Program, dir: &str) -> Program {
    let redirect = format!("mkdir -m 700 {dir} && exec \"$@\" >{dir}/out 2>{dir}/err");
    let mut argv = vec!["/bin/sh".to_string(), "-c".into(), redirect, "sh".into()];
    match program {
        Program::Shell(script) => argv.extend(["/bin/sh".to_string(), "-c".into(), script.clone()]),
        Program::Argv(args) => argv.extend(args.iter().cloned()),
    }
    Program::Argv(argv)
}

/// Runs a wrapped command and sends its output as it grows; returns its end.
async fn stream_command(
    agent: &vmm::AgentClient,
    options: vmm::ExecOptions,
    dir: &str,
    cap: u64,
    tx: &tokio::sync::mpsc::Sender<Output>,
) -> Result<CommandEnd, vmm::AgentError> {
    let run = agent.exec(options);
    tokio::pin!(run);
    let (out, err) = (format!("{dir}/out"), format!("{dir}/err"));
    let mut offsets = [0u64; 2];
    let mut truncated = [false; 2];
    let mut wait = Duration::from_millis(20);
    let result = loop {
        tokio::select! {
            result = &mut run => break result?,
            _ = tokio::time::sleep(wait) => {
                let got = forward(agent, [&out, &err], &mut offsets, &mut truncated, cap, tx).await;
                wait = if got { Duration::from_millis(20) } else { (wait * 2).min(Duration::from_millis(250)) };
            }
        }
    };
    forward(agent, [&out, &err], &mut offsets, &mut truncated, cap, tx).await;
    let r = &result.result;
    if r.exit_code == Some(126) || r.exit_code == Some(127) || offsets == [0, 0] {
        // The wrapper's own complaint (the folder could not be made, or no such program).
        let own = String::from_utf8_lossy(&result.stderr).into_owned();
        if !own.is_empty() {
            let _ = tx.send(Output::Stderr(own)).await;
        }
    }
    Ok(CommandEnd {
        exit_code: r.exit_code,
        signal: r.signal,
        timed_out: r.timed_out,
        stdout_truncated: truncated[0],
        stderr_truncated: truncated[1],
        output_cap_bytes: cap,
        duration_ms: r.duration_us / 1000,
    })
}

/// Sends what the two files gained since `offsets`; whether anything came.
async fn forward(
    agent: &vmm::AgentClient,
    paths: [&str; 2],
    offsets: &mut [u64; 2],
    truncated: &mut [bool; 2],
    cap: u64,
    tx: &tokio::sync::mpsc::Sender<Output>,
) -> bool {
    // A chunk waits for a client that does not read: small ones keep that cheap.
    const CHUNK: u64 = 64 << 10;
    let mut any = false;
    for i in 0..2 {
        loop {
            if offsets[i] >= cap {
                break;
            }
            let want = CHUNK.min(cap - offsets[i]);
            let Ok((bytes, size)) = agent.read_file_at(paths[i], offsets[i], want, None).await else {
                break;
            };
            if size > cap {
                truncated[i] = true;
            }
            if bytes.is_empty() {
                break;
            }
            // Whole characters only: a cut at a chunk's end waits for the rest.
            let text_len = utf8_prefix(&bytes, offsets[i] + (bytes.len() as u64) < size.min(cap));
            if text_len == 0 {
                break;
            }
            offsets[i] += text_len as u64;
            any = true;
            let text = String::from_utf8_lossy(&bytes[..text_len]).into_owned();
            let event = if i == 0 {
                Output::Stdout(text)
            } else {
                Output::Stderr(text)
            };
            let _ = tx.send(event).await;
            if (bytes.len() as u64) < want {
                break;
            }
        }
    }
    any
}

/// How much of `bytes` to send now: all, unless `more` is coming and it ends inside a
/// UTF-8 character (then up to that character).
fn utf8_prefix(bytes: &[u8], more: bool) -> usize {
    if !more {
        return bytes.len();
    }
    match std::str::from_utf8(bytes) {
        Ok(_) => bytes.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => bytes.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_command_writes_to_its_own_folder() {
        let wrapped = wrap_for_stream(&Program::Shell("echo hi".into()), "/tmp/x");
        let Program::Argv(argv) = wrapped else { panic!() };
        assert_eq!(&argv[..2], ["/bin/sh", "-c"]);
        assert!(argv[2].contains(">/tmp/x/out 2>/tmp/x/err"), "{argv:?}");
        assert_eq!(&argv[4..], ["/bin/sh", "-c", "echo hi"]);
        let Program::Argv(argv) = wrap_for_stream(&Program::Argv(vec!["ls".into(), "-l".into()]), "/d") else {
            panic!()
        };
        assert_eq!(&argv[4..], ["ls", "-l"]);
    }

    #[test]
    fn output_is_cut_between_characters() {
        let text = "héllo".as_bytes();
        assert_eq!(utf8_prefix(&text[..2], true), 1, "é is split: wait for it");
        assert_eq!(utf8_prefix(&text[..2], false), 2, "nothing more comes: send it");
        assert_eq!(utf8_prefix(text, true), text.len());
    }

    #[test]
    fn only_a_missing_file_is_missing() {
        let refused = |message: &str| vmm::AgentError::Refused {
            op: "stat",
            kind: farm_protocol::ErrorKind::Io,
            message: message.into(),
        };
        let missing = refused("/a: No such file or directory (os error 2)");
        assert!(matches!(classify(missing), GuestError::Missing(_)));
        for other in ["Not a directory (os error 20)", "Is a directory (os error 21)"] {
            assert!(matches!(classify(refused(other)), GuestError::Refused(_)), "{other}");
        }
    }

    #[test]
    fn paths_are_quoted_for_the_guests_shell() {
        assert_eq!(shell_quote("/a b"), "'/a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }
}
