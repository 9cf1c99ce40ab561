//! A terminal over a WebSocket: `GET /v1/sandboxes/{id}/pty`. The socket starts a shell (or
//! the command asked for) on a terminal in the sandbox, or attaches to a background process
//! that has one (`?pid=`); then binary messages are the terminal's bytes both ways, and text
//! messages are JSON: the client's `resize` and `input`, the service's `started`, `dropped`,
//! `exit` and `error`. The reference is `docs/sandbox-api.md`.
//!
//! The terminal's output goes through the process's ring in the guest, so a client that
//! stops reading never stalls the program: the socket is closed after [`STALLED`] without
//! progress, and the output that overflowed the ring is reported as dropped on the next
//! attach.

use crate::serve::error::Respond;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::Response;
use farm_protocol::process::Stream;
use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::http::{App, Mine, QueryOf, Q};
use super::tenancy::{Held, Who};
use axum::Extension;
use service::sandbox::sandboxes::processes::{ProcessStart, PtySize, Signal, SignalSend};
use service::sandbox::sandboxes::Sandboxes;
use service::sandbox::SandboxId;
use service::ErrorKind;

/// A client that reads nothing for this long is disconnected (its program runs on).
pub const STALLED: Duration = Duration::from_secs(60);
/// What one read of the terminal asks for, and how long it waits for a byte.
const READ_BYTES: u64 = 64 << 10;
const READ_WAIT_SECS: f64 = 20.0;
/// The largest message a client may send.
const MAX_MESSAGE: usize = 1 << 20;
/// The shell a socket starts when it names no command: bash when the image has it.
const SHELL: &str = "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi";

/// `?rows=&cols=&command=&cwd=&user=&pid=&keep=`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PtyQuery {
    #[serde(default)]
    rows: Option<u16>,
    #[serde(default)]
    cols: Option<u16>,
    /// A shell command line to run on the terminal (default: a login shell).
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    user: Option<String>,
    /// Attach to this background process's terminal instead of starting one.
    #[serde(default)]
    pid: Option<u32>,
    /// The output offset to replay from when attaching (default 0: all the ring kept).
    #[serde(default)]
    offset: Option<u64>,
    /// Keep a program this socket started running when the socket closes (by default it is
    /// hung up on, as a closed terminal window does).
    #[serde(default)]
    keep: bool,
}

impl QueryOf for PtyQuery {}

/// What the service says on the socket, as text.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PtyEvent {
    /// The terminal's process (first message).
    Started { pid: u32 },
    /// Output that overflowed the ring before it was sent.
    Dropped { bytes: u64 },
    /// The process ended; the socket closes.
    Exit {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
    /// A message the service could not act on, or why the socket closes.
    Error { error: String },
}

/// What a client may say on the socket, as text (binary messages are keys).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum PtyControl {
    Resize {
        rows: u16,
        cols: u16,
    },
    /// Keys as text.
    Input {
        data: String,
    },
}

pub(super) async fn open(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Mine(id): Mine,
    Q(q): Q<PtyQuery>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    match start(app, who, id, q, ws).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn start(
    app: App,
    who: Who,
    id: SandboxId,
    q: PtyQuery,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => {
            let why = format!(
                "{} (a terminal is a WebSocket: connect with a WebSocket client)",
                e.body_text()
            );
            return Ok(crate::serve::error::refuse(e.status(), why));
        }
    };
    let sandboxes = app
        .service
        .sandbox
        .as_ref()
        .ok_or_else(|| {
            ApiError::new(
                ErrorKind::NotFound,
                "the sandbox API is off here (serve.sandboxes.enabled = false)",
            )
        })?
        .sandboxes
        .clone();
    let size = match (q.rows, q.cols) {
        (None, None) => None,
        (rows, cols) => Some(PtySize {
            rows: rows.unwrap_or(24),
            cols: cols.unwrap_or(80),
        }),
    };
    let held = app.service.tenancy.hold(&who)?;
    let (pid, offset, hang_up) = process_of(&sandboxes, &id, q, size).await?;
    let terminal = Terminal {
        sandboxes,
        id,
        pid,
        hang_up,
    };
    Ok(ws
        .max_message_size(MAX_MESSAGE)
        .on_upgrade(move |socket| terminal.serve(socket, offset, held)))
}

/// The terminal's process: (its pid, the offset to replay from, whether to hang up on it at
/// the end): the one asked for with `pid`, or a new one.
async fn process_of(
    sandboxes: &Sandboxes,
    id: &SandboxId,
    q: PtyQuery,
    size: Option<PtySize>,
) -> Result<(u32, u64, bool), ApiError> {
    Ok(match q.pid {
        Some(pid) => {
            if q.command.is_some() || q.cwd.is_some() || q.user.is_some() || q.keep {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    "pid",
                    "attaching to a process takes rows, cols and offset only",
                ));
            }
            let process = sandboxes.process(id, pid).await?;
            if !process.pty {
                return Err(ApiError::field(
                    ErrorKind::Conflict,
                    "pid",
                    format!("process {pid} has no terminal: start it with pty, or read its output"),
                ));
            }
            if let Some(size) = size {
                sandboxes.resize(id, pid, size).await?;
            }
            (pid, q.offset.unwrap_or(0), false)
        }
        None => {
            if q.offset.is_some() {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    "offset",
                    "offset is for attaching (with pid)",
                ));
            }
            let started = sandboxes
                .start_process(
                    id,
                    ProcessStart {
                        command: Some(q.command.unwrap_or_else(|| SHELL.into())),
                        argv: None,
                        cwd: q.cwd,
                        env: Default::default(),
                        user: q.user,
                        ring_bytes: None,
                        pty: Some(size.unwrap_or(PtySize { rows: 24, cols: 80 })),
                    },
                )
                .await?;
            (started.pid, 0, !q.keep)
        }
    })
}

struct Terminal {
    sandboxes: Arc<Sandboxes>,
    id: SandboxId,
    pid: u32,
    /// Hang up on the process when the socket closes.
    hang_up: bool,
}

impl Terminal {
    /// The socket, while `held` (one of its tenant's connections) lasts: it closes when the
    /// key that opened it is revoked.
    async fn serve(self, socket: WebSocket, offset: u64, mut held: Held) {
        let (mut sink, mut incoming) = socket.split();
        // One writer: output and notes queue here, so a client that never reads stalls only
        // this queue, and the output loop notices.
        let (tx, mut rx) = mpsc::channel::<Message>(8);
        let writer = tokio::spawn(async move {
            while let Some(message) = rx.recv().await {
                let last = matches!(message, Message::Close(_));
                match tokio::time::timeout(STALLED, sink.send(message)).await {
                    Ok(Ok(())) if !last => {}
                    _ => break,
                }
            }
        });
        let _ = tx.send(event(&PtyEvent::Started { pid: self.pid })).await;
        tokio::select! {
            _ = self.output(offset, &tx) => {}
            _ = self.input(&mut incoming, &tx) => {}
            _ = held.revoked() => {
                let error = "the key that opened this terminal was revoked or has expired".to_string();
                let _ = tx.try_send(event(&PtyEvent::Error { error }));
            }
        }
        drop(held);
        let _ = tx.try_send(Message::Close(None));
        drop(tx);
        let _ = writer.await;
        if self.hang_up {
            let hup = SignalSend {
                signal: Signal::Name("HUP".into()),
            };
            let _ = self.sandboxes.signal_process(&self.id, self.pid, hup).await;
        }
    }

    /// The terminal's output to the socket, until the process ends, the sandbox goes, or the
    /// client stalls.
    async fn output(&self, mut offset: u64, tx: &mpsc::Sender<Message>) {
        loop {
            let read = self
                .sandboxes
                .read_raw(&self.id, self.pid, Stream::Stdout, offset, READ_BYTES, READ_WAIT_SECS)
                .await;
            let (read, bytes) = match read {
                Ok(read) => read,
                Err(e) => {
                    let _ = queue(tx, event(&PtyEvent::Error { error: e.message })).await;
                    return;
                }
            };
            if read.dropped > 0 && !queue(tx, event(&PtyEvent::Dropped { bytes: read.dropped })).await {
                return;
            }
            if !bytes.is_empty() && !queue(tx, Message::Binary(bytes.into())).await {
                return;
            }
            offset = read.next;
            if read.eof {
                let end = self.sandboxes.wait_process(&self.id, self.pid, 10.0).await;
                let note = match end {
                    Ok(view) => PtyEvent::Exit {
                        exit_code: view.exit_code,
                        signal: view.signal,
                    },
                    Err(e) => PtyEvent::Error { error: e.message },
                };
                let _ = queue(tx, event(&note)).await;
                return;
            }
        }
    }

    /// The client's keys and resizes to the terminal, until the client closes.
    async fn input(&self, incoming: &mut futures::stream::SplitStream<WebSocket>, tx: &mpsc::Sender<Message>) {
        while let Some(Ok(message)) = incoming.next().await {
            let done = match message {
                Message::Binary(keys) => self.keys(keys.to_vec()).await,
                Message::Text(text) => match super::strict::parse::<PtyControl>(text.as_bytes()) {
                    Ok(PtyControl::Input { data }) => self.keys(data.into_bytes()).await,
                    Ok(PtyControl::Resize { rows, cols }) => self
                        .sandboxes
                        .resize(&self.id, self.pid, PtySize { rows, cols })
                        .await
                        .map(|_| ()),
                    Err(e) => Err(ApiError::new(
                        ErrorKind::Invalid,
                        format!(
                            "a text message is JSON: {{\"type\":\"resize\",\"rows\":R,\"cols\":C}} or {{\"type\":\"input\",\"data\":\"...\"}}: {e}"
                        ),
                    )),
                },
                Message::Close(_) => return,
                Message::Ping(_) | Message::Pong(_) => Ok(()),
            };
            if let Err(e) = done {
                // Told, not fatal: the terminal goes on (a full queue drops the note).
                let _ = tx.try_send(event(&PtyEvent::Error { error: e.message }));
            }
        }
    }
}

impl Terminal {
    /// Keys to the terminal. A program that does not read its terminal takes what the
    /// terminal's buffer holds and no more: the rest is offered again, and the socket is not
    /// read meanwhile (backpressure to the client), until [`STALLED`] passes without a key
    /// taken; then the client is told what was not delivered. The sandbox goes on.
    async fn keys(&self, mut keys: Vec<u8>) -> Result<(), ApiError> {
        let mut wait = Duration::from_millis(50);
        let mut since = tokio::time::Instant::now();
        loop {
            let taken = self
                .sandboxes
                .write_raw(&self.id, self.pid, keys.clone(), false)
                .await? as usize;
            keys.drain(..taken.min(keys.len()));
            if keys.is_empty() {
                return Ok(());
            }
            if taken > 0 {
                since = tokio::time::Instant::now();
                wait = Duration::from_millis(50);
            } else if since.elapsed() >= STALLED {
                return Err(ApiError::new(
                    ErrorKind::Conflict,
                    format!(
                        "the terminal's program read none of its input for {} s: {} bytes of keys were not delivered",
                        STALLED.as_secs(),
                        keys.len()
                    ),
                ));
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(1));
        }
    }
}

fn event(event: &PtyEvent) -> Message {
    Message::Text(serde_json::to_string(event).expect("events serialize").into())
}

/// Queues a message for the writer; false when the client is gone or stalled.
async fn queue(tx: &mpsc::Sender<Message>, message: Message) -> bool {
    matches!(tokio::time::timeout(STALLED, tx.send(message)).await, Ok(Ok(())))
}
