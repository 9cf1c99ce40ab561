//! envd's routes, as E2B's SDK reaches them in a sandbox: processes over Connect RPC
//! (`/process.Process/Start`), files over plain HTTP (`/files`) and `/health`. A request
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
use super::{no_content, refused, typed, SANDBOX_HEADER};
use crate::serve::error::HttpError;
use crate::serve::http::{App, QueryOf, Reply, Q};
use crate::serve::tenancy::Who;
use farm_protocol::process::Stream;
use service::sandbox::sandboxes::processes::{FollowEvent, ProcessStart, Signal, SignalSend};
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
        if named.is_empty() || who.sandbox_access() != Some(named) {
            return Err(HttpError::from(service::tenancy::unauthorized(
                "a sandbox's own routes need its access token (X-Access-Token) and its id (E2b-Sandbox-Id)",
            )));
        }
        Ok(InSandbox(app.service.sandbox_api()?.sandboxes.resolve(who, named)?))
    }
}

fn sandboxes(app: &App) -> Result<&std::sync::Arc<service::sandbox::Sandboxes>, service::ApiError> {
    Ok(&app.service.sandbox_api()?.sandboxes)
}

/// `GET /health`: 204 while the sandbox is there.
pub(in crate::serve) async fn health(State(app): State<App>, InSandbox(id): InSandbox) -> Reply {
    sandboxes(&app)?.view(&id).await?;
    Ok(no_content())
}

/// `?path=...&username=...` of `/files`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::serve) struct FileQuery {
    path: Option<String>,
    #[allow(dead_code)] // files are the sandbox user's: the one the environment runs as
    username: Option<String>,
    signature: Option<String>,
    signature_expiration: Option<u64>,
}

impl QueryOf for FileQuery {}

/// `GET /files?path=`: the file's bytes (404 when there is none).
pub(in crate::serve) async fn download(State(app): State<App>, InSandbox(id): InSandbox, Q(q): Q<FileQuery>) -> Reply {
    unsigned(&q)?;
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
    unsigned(&q)?;
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

/// Signed URLs (a file's URL without headers) are not served yet: refused by name.
fn unsigned(q: &FileQuery) -> Result<(), HttpError> {
    if q.signature.is_some() || q.signature_expiration.is_some() {
        return Err(refused(
            ErrorKind::Invalid,
            "signed file URLs are not served by farm yet: read and write files through the SDK's files calls",
        ));
    }
    Ok(())
}

/// `process.StartRequest` as JSON.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(in crate::serve) struct StartRequest {
    process: ProcessConfig,
    pty: Option<Value>,
    #[allow(dead_code)] // a tag names a process for Connect and List, which come later
    tag: Option<String>,
    #[serde(default)]
    stdin: Option<bool>,
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

/// `POST /process.Process/Start`: the process starts in the background of the sandbox (so
/// it has a pid, and its output and end are kept), and the answer streams its events:
/// `start` with its pid, `data` as its output comes, `end` with its exit code; a keepalive
/// on a quiet stream. Past the call's `connect-timeout-ms` the process is killed and the
/// stream ends with `deadline_exceeded`.
pub(in crate::serve) async fn start(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    InSandbox(id): InSandbox,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let request: StartRequest = connect::request(&body)?;
    if request.pty.is_some() {
        return Err(refused(
            ErrorKind::Invalid,
            "a terminal (pty) is not served over E2B's protocol yet",
        ));
    }
    let deadline = headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms));
    let held = app.service.tenancy.hold(&who)?;
    let sandboxes = sandboxes(&app)?.clone();
    let mut argv = vec![request.process.cmd];
    argv.extend(request.process.args);
    let start = ProcessStart {
        command: None,
        argv: Some(argv),
        cwd: request.process.cwd,
        env: request.process.envs,
        user: None,
        ring_bytes: None,
        pty: None,
    };
    let process = sandboxes.start_process(&id, start).await?;
    let pid = process.pid;
    if request.stdin != Some(true) {
        // No input is coming: the process reads end-of-file, as envd gives it.
        let _ = sandboxes.write_raw(&id, pid, Vec::new(), true).await;
    }
    let events = sandboxes.follow_output(&id, pid, [0, 0]).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
    tokio::spawn(stream_events(sandboxes, id, pid, events, deadline, tx, held));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((Ok::<_, std::convert::Infallible>(chunk), rx))
    });
    Ok(typed(StatusCode::OK, STREAM_TYPE, Body::from_stream(stream)))
}

/// The events of process `pid` as Connect envelopes into `tx`, as [`start`] says, while
/// `held` (the caller's connection) lasts.
async fn stream_events(
    sandboxes: std::sync::Arc<service::sandbox::Sandboxes>,
    id: SandboxId,
    pid: u32,
    mut events: tokio::sync::mpsc::Receiver<FollowEvent>,
    deadline: Option<tokio::time::Instant>,
    tx: tokio::sync::mpsc::Sender<Bytes>,
    held: service::tenancy::Held,
) {
    let _held = held;
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
        let (frames, last) = envelopes(event);
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

/// The envelopes of one event of a followed process, and whether the stream ends with them.
fn envelopes(event: Option<FollowEvent>) -> (Vec<Vec<u8>>, bool) {
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    match event {
        None => (
            vec![connect::end(Some(("internal", "the process's output stopped")))],
            true,
        ),
        Some(FollowEvent::Output(_, chunk)) if chunk.data.is_empty() => (Vec::new(), false),
        Some(FollowEvent::Output(stream, chunk)) => {
            let key = match stream {
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
fn message(value: Value) -> Reply {
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
        .and_then(|input| input.get("stdin"))
        .ok_or_else(|| refused(ErrorKind::Invalid, "input.stdin: the bytes to write, base64"))?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| refused(ErrorKind::Invalid, format!("input.stdin is not base64: {e}")))?;
    sandboxes(&app)?.write_raw(&id, pid, bytes, false).await?;
    message(json!({}))
}

/// A path of a filesystem RPC.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(in crate::serve) struct PathRequest {
    path: Option<String>,
    source: Option<String>,
    destination: Option<String>,
    depth: Option<u32>,
}

impl PathRequest {
    fn field(value: &Option<String>, name: &str) -> Result<String, HttpError> {
        value
            .clone()
            .filter(|p| !p.is_empty())
            .ok_or_else(|| refused(ErrorKind::Invalid, format!("{name}: an absolute path is required")))
    }
}

/// `filesystem.EntryInfo` of farm's entry at `path`.
fn entry_info(path: &str, entry: &service::wire::EntryView) -> Value {
    let kind = match entry.kind.as_str() {
        "dir" => "FILE_TYPE_DIRECTORY",
        "symlink" => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_FILE",
    };
    let name = path.rsplit('/').find(|s| !s.is_empty()).unwrap_or("/");
    json!({
        "name": name,
        "type": kind,
        "path": path,
        "size": entry.size.to_string(),
        "mode": entry.mode & 0o7777,
        "permissions": permissions(entry),
        "owner": entry.uid.to_string(),
        "group": entry.gid.to_string(),
        "modifiedTime": super::rfc3339(entry.modified_at_ms.max(0) as u64),
        "symlinkTarget": entry.target,
        "isSymlink": entry.kind == "symlink",
    })
}

/// `drwxr-xr-x` of an entry.
fn permissions(entry: &service::wire::EntryView) -> String {
    let kind = match entry.kind.as_str() {
        "dir" => 'd',
        "symlink" => 'l',
        _ => '-',
    };
    let mut text = String::from(kind);
    for shift in [6, 3, 0] {
        let bits = (entry.mode >> shift) & 7;
        text.push(if bits & 4 != 0 { 'r' } else { '-' });
        text.push(if bits & 2 != 0 { 'w' } else { '-' });
        text.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    text
}

/// `POST /filesystem.Filesystem/Stat`.
pub(in crate::serve) async fn stat(State(app): State<App>, InSandbox(id): InSandbox, body: Bytes) -> Reply {
    let request: PathRequest = connect::unary(&body)?;
    let path = PathRequest::field(&request.path, "path")?;
    let entry = sandboxes(&app)?.stat(&id, &path).await?;
    message(json!({ "entry": entry_info(&path, &entry) }))
}

/// `POST /filesystem.Filesystem/ListDir`: a folder's entries (depth 1; a deeper listing
/// walks the folders below, up to `depth`).
pub(in crate::serve) async fn list_dir(State(app): State<App>, InSandbox(id): InSandbox, body: Bytes) -> Reply {
    let request: PathRequest = connect::unary(&body)?;
    let root = PathRequest::field(&request.path, "path")?;
    let depth = request.depth.unwrap_or(1).clamp(1, 16);
    let sandboxes = sandboxes(&app)?;
    let mut entries = Vec::new();
    let mut folders = vec![(root.trim_end_matches('/').to_string(), 1)];
    while let Some((folder, level)) = folders.pop() {
        let listing = sandboxes
            .list_folder(&id, if folder.is_empty() { "/" } else { &folder }, None)
            .await?;
        for entry in &listing.entries {
            let path = format!("{folder}/{}", entry.name);
            if entry.kind == "dir" && level < depth {
                folders.push((path.clone(), level + 1));
            }
            entries.push(entry_info(&path, entry));
        }
    }
    message(json!({ "entries": entries }))
}

/// A command of the filesystem RPCs that have no call of their own in the core (`mkdir`,
/// `rm`, `mv`), run as argv (no shell): its exit code and stderr.
async fn run_argv(app: &App, id: &SandboxId, argv: &[&str]) -> Result<(i32, String), HttpError> {
    let request: service::sandbox::sandboxes::ExecRequest =
        serde_json::from_value(json!({ "argv": argv })).map_err(|e| refused(ErrorKind::Internal, e.to_string()))?;
    let out = sandboxes(app)?.exec(id, request).await?;
    Ok((out.exit_code.unwrap_or(-1), out.stderr))
}

/// `POST /filesystem.Filesystem/MakeDir`: the folder and its parents; `already_exists` when
/// it is there.
pub(in crate::serve) async fn make_dir(State(app): State<App>, InSandbox(id): InSandbox, body: Bytes) -> Reply {
    let request: PathRequest = connect::unary(&body)?;
    let path = PathRequest::field(&request.path, "path")?;
    if sandboxes(&app)?.stat(&id, &path).await.is_ok() {
        return Err(refused(ErrorKind::Conflict, format!("{path} exists")));
    }
    let (code, stderr) = run_argv(&app, &id, &["mkdir", "-p", "--", &path]).await?;
    if code != 0 {
        return Err(refused(ErrorKind::Invalid, format!("making {path}: {}", stderr.trim())));
    }
    let entry = sandboxes(&app)?.stat(&id, &path).await?;
    message(json!({ "entry": entry_info(&path, &entry) }))
}

/// `POST /filesystem.Filesystem/Remove`: a file, or a folder and all in it.
pub(in crate::serve) async fn remove(State(app): State<App>, InSandbox(id): InSandbox, body: Bytes) -> Reply {
    let request: PathRequest = connect::unary(&body)?;
    let path = PathRequest::field(&request.path, "path")?;
    sandboxes(&app)?.stat(&id, &path).await?;
    let (code, stderr) = run_argv(&app, &id, &["rm", "-rf", "--", &path]).await?;
    if code != 0 {
        return Err(refused(
            ErrorKind::Invalid,
            format!("removing {path}: {}", stderr.trim()),
        ));
    }
    message(json!({}))
}

/// `POST /filesystem.Filesystem/Move`.
pub(in crate::serve) async fn rename(State(app): State<App>, InSandbox(id): InSandbox, body: Bytes) -> Reply {
    let request: PathRequest = connect::unary(&body)?;
    let source = PathRequest::field(&request.source, "source")?;
    let destination = PathRequest::field(&request.destination, "destination")?;
    sandboxes(&app)?.stat(&id, &source).await?;
    let (code, stderr) = run_argv(&app, &id, &["mv", "-T", "--", &source, &destination]).await?;
    if code != 0 {
        return Err(refused(
            ErrorKind::Invalid,
            format!("moving {source}: {}", stderr.trim()),
        ));
    }
    let entry = sandboxes(&app)?.stat(&id, &destination).await?;
    message(json!({ "entry": entry_info(&destination, &entry) }))
}
