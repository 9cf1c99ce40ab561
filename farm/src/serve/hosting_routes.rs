//! The HTTP routes of what a sandbox hosts: its background processes
//! (`/v1/sandboxes/{id}/processes`) and its open ports (`/v1/sandboxes/{id}/ports`); the
//! reference is `docs/sandbox-api.md`.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::Event;
use axum::response::IntoResponse;
use farm_protocol::process::Stream;
use serde::Deserialize;

use super::error::ApiError;
use super::http::{ok, parse, sse, App, Mine, QueryOf, Reply, Q};
use super::tenancy::Who;
use axum::Extension;
use service::sandbox::sandboxes::processes::{FollowEvent, ProcessStart, PtySize, SignalSend, StdinWrite};
use service::sandbox::SandboxApi;
use service::wire::StreamError;
use service::ErrorKind;

fn api(app: &App) -> Result<&SandboxApi, ApiError> {
    app.service.sandbox_api()
}

/// The path's sandbox, held to the caller, and its process (`{pid}`).
pub(super) struct Process {
    sandbox: service::sandbox::SandboxId,
    pid: u32,
}

impl axum::extract::FromRequestParts<App> for Process {
    type Rejection = super::error::HttpError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, app: &App) -> Result<Process, Self::Rejection> {
        let Mine(sandbox) = Mine::from_request_parts(parts, app).await?;
        let Path((_, pid)) = Path::<(String, String)>::from_request_parts(parts, app)
            .await
            .map_err(|e| ApiError::new(ErrorKind::Invalid, e.body_text()))?;
        Ok(Process {
            sandbox,
            pid: pid_of(&pid)?,
        })
    }
}

pub(super) async fn start(State(app): State<App>, Mine(id): Mine, body: Bytes) -> Reply {
    let request: ProcessStart = parse(&body)?;
    let started = api(&app)?.sandboxes.start_process(&id, request).await?;
    Ok((StatusCode::CREATED, axum::Json(started)).into_response())
}

pub(super) async fn list(State(app): State<App>, Mine(id): Mine) -> Reply {
    ok(api(&app)?.sandboxes.processes(&id).await?)
}

pub(super) async fn one(State(app): State<App>, Process { sandbox: id, pid }: Process) -> Reply {
    ok(api(&app)?.sandboxes.process(&id, pid).await?)
}

/// `?stream=stdout|stderr&offset=N&max=BYTES&wait=SECS`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OutputQuery {
    #[serde(default = "stdout")]
    stream: Stream,
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    max: Option<u64>,
    #[serde(default)]
    wait: f64,
}

impl QueryOf for OutputQuery {}

fn stdout() -> Stream {
    Stream::Stdout
}

pub(super) async fn output(
    State(app): State<App>,
    Process { sandbox: id, pid }: Process,
    Q(q): Q<OutputQuery>,
) -> Reply {
    ok(api(&app)?
        .sandboxes
        .process_output(&id, pid, q.stream, q.offset, q.max, q.wait)
        .await?)
}

/// `?stdout=N&stderr=N`: the offsets to follow from.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FollowQuery {
    #[serde(default)]
    stdout: u64,
    #[serde(default)]
    stderr: u64,
}

impl QueryOf for FollowQuery {}

pub(super) async fn follow(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Process { sandbox: id, pid }: Process,
    Q(q): Q<FollowQuery>,
) -> Reply {
    let held = app.service.tenancy.hold(&who)?;
    let sandboxes = api(&app)?.sandboxes.clone();
    let rx = sandboxes.follow_output(&id, pid, [q.stdout, q.stderr]).await?;
    Ok(sse(rx, held, |event| {
        let (name, data, last) = match event {
            FollowEvent::Output(Stream::Stdout, chunk) => ("stdout", encode(&chunk), false),
            FollowEvent::Output(Stream::Stderr, chunk) => ("stderr", encode(&chunk), false),
            FollowEvent::Exit(view) => ("exit", encode(&view), true),
            FollowEvent::Error(error) => ("error", encode(&StreamError { error }), true),
        };
        (Event::default().event(name).data(&data), last)
    }))
}

/// A path's pid, or a 400 naming it.
fn pid_of(text: &str) -> Result<u32, ApiError> {
    text.parse().map_err(|_| {
        ApiError::field(
            ErrorKind::Invalid,
            "pid",
            format!("{text:?} is not a process id (a number)"),
        )
    })
}

fn encode(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).expect("events serialize")
}

pub(super) async fn stdin(State(app): State<App>, Process { sandbox: id, pid }: Process, body: Bytes) -> Reply {
    let request: StdinWrite = parse(&body)?;
    ok(api(&app)?.sandboxes.write_stdin(&id, pid, request).await?)
}

pub(super) async fn signal(State(app): State<App>, Process { sandbox: id, pid }: Process, body: Bytes) -> Reply {
    let request: SignalSend = parse(&body)?;
    ok(api(&app)?.sandboxes.signal_process(&id, pid, request).await?)
}

/// `?timeout=SECS` (default 60).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WaitQuery {
    #[serde(default = "sixty")]
    timeout: f64,
}

impl QueryOf for WaitQuery {}

fn sixty() -> f64 {
    60.0
}

pub(super) async fn wait(State(app): State<App>, Process { sandbox: id, pid }: Process, Q(q): Q<WaitQuery>) -> Reply {
    ok(api(&app)?.sandboxes.wait_process(&id, pid, q.timeout).await?)
}

pub(super) async fn resize(State(app): State<App>, Process { sandbox: id, pid }: Process, body: Bytes) -> Reply {
    let size: PtySize = parse(&body)?;
    ok(api(&app)?.sandboxes.resize(&id, pid, size).await?)
}

/// `POST /v1/sandboxes/{id}/ports`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PortOpen {
    /// The guest's TCP port (1-65535): its service listens on the guest's `127.0.0.1:PORT`.
    pub port: u64,
}

pub(super) async fn open_port(State(app): State<App>, Mine(id): Mine, body: Bytes) -> Reply {
    let request: PortOpen = parse(&body)?;
    let opened = api(&app)?.sandboxes.open_port(&id, request.port).await?;
    Ok((StatusCode::CREATED, axum::Json(opened)).into_response())
}

pub(super) async fn ports(State(app): State<App>, Mine(id): Mine) -> Reply {
    ok(api(&app)?.sandboxes.ports(&id).await?)
}

pub(super) async fn close_port(
    State(app): State<App>,
    Mine(id): Mine,
    Path((_, port)): Path<(String, String)>,
) -> Reply {
    let port: u16 = port
        .parse()
        .map_err(|_| ApiError::field(ErrorKind::Invalid, "port", format!("{port:?} is not a port (1-65535)")))?;
    ok(api(&app)?.sandboxes.close_port(&id, port).await?)
}
