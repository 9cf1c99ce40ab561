//! The HTTP routes of the sandbox API (`/v1/contexts`, `/v1/environments`,
//! `/v1/sandboxes`); the reference is `docs/sandbox-api.md`.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::Event;
use axum::response::IntoResponse;
use serde::Deserialize;

use super::error::{ApiError, HttpError};
use super::http::{
    body_digest, finish, idempotency_key, made, ok, parse, sse, App, Mine, MyEnvironment, QueryOf, Reply, Q,
};
use super::tenancy::Who;
use axum::Extension;
use service::sandbox::environments::EnvironmentRequest;
use service::sandbox::sandboxes::kept::ResumeRequest;
use service::sandbox::sandboxes::lifetimes::{BranchRequest, ListFilter, TimeoutRequest};
use service::sandbox::sandboxes::{ExecRequest, NetworkChange, SandboxRequest, StreamEvent, MAX_FILE_BYTES};
use service::sandbox::SandboxApi;
use service::wire::{Deleted, SandboxBranched, SandboxList, StreamData, StreamError};
use service::ErrorKind;

/// An event's data, as JSON text.
fn encode(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).expect("events serialize")
}

/// Largest body of a folder upload (it travels to the guest in one agent request).
pub(super) const MAX_FOLDER_UPLOAD: usize = 64 << 20;

fn api(app: &App) -> Result<&SandboxApi, ApiError> {
    app.service.sandbox_api()
}

pub(super) async fn upload_context(State(app): State<App>, Extension(who): Extension<Who>, body: Bytes) -> Reply {
    let max = api(&app)?.environments.contexts.max_bytes();
    if body.len() as u64 > max {
        return Err(HttpError::from(ApiError::new(
            ErrorKind::TooLarge,
            format!(
                "the context is larger than {} MiB (serve.sandboxes.max_context_mib)",
                max >> 20
            ),
        )));
    }
    let service = app.service.clone();
    let uploaded = finish(async move { service.upload_context(&who, body.to_vec()).await }).await?;
    made(StatusCode::CREATED, &uploaded.context.clone(), uploaded)
}

pub(super) async fn create_environment(State(app): State<App>, Extension(who): Extension<Who>, body: Bytes) -> Reply {
    let request: EnvironmentRequest = parse(&body)?;
    let service = app.service.clone();
    let (view, accepted) = finish(async move { service.create_environment(&who, request) }).await?;
    let status = if accepted { StatusCode::ACCEPTED } else { StatusCode::OK };
    made(status, &view.id.clone(), view)
}

pub(super) async fn list_environments(State(app): State<App>, Extension(who): Extension<Who>) -> Reply {
    ok(app.service.environments(&who)?)
}

pub(super) async fn get_environment(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    MyEnvironment(id): MyEnvironment,
) -> Reply {
    ok(app.service.environment_view(&who, &id)?)
}

pub(super) async fn delete_environment(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    MyEnvironment(id): MyEnvironment,
) -> Reply {
    ok(app.service.delete_environment(&who, &id)?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LogsQuery {
    #[serde(default)]
    offset: usize,
    #[serde(default)]
    wait: f64,
}

impl QueryOf for LogsQuery {}

pub(super) async fn environment_logs(
    State(app): State<App>,
    MyEnvironment(id): MyEnvironment,
    Q(q): Q<LogsQuery>,
) -> Reply {
    if !(0.0..=300.0).contains(&q.wait) {
        return Err(HttpError::from(ApiError::field(
            ErrorKind::Invalid,
            "wait",
            "must be 0 to 300 seconds",
        )));
    }
    ok(app
        .service
        .environment_logs(&id, q.offset, Duration::from_secs_f64(q.wait))
        .await?)
}

pub(super) async fn create_sandbox(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let request: SandboxRequest = parse(&body)?;
    let key = idempotency_key(&headers)?.map(|k| (k, body_digest(&body)));
    let service = app.service.clone();
    let (view, made) = finish(async move { service.create_sandbox(&who, request, key).await }).await?;
    match made {
        true => self::made(StatusCode::CREATED, &view.id.clone(), view),
        false => ok(view),
    }
}

pub(super) async fn list_sandboxes(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Q(q): Q<BTreeMap<String, String>>,
) -> Reply {
    let filter = ListFilter::parse(q)?;
    ok(SandboxList {
        sandboxes: api(&app)?.sandboxes.list(&who, &filter).await,
    })
}

pub(super) async fn checkpoint(State(app): State<App>, Extension(who): Extension<Who>, Mine(id): Mine) -> Reply {
    ok(app.service.checkpoint_sandbox(&who, &id).await?)
}

pub(super) async fn reset(State(app): State<App>, Mine(id): Mine) -> Reply {
    ok(api(&app)?.sandboxes.reset(&id).await?)
}

pub(super) async fn set_timeout(State(app): State<App>, Mine(id): Mine, body: Bytes) -> Reply {
    let request: TimeoutRequest = parse(&body)?;
    ok(api(&app)?.sandboxes.set_timeout(&id, request).await?)
}

pub(super) async fn set_network(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Mine(id): Mine,
    body: Bytes,
) -> Reply {
    let change: NetworkChange = parse(&body)?;
    ok(api(&app)?.sandboxes.set_network(&who, &id, change).await?)
}

pub(super) async fn get_sandbox(State(app): State<App>, Mine(id): Mine) -> Reply {
    ok(api(&app)?.sandboxes.view(&id).await?)
}

pub(super) async fn delete_sandbox(State(app): State<App>, Mine(id): Mine) -> Reply {
    api(&app)?.sandboxes.delete(&id, "deleted").await?;
    ok(Deleted {
        id: id.to_string(),
        deleted: true,
    })
}

pub(super) async fn exec(State(app): State<App>, Mine(id): Mine, body: Bytes) -> Reply {
    let request: ExecRequest = parse(&body)?;
    let out = api(&app)?.sandboxes.exec(&id, request).await?;
    Ok(axum::Json(out).into_response())
}

pub(super) async fn exec_stream(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Mine(id): Mine,
    body: Bytes,
) -> Reply {
    let request: ExecRequest = parse(&body)?;
    let held = app.service.tenancy.hold(&who)?;
    let rx = api(&app)?.sandboxes.exec_stream(&id, request).await?;
    Ok(sse(rx, held, |event| {
        let (name, data) = match event {
            StreamEvent::Stdout(data) => ("stdout", encode(&StreamData { data })),
            StreamEvent::Stderr(data) => ("stderr", encode(&StreamData { data })),
            StreamEvent::Exit(end) => ("exit", encode(&end)),
            StreamEvent::Error(error) => ("error", encode(&StreamError { error })),
        };
        (
            Event::default().event(name).data(&data),
            matches!(name, "exit" | "error"),
        )
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PathQuery {
    path: String,
    /// Octal (`644`, `0644` or `0o644`).
    #[serde(default)]
    mode: Option<String>,
}

impl QueryOf for PathQuery {
    const FIELD: Option<&'static str> = Some("path");
    const HINT: &'static str = " (give ?path=/absolute/guest/path)";
}

fn mode_of(mode: Option<&str>) -> Result<u32, ApiError> {
    let Some(text) = mode else { return Ok(0o644) };
    let digits = text.strip_prefix("0o").unwrap_or(text);
    match u32::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(ApiError::field(
            ErrorKind::Invalid,
            "mode",
            "must be an octal file mode (e.g. 644 or 0755)",
        )),
    }
}

pub(super) async fn write_file(State(app): State<App>, Mine(id): Mine, Q(q): Q<PathQuery>, body: Bytes) -> Reply {
    let mode = mode_of(q.mode.as_deref())?;
    if body.len() as u64 > MAX_FILE_BYTES {
        return Err(HttpError::from(ApiError::new(
            ErrorKind::TooLarge,
            format!("a file upload is at most {} MiB", MAX_FILE_BYTES >> 20),
        )));
    }
    ok(api(&app)?
        .sandboxes
        .write_file(&id, &q.path, mode, body.to_vec())
        .await?)
}

pub(super) async fn read_file(State(app): State<App>, Mine(id): Mine, Q(q): Q<PathQuery>) -> Reply {
    let bytes = api(&app)?.sandboxes.read_file(&id, &q.path).await?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

pub(super) async fn write_folder(State(app): State<App>, Mine(id): Mine, Q(q): Q<PathQuery>, body: Bytes) -> Reply {
    if q.mode.is_some() {
        return Err(HttpError::from(ApiError::field(
            ErrorKind::Invalid,
            "mode",
            "a folder's modes come from its archive",
        )));
    }
    if body.len() > MAX_FOLDER_UPLOAD {
        return Err(HttpError::from(ApiError::new(
            ErrorKind::TooLarge,
            format!("a folder upload is at most {} MiB", MAX_FOLDER_UPLOAD >> 20),
        )));
    }
    ok(api(&app)?.sandboxes.write_folder(&id, &q.path, body.to_vec()).await?)
}

pub(super) async fn read_folder(State(app): State<App>, Mine(id): Mine, Q(q): Q<PathQuery>) -> Reply {
    let bytes = api(&app)?.sandboxes.read_folder(&id, &q.path).await?;
    Ok(([(header::CONTENT_TYPE, "application/x-tar")], bytes).into_response())
}

/// `?path=&max=` of a listing.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    path: String,
    #[serde(default)]
    max: Option<u64>,
}

impl QueryOf for ListQuery {
    const HINT: &'static str = " (path=/a/folder&max=N)";
}

pub(super) async fn stat(State(app): State<App>, Mine(id): Mine, Q(q): Q<PathQuery>) -> Reply {
    ok(api(&app)?.sandboxes.stat(&id, &q.path).await?)
}

pub(super) async fn entries(State(app): State<App>, Mine(id): Mine, Q(q): Q<ListQuery>) -> Reply {
    ok(api(&app)?.sandboxes.list_folder(&id, &q.path, q.max).await?)
}

pub(super) async fn branch(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Mine(id): Mine,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let request: BranchRequest = parse(if body.is_empty() { b"{}" } else { &body })?;
    let key = idempotency_key(&headers)?.map(|k| (k, body_digest(&body)));
    let service = app.service.clone();
    let (answer, made) = finish(async move { service.branch_sandbox(&who, &id, request, key).await }).await?;
    let first = match &answer {
        SandboxBranched::One(view) => view.id.clone(),
        SandboxBranched::Many(list) => list.sandboxes.first().map(|v| v.id.clone()).unwrap_or_default(),
    };
    match made {
        true => self::made(StatusCode::CREATED, &first, answer),
        false => ok(answer),
    }
}

pub(super) async fn pause(State(app): State<App>, Extension(who): Extension<Who>, Mine(id): Mine) -> Reply {
    ok(app.service.pause_sandbox(&who, &id).await?)
}

pub(super) async fn resume(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Mine(id): Mine,
    body: Bytes,
) -> Reply {
    let request: ResumeRequest = if body.is_empty() {
        ResumeRequest::default()
    } else {
        parse(&body)?
    };
    let service = app.service.clone();
    ok(finish(async move { service.resume_sandbox(&who, &id, request.keep).await }).await?)
}

pub(super) async fn snapshot(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Mine(id): Mine,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let key = idempotency_key(&headers)?.map(|k| (k, body_digest(&body)));
    let service = app.service.clone();
    let (env, made) = finish(async move { service.snapshot_sandbox(&who, &id, key).await }).await?;
    match made {
        true => self::made(StatusCode::CREATED, &env.id.clone(), env),
        false => ok(env),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_octal() {
        assert_eq!(mode_of(None).unwrap(), 0o644);
        assert_eq!(mode_of(Some("755")).unwrap(), 0o755);
        assert_eq!(mode_of(Some("0o600")).unwrap(), 0o600);
        assert_eq!(mode_of(Some("0644")).unwrap(), 0o644);
        for bad in ["9", "rw", "77777", ""] {
            assert_eq!(mode_of(Some(bad)).unwrap_err().field.as_deref(), Some("mode"), "{bad}");
        }
    }
}
