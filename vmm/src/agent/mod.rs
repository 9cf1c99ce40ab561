//! The host end of the guest agent channel.
//!
//! Requests are multiplexed over one stream: each gets an id, a reader task routes responses
//! to their waiters. The guest is untrusted, so the reader bounds everything it accepts:
//! frames above the size limit or malformed frames close the channel with a reason (the
//! stream cannot be resynchronised), responses whose body disagrees with their header fail
//! that request, unsolicited frames are dropped, and every wait has a deadline. A closed
//! channel fails all pending requests at once; nothing waits forever on a dead guest.
//!
//! File and folder requests are in `files.rs`; reading frames from the guest in `reader.rs`.

mod files;
mod process;
mod reader;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use farm_protocol::{
    encode_frame, Envelope, ExecRequest, ExecResult, IdentityRequest, Pong, Program, Request, Response,
    RunTestsRequest, SweepRequest, TestsResult, PROTOCOL_VERSION,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{oneshot, watch};

pub use files::FilePlacement;
pub use reader::read_frame;
use reader::read_loop;

/// Largest frame accepted from a guest by default.
pub const DEFAULT_MAX_RESPONSE_BYTES: u32 = 80 << 20;

#[derive(Debug, Clone, thiserror::Error)]
pub enum AgentError {
    #[error("the guest agent channel closed: {0}")]
    ChannelClosed(String),
    #[error("the guest agent did not answer {op} within {waited:?}")]
    Timeout { op: &'static str, waited: Duration },
    #[error("the guest agent sent an invalid response to {op}: {detail}")]
    BadResponse { op: &'static str, detail: String },
    #[error("the guest agent restarted while {op} was in flight (a command may have killed it)")]
    AgentRestarted { op: &'static str },
    #[error("{op}: {detail}")]
    InvalidRequest { op: &'static str, detail: String },
    #[error("the guest agent refused {op}: {message}")]
    Refused {
        op: &'static str,
        kind: farm_protocol::ErrorKind,
        message: String,
    },
}

type Reply = Result<(Response, Vec<u8>), AgentError>;

struct Shared {
    pending: HashMap<u64, oneshot::Sender<Reply>>,
    /// Set once the channel is dead; later requests fail at once with this reason.
    closed: Option<String>,
    /// Frames that matched no pending request (late answers, or a misbehaving guest).
    unsolicited: u64,
}

/// A handle to one guest agent; cheap to clone, usable from many tasks at once.
#[derive(Clone)]
pub struct AgentClient {
    inner: Arc<Inner>,
}

struct Inner {
    writer: tokio::sync::Mutex<Box<dyn AsyncWrite + Send + Unpin>>,
    shared: Mutex<Shared>,
    next_id: AtomicU64,
    max_response_bytes: u32,
    /// Becomes true when the agent announced itself (unsolicited pong) or answered a ping.
    ready: watch::Sender<bool>,
    reader_task: tokio::task::JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.reader_task.abort();
    }
}

/// What to run and how.
#[derive(Debug, Clone)]
pub struct ExecOptions {
    pub program: Program,
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
    /// Guest-side limit; the process group is killed when it expires.
    pub timeout: Option<Duration>,
    pub stdout_cap: u64,
    pub stderr_cap: u64,
    /// Run as this guest user (a name, `UID` or `UID:GID`); root when None.
    pub user: Option<String>,
}

impl ExecOptions {
    pub fn argv<S: AsRef<str>>(argv: &[S]) -> Self {
        Self::new(Program::Argv(argv.iter().map(|s| s.as_ref().to_string()).collect()))
    }

    pub fn shell(script: impl Into<String>) -> Self {
        Self::new(Program::Shell(script.into()))
    }

    fn new(program: Program) -> Self {
        ExecOptions {
            program,
            cwd: None,
            env: Vec::new(),
            stdin: Vec::new(),
            timeout: None,
            stdout_cap: 1 << 20,
            stderr_cap: 1 << 20,
            user: None,
        }
    }
}

/// What ran and what the verdict files held, from [`AgentClient::run_tests`].
#[derive(Debug, Clone)]
pub struct TestsOutput {
    pub result: TestsResult,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The JUnit report the tests wrote (empty when there is none).
    pub junit: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct ExecOutput {
    pub result: ExecResult,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl ExecOutput {
    /// The exit code a shell would report: the code, or 128 + signal.
    pub fn shell_exit_code(&self) -> i32 {
        match (self.result.exit_code, self.result.signal) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => 255,
        }
    }

    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// Time allowed beyond a command's own timeout for the answer to arrive.
const EXEC_MARGIN: Duration = Duration::from_secs(10);
/// Default deadline for short requests (ping, files, identity, quiesce).
const SHORT_REQUEST: Duration = Duration::from_secs(60);

impl AgentClient {
    /// Starts serving a connected stream: `reader` and `writer` are its two halves.
    pub fn new<R, W>(reader: R, writer: W, max_response_bytes: u32) -> AgentClient
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let (ready, _) = watch::channel(false);
        let inner = Arc::new_cyclic(|weak: &std::sync::Weak<Inner>| {
            let weak = weak.clone();
            let reader_task = tokio::spawn(async move {
                let reason = read_loop(reader, max_response_bytes, &weak).await;
                if let Some(inner) = weak.upgrade() {
                    inner.close(reason);
                }
            });
            Inner {
                writer: tokio::sync::Mutex::new(Box::new(writer)),
                shared: Mutex::new(Shared {
                    pending: HashMap::new(),
                    closed: None,
                    unsolicited: 0,
                }),
                next_id: AtomicU64::new(1),
                max_response_bytes,
                ready,
                reader_task,
            }
        });
        AgentClient { inner }
    }

    /// Whether the channel is known dead, and why.
    pub fn closed_reason(&self) -> Option<String> {
        self.inner
            .shared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .closed
            .clone()
    }

    /// Frames received that answered no pending request.
    pub fn unsolicited_frames(&self) -> u64 {
        self.inner.shared.lock().unwrap_or_else(|p| p.into_inner()).unsolicited
    }

    /// Waits until the agent is serving. Pings are repeated because one sent before the
    /// guest opened its port is discarded by the guest; the agent's announcement (an
    /// unsolicited pong) fails the ping in flight at once, so the next goes out promptly.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<Pong, AgentError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(reason) = self.closed_reason() {
                return Err(AgentError::ChannelClosed(reason));
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(AgentError::Timeout {
                    op: "ping",
                    waited: timeout,
                });
            }
            let attempt = if *self.inner.ready.borrow() {
                Duration::from_secs(5)
            } else {
                Duration::from_millis(300)
            };
            match self.ping_within(attempt.min(deadline - now)).await {
                Ok(pong) => return Ok(pong),
                Err(AgentError::Timeout { .. }) | Err(AgentError::AgentRestarted { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }

    pub async fn ping(&self) -> Result<Pong, AgentError> {
        self.ping_within(SHORT_REQUEST).await
    }

    /// A ping that must be answered within `timeout`.
    pub async fn ping_within(&self, timeout: Duration) -> Result<Pong, AgentError> {
        match self.request("ping", Request::Ping, Vec::new(), timeout).await? {
            (Response::Pong(pong), _) => {
                let _ = self.inner.ready.send(true);
                if pong.protocol_version != PROTOCOL_VERSION {
                    return Err(AgentError::BadResponse {
                        op: "ping",
                        detail: format!(
                            "agent speaks protocol {}, host speaks {PROTOCOL_VERSION}",
                            pong.protocol_version
                        ),
                    });
                }
                Ok(pong)
            }
            (other, _) => Err(unexpected("ping", other)),
        }
    }

    pub async fn exec(&self, options: ExecOptions) -> Result<ExecOutput, AgentError> {
        // The answer carries both outputs in one frame; caps that could not fit would turn a
        // chatty command into a broken channel.
        let room = u64::from(self.inner.max_response_bytes).saturating_sub(1 << 20);
        if options.stdout_cap.saturating_add(options.stderr_cap) > room {
            return Err(AgentError::InvalidRequest {
                op: "exec",
                detail: format!(
                    "output caps {} + {} bytes exceed the {room} bytes a response may carry",
                    options.stdout_cap, options.stderr_cap
                ),
            });
        }
        let request = ExecRequest {
            program: options.program,
            cwd: options.cwd,
            env: options.env.into_iter().collect(),
            timeout_ms: options.timeout.map(|t| t.as_millis() as u64),
            stdout_cap: options.stdout_cap,
            stderr_cap: options.stderr_cap,
            user: options.user,
        };
        let wait = options
            .timeout
            .map(|t| t + EXEC_MARGIN)
            .unwrap_or(Duration::from_secs(365 * 24 * 3600));
        let (stdout_cap, stderr_cap) = (request.stdout_cap, request.stderr_cap);
        match self
            .request("exec", Request::Exec(request), options.stdin, wait)
            .await?
        {
            (Response::Exec(result), body) => {
                let (stdout, stderr) = split_output("exec", &result, body, stdout_cap, stderr_cap)?;
                Ok(ExecOutput { result, stdout, stderr })
            }
            (other, _) => Err(unexpected("exec", other)),
        }
    }

    /// Runs a task's hidden tests (see [`farm_protocol::Request::RunTests`]): the agent
    /// runs the command, kills every process of the sweep users, and only then reads the
    /// verdict files. `stdin` is written to the command's standard input.
    pub async fn run_tests(&self, request: RunTestsRequest, stdin: Vec<u8>) -> Result<TestsOutput, AgentError> {
        let room = u64::from(self.inner.max_response_bytes).saturating_sub(6 << 20);
        if request.stdout_cap.saturating_add(request.stderr_cap) > room {
            return Err(AgentError::InvalidRequest {
                op: "run_tests",
                detail: format!(
                    "output caps {} + {} bytes exceed the {room} bytes a response may carry",
                    request.stdout_cap, request.stderr_cap
                ),
            });
        }
        // The command's timeout, the sweep's own limit and a margin.
        let wait = Duration::from_millis(request.timeout_ms) + Duration::from_secs(15) + EXEC_MARGIN;
        let (stdout_cap, stderr_cap) = (request.stdout_cap, request.stderr_cap);
        match self
            .request("run_tests", Request::RunTests(request), stdin, wait)
            .await?
        {
            (Response::RunTests(result), mut body) => {
                let junit_len = result.junit_len.unwrap_or(0);
                if junit_len > farm_protocol::MAX_JUNIT_BYTES || junit_len > body.len() as u64 {
                    return Err(AgentError::BadResponse {
                        op: "run_tests",
                        detail: format!("a JUnit report of {junit_len} bytes in a body of {}", body.len()),
                    });
                }
                let junit = body.split_off(body.len() - junit_len as usize);
                let (stdout, stderr) = split_output("run_tests", &result.exec, body, stdout_cap, stderr_cap)?;
                Ok(TestsOutput {
                    result,
                    stdout,
                    stderr,
                    junit,
                })
            }
            (other, _) => Err(unexpected("run_tests", other)),
        }
    }

    /// Kills every process of these guest users (every process but the agent's when empty)
    /// and waits until they are gone. Returns (killed, all gone).
    pub async fn sweep(&self, uids: Vec<u32>) -> Result<(u32, bool), AgentError> {
        match self
            .request(
                "sweep",
                Request::Sweep(SweepRequest { uids }),
                Vec::new(),
                SHORT_REQUEST,
            )
            .await?
        {
            (Response::Sweep { killed, complete }, _) => Ok((killed, complete)),
            (other, _) => Err(unexpected("sweep", other)),
        }
    }

    pub async fn quiesce(&self) -> Result<(), AgentError> {
        match self
            .request("quiesce", Request::Quiesce, Vec::new(), SHORT_REQUEST)
            .await?
        {
            (Response::Quiesce, _) => Ok(()),
            (other, _) => Err(unexpected("quiesce", other)),
        }
    }

    pub async fn set_identity(&self, identity: IdentityRequest, entropy: Vec<u8>) -> Result<(), AgentError> {
        match self
            .request("identity", Request::Identity(identity), entropy, SHORT_REQUEST)
            .await?
        {
            (Response::Identity, _) => Ok(()),
            (other, _) => Err(unexpected("identity", other)),
        }
    }

    async fn request(&self, op: &'static str, msg: Request, body: Vec<u8>, timeout: Duration) -> Reply {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut shared = self.inner.shared.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(reason) = &shared.closed {
                return Err(AgentError::ChannelClosed(reason.clone()));
            }
            shared.pending.insert(id, tx);
        }
        // Removes the waiter however this future ends (answer, timeout, or being dropped).
        let _guard = PendingGuard { inner: &self.inner, id };
        let frame = encode_frame(
            &Envelope {
                v: PROTOCOL_VERSION,
                id,
                msg,
            },
            &body,
        );
        drop(body);
        // A header past the agent's bound would be dropped by it as a bad frame, unanswered:
        // refused here, at once, saying why.
        let header_len = frame
            .get(8..12)
            .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        if header_len > farm_protocol::MAX_HEADER_BYTES {
            return Err(AgentError::InvalidRequest {
                op,
                detail: format!(
                    "the request is {header_len} bytes of JSON, past the {} the guest agent reads (fewer or shorter arguments)",
                    farm_protocol::MAX_HEADER_BYTES
                ),
            });
        }
        let exchange = async {
            {
                let mut writer = self.inner.writer.lock().await;
                if let Err(e) = writer.write_all(&frame).await {
                    self.inner.close(format!("writing to the agent failed: {e}"));
                }
                let _ = writer.flush().await;
            }
            drop(frame);
            match rx.await {
                Ok(reply) => reply,
                Err(_) => Err(AgentError::ChannelClosed(
                    self.closed_reason().unwrap_or_else(|| "reader stopped".into()),
                )),
            }
        };
        let started = std::time::Instant::now();
        let answered = tokio::time::timeout(timeout, exchange).await;
        tracing::debug!(op, id, ms = started.elapsed().as_secs_f64() * 1e3, "agent call");
        let (response, body) = match answered {
            Ok(reply) => reply?,
            Err(_) => return Err(AgentError::Timeout { op, waited: timeout }),
        };
        if let Response::Error(e) = response {
            return Err(AgentError::Refused {
                op,
                kind: e.kind,
                message: e.message,
            });
        }
        Ok((response, body))
    }
}

struct PendingGuard<'a> {
    inner: &'a Inner,
    id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.inner
            .shared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pending
            .remove(&self.id);
    }
}

impl Inner {
    fn close(&self, reason: String) {
        let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        if shared.closed.is_none() {
            shared.closed = Some(reason.clone());
        }
        for (_, waiter) in shared.pending.drain() {
            let _ = waiter.send(Err(AgentError::ChannelClosed(reason.clone())));
        }
    }
}

/// Splits a command's output body into stdout and stderr, checking it against the header
/// and the caps asked for.
fn split_output(
    op: &'static str,
    result: &ExecResult,
    body: Vec<u8>,
    stdout_cap: u64,
    stderr_cap: u64,
) -> Result<(Vec<u8>, Vec<u8>), AgentError> {
    let (out_len, err_len) = (result.stdout_len, result.stderr_len);
    if out_len > stdout_cap || err_len > stderr_cap {
        return Err(AgentError::BadResponse {
            op,
            detail: format!("output of {out_len}+{err_len} bytes exceeds the caps {stdout_cap}+{stderr_cap}"),
        });
    }
    if out_len.checked_add(err_len) != Some(body.len() as u64) {
        return Err(AgentError::BadResponse {
            op,
            detail: format!(
                "header announces {out_len}+{err_len} bytes of output, body has {}",
                body.len()
            ),
        });
    }
    let mut stdout = body;
    let stderr = stdout.split_off(out_len as usize);
    Ok((stdout, stderr))
}

fn unexpected(op: &'static str, response: Response) -> AgentError {
    AgentError::BadResponse {
        op,
        detail: format!("unexpected response {response:?}"),
    }
}

#[cfg(test)]
mod tests;
