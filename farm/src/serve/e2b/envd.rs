//! envd's routes, as E2B's SDK reaches them in a sandbox: processes over Connect RPC
//! (`/process.Process/*`), files over plain HTTP (`/files`) and `/health`; the filesystem
//! RPCs are in [`super::filesystem`]. A request
//! names its sandbox in `E2b-Sandbox-Id` and carries that sandbox's access token; the token
//! opens these routes of that one sandbox and no other route (see [`InSandbox`]).

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Multipart, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Extension;
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect::{self, STREAM_TYPE};
use super::{no_content, refused, typed, FileQuery, SANDBOX_HEADER};
use crate::serve::error::HttpError;
use crate::serve::http::{App, QueryOf, Reply, Q};
use crate::serve::tenancy::Who;
use farm_protocol::process::Stream;
use service::sandbox::sandboxes::processes::{FollowEvent, ProcessStart, PtySize, Signal, SignalSend};
use service::sandbox::SandboxId;
use service::ErrorKind;

/// How often a quiet process stream says it is alive (the SDK asks for every 50 s).
const KEEPALIVE: Duration = Duration::from_secs(30);

/// The sandbox an in-sandbox request names (`E2b-Sandbox-Id`), held to the caller: the
/// caller must have been identified by that very sandbox's access token, so a token opens
/// its own sandbox's routes and a tenant's key opens none of them.
pub(in crate::serve) struct InSandbox(pub SandboxId);

impl FromRequestParts<App> for InSandbox {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, app: &App) -> Result<InSandbox, HttpError> {
        let named = parts
            .headers
            .get(SANDBOX_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let who = parts
            .extensions
            .get::<Who>()
            .ok_or_else(|| refused(ErrorKind::Internal, "a route outside the tenancy layer"))?;
        let sandbox = match (who.sandbox_access(), who.signed_file()) {
            (Some(held), _) if !named.is_empty() && held == named => held,
            // A signed file URL names its sandbox by its signature alone (and only `/files`
            // is identified so: `signed_claim`).
            (None, Some(signed)) if parts.uri.path() == "/files" && (named.is_empty() || named == signed) => signed,
            _ => {
                return Err(HttpError::from(service::tenancy::unauthorized(
                    "a sandbox's own routes need its access token (X-Access-Token) and its id (E2b-Sandbox-Id)",
                )))
            }
        };
        Ok(InSandbox(app.service.sandbox_api()?.sandboxes.resolve(who, sandbox)?))
    }
}

pub(super) fn sandboxes(app: &App) -> Result<&std::sync::Arc<service::sandbox::Sandboxes>, service::ApiError> {
    Ok(&app.service.sandbox_api()?.sandboxes)
}

/// `GET /health`: 204 while the sandbox is there.
pub(in crate::serve) async fn health(State(app): State<App>, InSandbox(id): InSandbox) -> Reply {
    sandboxes(&app)?.view(&id).await?;
    Ok(no_content())
}

impl QueryOf for FileQuery {}

/// `GET /files?path=`: the file's bytes (404 when there is none).
pub(in crate::serve) async fn download(State(app): State<App>, InSandbox(id): InSandbox, Q(q): Q<FileQuery>) -> Reply {
    let path = q
        .path
        .ok_or_else(|| refused(ErrorKind::Invalid, "path: the file to read"))?;
    let bytes = sandboxes(&app)?.read_file(&id, &path).await?;
    Ok(typed(StatusCode::OK, "application/octet-stream", bytes))
}

/// `POST /files?path=`: one or more files, as multipart parts (`file`, the filename its
/// path when there is no `path`) or as one octet-stream body. The answer lists each.
pub(in crate::serve) async fn upload(
    State(app): State<App>,
    InSandbox(id): InSandbox,
    Q(q): Q<FileQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let content_type = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    if content_type.starts_with("multipart/form-data") {
        let request = axum::http::Request::builder()
            .header(axum::http::header::CONTENT_TYPE, content_type)
            .body(Body::from(body))
            .map_err(|e| refused(ErrorKind::Invalid, e.to_string()))?;
        let mut form = <Multipart as axum::extract::FromRequest<()>>::from_request(request, &())
            .await
            .map_err(|e| refused(ErrorKind::Invalid, format!("the multipart body: {}", e.body_text())))?;
        while let Some(field) = form
            .next_field()
            .await
            .map_err(|e| refused(ErrorKind::Invalid, format!("the multipart body: {e}")))?
        {
            let name = field.file_name().map(str::to_string);
            let path = match (&q.path, name) {
                (Some(path), _) => path.clone(),
                (None, Some(name)) => name,
                (None, None) => return Err(refused(ErrorKind::Invalid, "a file part names no path")),
            };
            let bytes = field
                .bytes()
                .await
                .map_err(|e| refused(ErrorKind::Invalid, format!("the multipart body: {e}")))?;
            files.push((path, bytes.to_vec()));
        }
    } else {
        let path = q
            .path
            .clone()
            .ok_or_else(|| refused(ErrorKind::Invalid, "path: where to write"))?;
        files.push((path, body.to_vec()));
    }
    if files.is_empty() {
        return Err(refused(ErrorKind::Invalid, "no file in the request"));
    }
    let mut written = Vec::new();
    for (path, bytes) in files {
        sandboxes(&app)?.write_file(&id, &path, 0o644, bytes).await?;
        let name = path.rsplit('/').next().unwrap_or(&path).to_string();
        written.push(json!({ "name": name, "type": "file", "path": path }));
    }
    Ok(axum::Json(written).into_response())
}

/// `process.StartRequest` as JSON.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(in crate::serve) struct StartRequest {
    process: ProcessConfig,
    pty: Option<Pty>,
    #[allow(dead_code)] // a tag names a process for Connect and List, which come later
    tag: Option<String>,
    #[serde(default)]
    stdin: Option<bool>,
}

/// `process.PTY`: a terminal of this size.
#[derive(Debug, Deserialize)]
pub(in crate::serve) struct Pty {
    size: Option<PtyCells>,
}

#[derive(Debug, Deserialize)]
struct PtyCells {
    cols: u16,
    rows: u16,
}

impl Pty {
    fn size(&self) -> Result<PtySize, HttpError> {
        let size = self
            .size
            .as_ref()
            .ok_or_else(|| refused(ErrorKind::Invalid, "pty.size: the terminal's cols and rows"))?;
        Ok(PtySize {
            rows: size.rows,
            cols: size.cols,
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

/// `POST /process.Process/Start` and `/Connect`: a process's events as a stream. Start runs
/// the process in the background of the sandbox (so it has a pid, and its output and end are
/// kept) and streams from its first byte; Connect streams a running one's from now on. Each
/// stream is `start` with the pid, `data` as output comes, `end` with the exit code, and a
/// keepalive on a quiet stream. Past the call's `connect-timeout-ms` the process is killed
/// and the stream ends with `deadline_exceeded`.
pub(in crate::serve) async fn process_stream(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    InSandbox(id): InSandbox,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let held = app.service.tenancy.hold(&who)?;
    let sandboxes = sandboxes(&app)?.clone();
    let (pid, pty, from) = match uri.path().ends_with("/Connect") {
        true => joined(&sandboxes, &id, &body).await?,
        false => started(&sandboxes, &id, &headers, &body).await?,
    };
    let followed = Followed {
        sandboxes,
        id,
        pid,
        pty,
    };
    followed.answer(from, deadline_of(&headers), held).await
}

/// The process a Start request makes: its pid, whether it is on a terminal, and where its
/// output is to be read from (its start).
async fn started(
    sandboxes: &service::sandbox::Sandboxes,
    id: &SandboxId,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(u32, bool, [u64; 2]), HttpError> {
    let request: StartRequest = connect::request(body)?;
    let pty = request.pty.as_ref().map(Pty::size).transpose()?;
    let mut argv = vec![request.process.cmd];
    argv.extend(request.process.args);
    let start = ProcessStart {
        command: None,
        argv: Some(argv),
        cwd: request.process.cwd,
        env: request.process.envs,
        user: basic_user(headers)?,
        ring_bytes: None,
        pty,
    };
    let pid = sandboxes.start_process(id, start).await?.pid;
    if pty.is_none() && request.stdin != Some(true) {
        // No input is coming: the process reads end-of-file, as envd gives it.
        let _ = sandboxes.write_raw(id, pid, Vec::new(), true).await;
    }
    Ok((pid, pty.is_some(), [0, 0]))
}

/// The running process a Connect request names, and its output's offsets now.
async fn joined(
    sandboxes: &service::sandbox::Sandboxes,
    id: &SandboxId,
    body: &[u8],
) -> Result<(u32, bool, [u64; 2]), HttpError> {
    let request: Selected = connect::request(body)?;
    let view = sandboxes.process(id, request.process.pid()?).await?;
    Ok((view.pid, view.pty, [view.stdout_bytes, view.stderr_bytes]))
}

/// The guest user a call names (`Authorization: Basic base64("USER:")`, which E2B's SDK sends
/// when its caller passes `user=`): None for the environment's own.
fn basic_user(headers: &HeaderMap) -> Result<Option<String>, HttpError> {
    let Some(value) = headers.get(axum::http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let bad = || {
        refused(
            ErrorKind::Invalid,
            "Authorization: Basic base64(\"USER:\") names a guest user",
        )
    };
    let encoded = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Basic "))
        .ok_or_else(bad)?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| bad())?;
    let text = String::from_utf8(decoded).map_err(|_| bad())?;
    let user = text.split(':').next().unwrap_or("");
    Ok((!user.is_empty()).then(|| user.to_string()))
}

/// When a call's `connect-timeout-ms` runs out.
pub(super) fn deadline_of(headers: &HeaderMap) -> Option<tokio::time::Instant> {
    headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms))
}

/// A process whose events a stream follows.
struct Followed {
    sandboxes: std::sync::Arc<service::sandbox::Sandboxes>,
    id: SandboxId,
    pid: u32,
    /// On a terminal: its output is `pty` data.
    pty: bool,
}

impl Followed {
    /// The answer of a process stream: its events from these offsets of its output.
    async fn answer(
        self,
        from: [u64; 2],
        deadline: Option<tokio::time::Instant>,
        held: service::tenancy::Held,
    ) -> Reply {
        let events = self.sandboxes.follow_output(&self.id, self.pid, from).await?;
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
        tokio::spawn(stream_events(self, events, deadline, tx, held));
        Ok(event_stream(rx))
    }
}

/// A Connect stream's answer: the envelopes `rx` gives, each sent as it comes (one waits at
/// most: nothing is made ahead of the client).
pub(super) fn event_stream(rx: tokio::sync::mpsc::Receiver<Bytes>) -> axum::response::Response {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((Ok::<_, std::convert::Infallible>(chunk), rx))
    });
    typed(StatusCode::OK, STREAM_TYPE, Body::from_stream(stream))
}

/// The events of process `pid` as Connect envelopes into `tx`, as [`process_stream`] says, while
/// `held` (the caller's connection) lasts.
async fn stream_events(
    followed: Followed,
    mut events: tokio::sync::mpsc::Receiver<FollowEvent>,
    deadline: Option<tokio::time::Instant>,
    tx: tokio::sync::mpsc::Sender<Bytes>,
    held: service::tenancy::Held,
) {
    let _held = held;
    let Followed {
        sandboxes,
        id,
        pid,
        pty,
    } = followed;
    let send = |message: Value| {
        let tx = tx.clone();
        async move { tx.send(Bytes::from(connect::frame(&message))).await.is_ok() }
    };
    if !send(json!({ "event": { "start": { "pid": pid } } })).await {
        return;
    }
    loop {
        let next = async {
            match deadline {
                Some(at) => tokio::time::timeout_at(at, tokio::time::timeout(KEEPALIVE, events.recv())).await,
                None => Ok(tokio::time::timeout(KEEPALIVE, events.recv()).await),
            }
        };
        let event = match next.await {
            Err(_) => {
                let kill = SignalSend {
                    signal: Signal::Name("KILL".into()),
                };
                let _ = sandboxes.signal_process(&id, pid, kill).await;
                let _ = tx
                    .send(Bytes::from(connect::end(Some((
                        "deadline_exceeded",
                        "the command's timeout passed",
                    )))))
                    .await;
                return;
            }
            Ok(Err(_)) => {
                if !send(json!({ "event": { "keepalive": {} } })).await {
                    return;
                }
                continue;
            }
            Ok(Ok(event)) => event,
        };
        let (frames, last) = envelopes(event, pty);
        for frame in frames {
            if tx.send(Bytes::from(frame)).await.is_err() {
                return;
            }
        }
        if last {
            return;
        }
    }
}

/// The envelopes of one event of a followed process (on a terminal: its output is `pty`
/// data), and whether the stream ends with them.
fn envelopes(event: Option<FollowEvent>, pty: bool) -> (Vec<Vec<u8>>, bool) {
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    match event {
        None => (
            vec![connect::end(Some(("internal", "the process's output stopped")))],
            true,
        ),
        Some(FollowEvent::Output(_, chunk)) if chunk.data.is_empty() => (Vec::new(), false),
        Some(FollowEvent::Output(stream, chunk)) => {
            let key = match stream {
                _ if pty => "pty",
                Stream::Stdout => "stdout",
                _ => "stderr",
            };
            let data = json!({ "event": { "data": { key: b64(chunk.data.as_bytes()) } } });
            (vec![connect::frame(&data)], false)
        }
        Some(FollowEvent::Exit(view)) => {
            let code = view.exit_code.unwrap_or_else(|| -view.signal.unwrap_or(0));
            let status = match view.signal {
                Some(signal) => format!("signal: {signal}"),
                None => format!("exit status {code}"),
            };
            let end = json!({ "event": { "end": { "exitCode": code, "exited": true, "status": status } } });
            (vec![connect::frame(&end), connect::end(None)], true)
        }
        Some(FollowEvent::Error(error)) => (vec![connect::end(Some(("unavailable", &error)))], true),
    }
}

/// A unary RPC's answer: its JSON message.
pub(super) fn message(value: Value) -> Reply {
    Ok(axum::Json(value).into_response())
}

/// `process.ProcessSelector`: a pid (a tag names no process here).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(in crate::serve) struct Selector {
    pid: Option<u32>,
    tag: Option<String>,
}

impl Selector {
    fn pid(&self) -> Result<u32, HttpError> {
        match (self.pid, &self.tag) {
            (Some(pid), _) => Ok(pid),
            (None, Some(_)) => Err(refused(ErrorKind::Invalid, "process.tag: farm names processes by pid")),
            (None, None) => Err(refused(ErrorKind::Invalid, "process: a pid is required")),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(in crate::serve) struct Selected {
    process: Selector,
    signal: Option<String>,
    input: Option<BTreeMap<String, String>>,
    pty: Option<Pty>,
}

/// `POST /process.Process/Update`: a terminal's new size.
pub(in crate::serve) async fn update(State(app): State<App>, InSandbox(id): InSandbox, body: Bytes) -> Reply {
    let request: Selected = connect::unary(&body)?;
    let pid = request.process.pid()?;
    let size = request
        .pty
        .as_ref()
        .ok_or_else(|| refused(ErrorKind::Invalid, "pty: the terminal's new size"))?
        .size()?;
    sandboxes(&app)?.resize(&id, pid, size).await?;
    message(json!({}))
}

/// `POST /process.Process/List`: the sandbox's processes that still run.
pub(in crate::serve) async fn list_processes(State(app): State<App>, InSandbox(id): InSandbox) -> Reply {
    let processes = sandboxes(&app)?.processes(&id).await?;
    let running: Vec<Value> = processes
        .processes
        .iter()
        .filter(|p| p.state == "running")
        .map(|p| {
            let mut argv = p.command.split(' ').map(str::to_string);
            let cmd = argv.next().unwrap_or_default();
            json!({ "pid": p.pid, "config": { "cmd": cmd, "args": argv.collect::<Vec<_>>() } })
        })
        .collect();
    message(json!({ "processes": running }))
}

/// `POST /process.Process/SendSignal`: SIGKILL or SIGTERM to a process (its group).
pub(in crate::serve) async fn send_signal(State(app): State<App>, InSandbox(id): InSandbox, body: Bytes) -> Reply {
    let request: Selected = connect::unary(&body)?;
    let pid = request.process.pid()?;
    let name = match request.signal.as_deref() {
        Some("SIGNAL_SIGKILL") | Some("9") => "KILL",
        Some("SIGNAL_SIGTERM") | Some("15") => "TERM",
        other => {
            return Err(refused(
                ErrorKind::Invalid,
                format!("signal {other:?}: SIGNAL_SIGKILL or SIGNAL_SIGTERM"),
            ))
        }
    };
    let signal = SignalSend {
        signal: Signal::Name(name.into()),
    };
    sandboxes(&app)?.signal_process(&id, pid, signal).await?;
    message(json!({}))
}

/// `POST /process.Process/SendInput`: bytes (base64 in `input.stdin`) to its standard input.
pub(in crate::serve) async fn send_input(State(app): State<App>, InSandbox(id): InSandbox, body: Bytes) -> Reply {
    let request: Selected = connect::unary(&body)?;
    let pid = request.process.pid()?;
    let encoded = request
        .input
        .as_ref()
        .and_then(|input| input.get("stdin").or_else(|| input.get("pty")))
        .ok_or_else(|| {
            refused(
                ErrorKind::Invalid,
                "input.stdin (or input.pty): the bytes to write, base64",
            )
        })?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| refused(ErrorKind::Invalid, format!("input.stdin is not base64: {e}")))?;
    sandboxes(&app)?.write_raw(&id, pid, bytes, false).await?;
    message(json!({}))
}
