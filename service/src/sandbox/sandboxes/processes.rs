//! Background processes in a sandbox: started detached, listed, their output read from an
//! offset or followed, fed, signalled and waited for. They live in the guest's agent
//! ([`engine::guest`]), so they die with their sandbox, and a branch or a pause and resume
//! keeps them as the guest had them, pids and output included.

use std::collections::BTreeMap;
use std::time::Duration;

use engine::guest::{Background, GuestError};
use farm_protocol::process::{OutputRead, ProcessInfo, ProcessStatus, Stream, TermSize};
use farm_protocol::Program;
use serde::Deserialize;
use utoipa::ToSchema;

use super::{SandboxId, Sandboxes};
use crate::bounds;
use crate::error::ErrorKind;
use crate::error::{ApiError, ApiResult};
use crate::wire::{OutputChunk, ProcessList, ProcessView};

/// Bytes kept of each output stream when a start does not say (and the most it may ask).
const DEFAULT_RING: u64 = farm_protocol::process::DEFAULT_RING_BYTES;
const MAX_RING: u64 = farm_protocol::process::MAX_RING_BYTES;
/// Bytes one output read returns by default, and at most.
const DEFAULT_READ: u64 = 1 << 20;
const MAX_READ: u64 = farm_protocol::process::MAX_READ_BYTES;
/// The longest a read or a wait holds its request, in seconds.
pub const MAX_WAIT_SECS: f64 = 300.0;
/// The most one stdin write carries.
pub const MAX_STDIN_BYTES: usize = 1 << 20;

/// `POST /v1/sandboxes/{id}/processes`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessStart {
    /// A shell command line (`/bin/sh -c`), or:
    pub command: Option<String>,
    /// A program and its arguments.
    pub argv: Option<Vec<String>>,
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub user: Option<String>,
    /// Bytes kept of each output stream (default 1 MiB, at most 16 MiB): older output is
    /// dropped, and a read says how much.
    pub ring_bytes: Option<u64>,
    /// Run on a terminal of this size (one output stream, `stdout`).
    pub pty: Option<PtySize>,
}

/// A terminal's size.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

/// `POST /v1/sandboxes/{id}/processes/{pid}/stdin`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StdinWrite {
    /// Text to write (at most 1 MiB).
    #[serde(default)]
    pub data: String,
    /// Close standard input afterwards.
    #[serde(default)]
    pub close: bool,
}

/// `POST /v1/sandboxes/{id}/processes/{pid}/signal`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalSend {
    /// `TERM`, `KILL`, `INT`, `HUP`, `QUIT`, `USR1`, `USR2`, `STOP`, `CONT` (with or without
    /// `SIG`), or a number from 1 to 64 (as a number or as text).
    pub signal: Signal,
}

/// A signal by name or number.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Signal {
    Number(i64),
    Name(String),
}

/// The handle a client sees.
pub fn view(info: &ProcessInfo) -> ProcessView {
    let (state, exit_code, signal) = match info.status {
        ProcessStatus::Running => ("running", None, None),
        ProcessStatus::Exited { exit_code, signal } => ("exited", exit_code, signal),
    };
    ProcessView {
        pid: info.pid,
        command: info.command.clone(),
        started_at_ms: info.started_unix_ms,
        state: state.into(),
        exit_code,
        signal,
        pty: info.pty,
        stdout_bytes: info.stdout_bytes,
        stderr_bytes: info.stderr_bytes,
        stdin_open: info.stdin_open,
    }
}

/// A terminal's size, within 1-1000 rows and columns.
pub fn term_size(size: PtySize) -> ApiResult<TermSize> {
    bounds::range("pty.rows", size.rows.into(), (1, 1000), "rows")?;
    bounds::range("pty.cols", size.cols.into(), (1, 1000), "columns")?;
    Ok(TermSize {
        rows: size.rows,
        cols: size.cols,
    })
}

/// A signal by name or number.
fn signal_number(signal: &str) -> ApiResult<i32> {
    let name = signal.trim().to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    let number = match name {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "KILL" => 9,
        "USR1" => 10,
        "USR2" => 12,
        "TERM" => 15,
        "CONT" => 18,
        "STOP" => 19,
        other => other
            .parse::<i32>()
            .ok()
            .filter(|n| (1..=64).contains(n))
            .ok_or_else(|| {
                ApiError::field(
                    ErrorKind::Invalid,
                    "signal",
                    format!("{signal:?} is not a signal: a name (TERM, KILL, INT, HUP, ...) or a number from 1 to 64"),
                )
            })?,
    };
    Ok(number)
}

/// A chunk of output as text: whole UTF-8 characters only, unless the stream ended (a cut
/// character waits for the next read), and invalid bytes replaced.
fn chunk(read: OutputRead, bytes: Vec<u8>, info_status: ProcessStatus) -> OutputChunk {
    let whole = if read.eof {
        bytes.len()
    } else {
        match std::str::from_utf8(&bytes) {
            Ok(_) => bytes.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => bytes.len(),
        }
    };
    let (state, exit_code, signal) = match info_status {
        ProcessStatus::Running => ("running", None, None),
        ProcessStatus::Exited { exit_code, signal } => ("exited", exit_code, signal),
    };
    OutputChunk {
        data: String::from_utf8_lossy(&bytes[..whole]).into_owned(),
        offset: read.offset,
        next: read.offset + whole as u64,
        dropped: read.dropped,
        eof: read.eof && whole == bytes.len(),
        state: state.into(),
        exit_code,
        signal,
    }
}

impl Sandboxes {
    /// A guest's failure about a process: a pid that is not there is 404.
    async fn process_error(&self, id: &str, guest: &engine::guest::Guest, e: GuestError) -> ApiError {
        match e {
            GuestError::Missing(m) => ApiError::field(ErrorKind::NotFound, "pid", m),
            e => self.guest_error(id, guest, e, None).await,
        }
    }

    /// `POST /v1/sandboxes/{id}/processes`.
    pub async fn start_process(&self, id: &SandboxId, start: ProcessStart) -> ApiResult<ProcessView> {
        let program = match (start.command, start.argv) {
            (Some(c), None) if !c.is_empty() => {
                bounds::text("command", &c, bounds::COMMAND_BYTES)?;
                Program::Shell(c)
            }
            (None, Some(argv)) if !argv.is_empty() && !argv[0].is_empty() => {
                bounds::argv("argv", &argv)?;
                Program::Argv(argv)
            }
            (Some(_), Some(_)) => {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    "argv",
                    "give command or argv, not both",
                ))
            }
            _ => {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    "command",
                    "missing: give command (a shell string) or argv",
                ))
            }
        };
        if let Some(cwd) = &start.cwd {
            bounds::text("cwd", cwd, bounds::PATH_BYTES)?;
        }
        bounds::variables("env", &start.env)?;
        if let Some(user) = &start.user {
            bounds::text("user", user, bounds::USER_BYTES)?;
        }
        let ring_bytes = start.ring_bytes.unwrap_or(DEFAULT_RING);
        bounds::range("ring_bytes", ring_bytes, (1, MAX_RING), "bytes")?;
        let pty = start.pty.map(term_size).transpose()?;
        let background = Background {
            cwd: start.cwd,
            env: start.env.into_iter().collect(),
            user: start.user,
            ring_bytes,
            pty,
        };
        self.room_to_run()?;
        let _in_use = self.begin(id);
        let guest = self.guest(id).await?;
        match guest.spawn(program, background).await {
            Ok(info) => Ok(view(&info)),
            Err(e) => Err(self.guest_error(id, &guest, e, None).await),
        }
    }

    pub async fn processes(&self, id: &SandboxId) -> ApiResult<ProcessList> {
        let guest = self.guest(id).await?;
        match guest.processes().await {
            Ok(all) => Ok(ProcessList {
                processes: all.iter().map(view).collect(),
            }),
            Err(e) => Err(self.guest_error(id, &guest, e, None).await),
        }
    }

    pub async fn process(&self, id: &SandboxId, pid: u32) -> ApiResult<ProcessView> {
        let guest = self.guest(id).await?;
        match guest.process(pid).await {
            Ok(info) => Ok(view(&info)),
            Err(e) => Err(self.process_error(id, &guest, e).await),
        }
    }

    /// `GET .../processes/{pid}/output`: output from `offset`, waiting up to `wait` for a byte
    /// past it.
    pub async fn process_output(
        &self,
        id: &SandboxId,
        pid: u32,
        stream: Stream,
        offset: u64,
        max: Option<u64>,
        wait: f64,
    ) -> ApiResult<OutputChunk> {
        let max = max.unwrap_or(DEFAULT_READ);
        bounds::range("max", max, (1, MAX_READ), "bytes")?;
        if !(0.0..=MAX_WAIT_SECS).contains(&wait) {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                "wait",
                format!("wait must be 0 to {MAX_WAIT_SECS} seconds; got {wait}"),
            ));
        }
        match self.read_raw(id, pid, stream, offset, max, wait).await {
            Ok((read, bytes)) => {
                let status = read.status;
                Ok(chunk(read, bytes, status))
            }
            Err(e) => Err(e),
        }
    }

    /// Output as the guest keeps it, bytes and all (a terminal's, for its socket).
    pub async fn read_raw(
        &self,
        id: &SandboxId,
        pid: u32,
        stream: Stream,
        offset: u64,
        max: u64,
        wait: f64,
    ) -> ApiResult<(OutputRead, Vec<u8>)> {
        let _in_use = self.begin(id);
        let guest = self.guest(id).await?;
        match guest
            .read_output(pid, stream, offset, max, Duration::from_secs_f64(wait))
            .await
        {
            Ok(read) => Ok(read),
            Err(e) => Err(self.process_error(id, &guest, e).await),
        }
    }

    /// Bytes to a process's standard input (a terminal's keys, for its socket): how many it
    /// took. A process that does not read takes what its pipe holds and no more, and the
    /// rest is not written (the caller is told, and may write it again).
    pub async fn write_raw(&self, id: &SandboxId, pid: u32, bytes: Vec<u8>, close: bool) -> ApiResult<u64> {
        // Keys typed into a shell are commands too (a close is not).
        if !bytes.is_empty() {
            self.room_to_run()?;
        }
        let _in_use = self.begin(id);
        let guest = self.guest(id).await?;
        match guest.write_stdin(pid, bytes, close).await {
            Ok(taken) => Ok(taken),
            Err(GuestError::Refused(m)) => Err(ApiError::field(ErrorKind::Conflict, "data", m)),
            Err(e) => Err(self.process_error(id, &guest, e).await),
        }
    }

    /// `POST .../processes/{pid}/resize`: a terminal's new size.
    pub async fn resize(&self, id: &SandboxId, pid: u32, size: PtySize) -> ApiResult<ProcessView> {
        let size = term_size(size)?;
        let guest = self.guest(id).await?;
        match guest.resize(pid, size).await {
            Ok(()) => self.process(id, pid).await,
            Err(GuestError::Refused(m)) => Err(ApiError::field(ErrorKind::Conflict, "pid", m)),
            Err(e) => Err(self.process_error(id, &guest, e).await),
        }
    }

    pub async fn write_stdin(&self, id: &SandboxId, pid: u32, write: StdinWrite) -> ApiResult<ProcessView> {
        if write.data.len() > MAX_STDIN_BYTES {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                "data",
                format!(
                    "data must be at most {MAX_STDIN_BYTES} bytes; got {} bytes",
                    write.data.len()
                ),
            ));
        }
        let asked = write.data.len() as u64;
        let taken = self.write_raw(id, pid, write.data.into_bytes(), write.close).await?;
        if taken < asked {
            return Err(ApiError::field(
                ErrorKind::Conflict,
                "data",
                format!(
                    "process {pid} is not reading its standard input: it took {taken} of the {asked} bytes (its pipe is full), and the rest was not written{}; write the rest once it reads",
                    if write.close { ", nor was the input closed" } else { "" }
                ),
            ));
        }
        self.process(id, pid).await
    }

    pub async fn signal_process(&self, id: &SandboxId, pid: u32, signal: SignalSend) -> ApiResult<ProcessView> {
        let number = match signal.signal {
            Signal::Name(name) => signal_number(&name)?,
            Signal::Number(n) => signal_number(&n.to_string())?,
        };
        let guest = self.guest(id).await?;
        if let Err(e) = guest.signal(pid, number).await {
            return Err(self.process_error(id, &guest, e).await);
        }
        self.process(id, pid).await
    }

    /// `POST .../processes/{pid}/wait`: its handle once it ended, or when `timeout` passed.
    pub async fn wait_process(&self, id: &SandboxId, pid: u32, timeout: f64) -> ApiResult<ProcessView> {
        if !(0.0..=MAX_WAIT_SECS).contains(&timeout) {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                "timeout",
                format!("timeout must be 0 to {MAX_WAIT_SECS} seconds; got {timeout}"),
            ));
        }
        let _in_use = self.begin(id);
        let guest = self.guest(id).await?;
        match guest.wait_process(pid, Duration::from_secs_f64(timeout)).await {
            Ok(info) => Ok(view(&info)),
            Err(e) => Err(self.process_error(id, &guest, e).await),
        }
    }
}

/// What following a process's output sends.
#[derive(Debug)]
pub enum FollowEvent {
    /// A chunk of one stream.
    Output(Stream, OutputChunk),
    /// The process ended and both streams were read to their end.
    Exit(ProcessView),
    /// Following failed (the sandbox went, the pid is unknown).
    Error(String),
}

/// How long one read of a followed stream waits for output, and how much it takes.
const FOLLOW_POLL: Duration = Duration::from_secs(20);
const FOLLOW_READ: u64 = 64 << 10;

impl Sandboxes {
    /// Follows a process's output from the offsets given (stdout, stderr): each stream's
    /// chunks as they come, then the process's end. Ends early when the receiver goes.
    pub async fn follow_output(
        self: &std::sync::Arc<Self>,
        id: &SandboxId,
        pid: u32,
        offsets: [u64; 2],
    ) -> ApiResult<tokio::sync::mpsc::Receiver<FollowEvent>> {
        self.process(id, pid).await?;
        // One event waits at most: nothing is read from the guest ahead of the client.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let mut readers = Vec::new();
        for (stream, offset) in [(Stream::Stdout, offsets[0]), (Stream::Stderr, offsets[1])] {
            let (this, tx, id) = (self.clone(), tx.clone(), id.clone());
            readers.push(tokio::spawn(async move {
                this.follow_stream(&id, pid, stream, offset, &tx).await
            }));
        }
        let (this, id) = (self.clone(), id.clone());
        tokio::spawn(async move {
            let mut complete = true;
            for reader in readers {
                complete &= reader.await.unwrap_or(false);
            }
            if !complete {
                return;
            }
            loop {
                let waited = this.wait_process(&id, pid, FOLLOW_POLL.as_secs_f64()).await;
                let event = match waited {
                    Ok(view) if view.state == "running" => {
                        if tx.is_closed() {
                            return;
                        }
                        continue;
                    }
                    Ok(view) => FollowEvent::Exit(view),
                    Err(e) => FollowEvent::Error(e.message),
                };
                let _ = tx.send(event).await;
                return;
            }
        });
        Ok(rx)
    }

    /// One stream to its end; false when following stopped first (an error, or no one is
    /// listening).
    async fn follow_stream(
        &self,
        id: &SandboxId,
        pid: u32,
        stream: Stream,
        mut offset: u64,
        tx: &tokio::sync::mpsc::Sender<FollowEvent>,
    ) -> bool {
        loop {
            let read = self
                .process_output(id, pid, stream, offset, Some(FOLLOW_READ), FOLLOW_POLL.as_secs_f64())
                .await;
            match read {
                Ok(chunk) => {
                    offset = chunk.next;
                    let eof = chunk.eof;
                    let has_news = !chunk.data.is_empty() || chunk.dropped > 0;
                    if has_news && tx.send(FollowEvent::Output(stream, chunk)).await.is_err() {
                        return false;
                    }
                    if eof {
                        return true;
                    }
                    if tx.is_closed() {
                        return false;
                    }
                }
                Err(e) => {
                    let _ = tx.send(FollowEvent::Error(e.message)).await;
                    return false;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_named_or_numbered() {
        assert_eq!(signal_number("TERM").unwrap(), 15);
        assert_eq!(signal_number("sigkill").unwrap(), 9);
        assert_eq!(signal_number("2").unwrap(), 2);
        for bad in ["", "NOPE", "0", "65", "-9"] {
            assert_eq!(
                signal_number(bad).unwrap_err().field.as_deref(),
                Some("signal"),
                "{bad}"
            );
        }
    }

    #[test]
    fn output_is_whole_characters_until_the_end() {
        let read = |offset, len: u64, eof| OutputRead {
            offset,
            dropped: 0,
            next: offset + len,
            eof,
            status: ProcessStatus::Running,
        };
        let text = "hé".as_bytes().to_vec();
        let cut = chunk(read(10, 2, false), text[..2].to_vec(), ProcessStatus::Running);
        assert_eq!((cut.data.as_str(), cut.next, cut.eof), ("h", 11, false), "é waits");
        let end = chunk(read(10, 2, true), text[..2].to_vec(), ProcessStatus::Running);
        assert_eq!((end.next, end.eof), (12, true));
    }
}
