//! The HTTP routes of the sandbox API (`/v1/contexts`, `/v1/environments`,
//! `/v1/sandboxes`, `/v1/openapi.json`); the reference is `docs/sandbox-api.md`.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::Event;
use axum::response::IntoResponse;
use axum::routing::{get, post, put};
use axum::Router;
use serde::Deserialize;

use super::error::{ApiError, HttpError};
use super::http::{body_digest, idempotency_key, ok, parse, sse, App, Reply};
use super::tenancy::{Parsed, Who};
use axum::Extension;
use service::sandbox::environments::EnvironmentRequest;
use service::sandbox::sandboxes::lifetimes::{BranchRequest, ListFilter, TimeoutRequest};
use service::sandbox::sandboxes::{ExecRequest, SandboxRequest, StreamEvent, MAX_FILE_BYTES};
use service::sandbox::SandboxApi;
use service::wire::{Deleted, EnvironmentList, SandboxBranched, SandboxList, StreamData, StreamError};

/// An event's data, as JSON text.
fn encode(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).expect("events serialize")
}

/// Largest body of a folder upload (it travels to the guest in one agent request).
const MAX_FOLDER_UPLOAD: usize = 64 << 20;

pub(super) fn routes() -> Router<App> {
    let files = Router::new()
        .route("/v1/sandboxes/{id}/files", put(write_file).get(read_file))
        .route("/v1/sandboxes/{id}/folders", put(write_folder).get(read_folder))
        .layer(axum::extract::DefaultBodyLimit::max(
            MAX_FOLDER_UPLOAD.max(MAX_FILE_BYTES as usize),
        ));
    let contexts =
        Router::new()
            .route("/v1/contexts", post(upload_context))
            .layer(axum::extract::DefaultBodyLimit::max(
                service::sandbox::MAX_CONTEXT_BYTES as usize,
            ));
    Router::new()
        .route("/v1/environments", post(create_environment).get(list_environments))
        .route("/v1/environments/{id}", get(get_environment).delete(delete_environment))
        .route("/v1/environments/{id}/logs", get(environment_logs))
        .route("/v1/sandboxes", post(create_sandbox).get(list_sandboxes))
        .route("/v1/sandboxes/{id}", get(get_sandbox).delete(delete_sandbox))
        .route("/v1/sandboxes/{id}/exec", post(exec))
        .route("/v1/sandboxes/{id}/exec/stream", post(exec_stream))
        .route("/v1/sandboxes/{id}/branch", post(branch))
        .route("/v1/sandboxes/{id}/timeout", post(set_timeout))
        .route("/v1/sandboxes/{id}/checkpoint", post(checkpoint))
        .route("/v1/sandboxes/{id}/reset", post(reset))
        .route("/v1/sandboxes/{id}/stat", get(stat))
        .route("/v1/sandboxes/{id}/entries", get(entries))
        .route("/v1/sandboxes/{id}/pause", post(pause))
        .route("/v1/sandboxes/{id}/resume", post(resume))
        .route("/v1/sandboxes/{id}/snapshot", post(snapshot))
        .route(
            "/v1/openapi.json",
            get(|| async { axum::Json(super::openapi::document()) }),
        )
        .layer(axum::extract::DefaultBodyLimit::max(16 << 20))
        .merge(files)
        .merge(contexts)
}

fn api(app: &App) -> Result<&SandboxApi, ApiError> {
    app.service
        .sandbox
        .as_ref()
        .ok_or_else(|| ApiError::new(404, "the sandbox API is off here (serve.sandboxes.enabled = false)"))
}

fn created(value: impl serde::Serialize) -> Reply {
    Ok((StatusCode::CREATED, axum::Json(value)).into_response())
}

async fn upload_context(State(app): State<App>, body: Bytes) -> Reply {
    let api = api(&app)?;
    if body.len() as u64 > api.environments.contexts.max_bytes() {
        return Err(HttpError::from(ApiError::new(
            413,
            format!(
                "the context is larger than {} MiB (serve.sandboxes.max_context_mib)",
                api.environments.contexts.max_bytes() >> 20
            ),
        )));
    }
    let uploaded = api.environments.contexts.upload(body.to_vec()).await?;
    created(uploaded)
}

async fn create_environment(
    State(app): State<App>,
    Extension(Parsed(request)): Extension<Parsed<EnvironmentRequest>>,
) -> Reply {
    let api = api(&app)?;
    app.service.check_admitting()?;
    let (env, started) = api.environments.create(request)?;
    let status = if started || env.view().state == "building" {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(env.view())).into_response())
}

async fn list_environments(State(app): State<App>, Extension(who): Extension<Who>) -> Reply {
    let tenancy = &app.service.tenancy;
    let mut environments = api(&app)?.environments.list();
    environments.retain(|e| tenancy.owns(who.tenant(), tenants::Kind::Environment, &e.id));
    ok(EnvironmentList { environments })
}

async fn get_environment(State(app): State<App>, Path(id): Path<String>) -> Reply {
    ok(api(&app)?.environments.get(&id, "id")?.view())
}

async fn delete_environment(State(app): State<App>, Path(id): Path<String>) -> Reply {
    api(&app)?.environments.delete(&id)?;
    ok(Deleted { id, deleted: true })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LogsQuery {
    #[serde(default)]
    offset: usize,
    #[serde(default)]
    wait: f64,
}

async fn environment_logs(
    State(app): State<App>,
    Path(id): Path<String>,
    query: Result<Query<LogsQuery>, axum::extract::rejection::QueryRejection>,
) -> Reply {
    let Query(q) = query.map_err(|e| ApiError::new(400, format!("bad query: {}", e.body_text())))?;
    if !(0.0..=300.0).contains(&q.wait) {
        return Err(HttpError::from(ApiError::field(
            400,
            "wait",
            "must be 0 to 300 seconds",
        )));
    }
    ok(api(&app)?
        .environments
        .logs(&id, q.offset, Duration::from_secs_f64(q.wait))
        .await?)
}

async fn create_sandbox(
    State(app): State<App>,
    Extension(Parsed(request)): Extension<Parsed<SandboxRequest>>,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let key = idempotency_key(&headers)?.map(|k| (k, body_digest(&body)));
    let api = api(&app)?;
    let service = app.service.clone();
    let (view, made) = api
        .sandboxes
        .create(&api.environments, request, key, || service.vm_slot())
        .await?;
    if made {
        created(view)
    } else {
        ok(view)
    }
}

async fn list_sandboxes(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    q: Result<Query<BTreeMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Reply {
    let Query(q) = q.map_err(|e| ApiError::new(400, format!("bad query: {}", e.body_text())))?;
    let filter = ListFilter::parse(q)?;
    let tenancy = app.service.tenancy.clone();
    let mine = move |id: &str| tenancy.owns(who.tenant(), tenants::Kind::Sandbox, id);
    ok(SandboxList {
        sandboxes: api(&app)?.sandboxes.list(&filter, &mine).await,
    })
}

async fn checkpoint(State(app): State<App>, Path(id): Path<String>) -> Reply {
    ok(api(&app)?.sandboxes.checkpoint(&id).await?)
}

async fn reset(State(app): State<App>, Path(id): Path<String>) -> Reply {
    ok(api(&app)?.sandboxes.reset(&id).await?)
}

async fn set_timeout(State(app): State<App>, Path(id): Path<String>, body: Bytes) -> Reply {
    let request: TimeoutRequest = parse(&body)?;
    ok(api(&app)?.sandboxes.set_timeout(&id, request).await?)
}

async fn get_sandbox(State(app): State<App>, Path(id): Path<String>) -> Reply {
    ok(api(&app)?.sandboxes.view(&id).await?)
}

async fn delete_sandbox(State(app): State<App>, Path(id): Path<String>) -> Reply {
    api(&app)?.sandboxes.delete(&id, "deleted").await?;
    ok(Deleted { id, deleted: true })
}

async fn exec(State(app): State<App>, Path(id): Path<String>, body: Bytes) -> Reply {
    let request: ExecRequest = parse(&body)?;
    let out = api(&app)?.sandboxes.exec(&id, request).await?;
    Ok(axum::Json(out).into_response())
}

async fn exec_stream(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Path(id): Path<String>,
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
struct PathQuery {
    path: String,
    /// Octal (`644`, `0644` or `0o644`).
    #[serde(default)]
    mode: Option<String>,
}

fn path_query(
    query: Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<PathQuery, ApiError> {
    query.map(|Query(q)| q).map_err(|e| {
        ApiError::field(
            400,
            "path",
            format!("bad query: {} (give ?path=/absolute/guest/path)", e.body_text()),
        )
    })
}

fn mode_of(mode: Option<&str>) -> Result<u32, ApiError> {
    let Some(text) = mode else { return Ok(0o644) };
    let digits = text.strip_prefix("0o").unwrap_or(text);
    match u32::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(ApiError::field(
            400,
            "mode",
            "must be an octal file mode (e.g. 644 or 0755)",
        )),
    }
}

async fn write_file(
    State(app): State<App>,
    Path(id): Path<String>,
    query: Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
    body: Bytes,
) -> Reply {
    let q = path_query(query)?;
    let mode = mode_of(q.mode.as_deref())?;
    if body.len() as u64 > MAX_FILE_BYTES {
        return Err(HttpError::from(ApiError::new(
            413,
            format!("a file upload is at most {} MiB", MAX_FILE_BYTES >> 20),
        )));
    }
    ok(api(&app)?
        .sandboxes
        .write_file(&id, &q.path, mode, body.to_vec())
        .await?)
}

async fn read_file(
    State(app): State<App>,
    Path(id): Path<String>,
    query: Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> Reply {
    let q = path_query(query)?;
    let bytes = api(&app)?.sandboxes.read_file(&id, &q.path).await?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

async fn write_folder(
    State(app): State<App>,
    Path(id): Path<String>,
    query: Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
    body: Bytes,
) -> Reply {
    let q = path_query(query)?;
    if q.mode.is_some() {
        return Err(HttpError::from(ApiError::field(
            400,
            "mode",
            "a folder's modes come from its archive",
        )));
    }
    if body.len() > MAX_FOLDER_UPLOAD {
        return Err(HttpError::from(ApiError::new(
            413,
            format!("a folder upload is at most {} MiB", MAX_FOLDER_UPLOAD >> 20),
        )));
    }
    ok(api(&app)?.sandboxes.write_folder(&id, &q.path, body.to_vec()).await?)
}

async fn read_folder(
    State(app): State<App>,
    Path(id): Path<String>,
    query: Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> Reply {
    let q = path_query(query)?;
    let bytes = api(&app)?.sandboxes.read_folder(&id, &q.path).await?;
    Ok(([(header::CONTENT_TYPE, "application/x-tar")], bytes).into_response())
}

/// `?path=&max=` of a listing.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    path: String,
    #[serde(default)]
    max: Option<u64>,
}

async fn stat(
    State(app): State<App>,
    Path(id): Path<String>,
    query: Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> Reply {
    let q = path_query(query)?;
    ok(api(&app)?.sandboxes.stat(&id, &q.path).await?)
}

async fn entries(
    State(app): State<App>,
    Path(id): Path<String>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Reply {
    let Query(q) =
        query.map_err(|e| ApiError::new(400, format!("bad query: {} (path=/a/folder&max=N)", e.body_text())))?;
    ok(api(&app)?.sandboxes.list_folder(&id, &q.path, q.max).await?)
}

async fn branch(
    State(app): State<App>,
    Path(id): Path<String>,
    Extension(Parsed(request)): Extension<Parsed<BranchRequest>>,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let key = idempotency_key(&headers)?.map(|k| (k, body_digest(&body)));
    let service = app.service.clone();
    let sandboxes = &api(&app)?.sandboxes;
    let make = async {
        match request.count {
            None => Ok(vec![sandboxes.branch(&id, || service.vm_slot()).await?.id]),
            Some(count) => Ok(sandboxes
                .branch_many(&id, count, || service.vm_slot())
                .await?
                .sandboxes
                .into_iter()
                .map(|s| s.id)
                .collect()),
        }
    };
    let (ids, made) = sandboxes.once(&format!("branch {id}"), key, make).await?;
    let mut views = Vec::new();
    for child in &ids {
        views.push(sandboxes.view(child).await?);
    }
    let answer = match (request.count, views.pop()) {
        (None, Some(view)) if views.is_empty() => SandboxBranched::One(Box::new(view)),
        (_, last) => SandboxBranched::Many(SandboxList {
            sandboxes: views.into_iter().chain(last).collect(),
        }),
    };
    let status = if made { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, axum::Json(answer)).into_response())
}

async fn pause(State(app): State<App>, Path(id): Path<String>) -> Reply {
    ok(api(&app)?.sandboxes.pause(&id).await?)
}

async fn resume(State(app): State<App>, Path(id): Path<String>) -> Reply {
    let service = app.service.clone();
    ok(api(&app)?.sandboxes.resume(&id, || service.vm_slot()).await?)
}

async fn snapshot(State(app): State<App>, Path(id): Path<String>, headers: HeaderMap, body: Bytes) -> Reply {
    let api = api(&app)?;
    let key = idempotency_key(&headers)?.map(|k| (k, body_digest(&body)));
    let make = async { Ok(vec![api.sandboxes.snapshot(&api.environments, &id).await?.id]) };
    let (ids, made) = api.sandboxes.once(&format!("snapshot {id}"), key, make).await?;
    let env = api.environments.get(&ids[0], "environment")?.view();
    let status = if made { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, axum::Json(env)).into_response())
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
