//! The HTTP API of `farm serve` (JSON over HTTP/1.1; the reference is docs/serve.md).
//!
//! Bodies are parsed strictly: unknown fields are refused, and a bad body gets a 400 whose
//! JSON names the field (`{"error": ..., "field": "items[0].n"}`).

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use serde::Deserialize;

use super::error::{ApiError, HttpError};
use super::http::{body_digest, finish, idempotency_key, made, ok, parse, App, MySession, QueryOf, Reply, Q};
use super::tenancy::Who;
use axum::Extension;
use service::requests::{CancelBelow, ExecRequest, ItemRequest, SubmitRequest, SubmitSessionRequest, WriteFileRequest};
use service::state::Service;
use service::ErrorKind;

pub const ARROW_STREAM: &str = "application/vnd.apache.arrow.stream";

/// The Prometheus text; a tenant other than `default` sees its own `farm_tenant_*` series
/// only.
pub(super) async fn metrics(State(app): State<App>, Extension(who): Extension<Who>) -> Reply {
    app.service.count_tenant_forks();
    let text = engine::metrics::get().render();
    let text = match who.profile.is_default() {
        true => text,
        false => own_metrics(&text, &who.profile.tenant.name),
    };
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

/// The lines of a tenant's own `farm_tenant_*` series.
fn own_metrics(text: &str, tenant: &str) -> String {
    let label = format!("tenant=\"{tenant}\"");
    text.lines()
        .filter(|l| {
            l.starts_with("# HELP farm_tenant_")
                || l.starts_with("# TYPE farm_tenant_")
                || (l.starts_with("farm_tenant_") && l.contains(&label))
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

pub(super) async fn submit(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let request: SubmitRequest = parse(&body)?;
    let key = idempotency_key(&headers)?;
    let digest = body_digest(&body);
    let response = app.service.submit(request, key, digest, &who).await?;
    let first = response["groups"][0]["rollout_ids"][0]
        .as_str()
        .unwrap_or_default()
        .to_string();
    made(StatusCode::ACCEPTED, &first, response)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResultsQuery {
    #[serde(default)]
    cursor: usize,
    #[serde(default = "default_max")]
    max: usize,
    /// Seconds to wait for a first row.
    #[serde(default)]
    wait: f64,
}

impl QueryOf for ResultsQuery {}

fn default_max() -> usize {
    100
}

pub(super) async fn results(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    headers: HeaderMap,
    Q(q): Q<ResultsQuery>,
) -> Reply {
    if q.max == 0 || q.max > 10_000 {
        return Err(HttpError::from(ApiError::field(
            ErrorKind::Invalid,
            "max",
            "must be 1 to 10000",
        )));
    }
    if !(0.0..=300.0).contains(&q.wait) {
        return Err(HttpError::from(ApiError::field(
            ErrorKind::Invalid,
            "wait",
            "must be 0 to 300 seconds",
        )));
    }
    let (lines, next) = app
        .service
        .results(q.cursor, q.max, Duration::from_secs_f64(q.wait), &who)
        .await?;
    let arrow = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains(ARROW_STREAM));
    let mut response = if arrow {
        let bytes = arrow_stream(&app.service, &lines)?;
        ([(header::CONTENT_TYPE, ARROW_STREAM)], bytes).into_response()
    } else {
        let mut body = Vec::new();
        for (cursor, line) in &lines {
            // The row as journaled, with its cursor first.
            body.extend_from_slice(format!("{{\"cursor\":{cursor},").as_bytes());
            body.extend_from_slice(&line[1..]);
            body.push(b'\n');
        }
        ([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from(body)).into_response()
    };
    response
        .headers_mut()
        .insert("farm-next-cursor", HeaderValue::from(next));
    Ok(response)
}

/// Rows as one Arrow IPC stream with the Parquet schema.
fn arrow_stream(service: &Service, lines: &[(usize, Vec<u8>)]) -> Result<Vec<u8>, ApiError> {
    let internal = |e: String| ApiError::new(ErrorKind::Internal, e);
    let rows: Vec<engine::row::Row> = lines
        .iter()
        .map(|(_, l)| serde_json::from_slice(l))
        .collect::<Result<_, _>>()
        .map_err(|e| internal(format!("a journal row: {e}")))?;
    let schema = service.recorder.schema();
    let batch =
        serde_arrow::to_record_batch(schema.fields(), &rows).map_err(|e| internal(format!("rows to Arrow: {e}")))?;
    let mut out = Vec::new();
    {
        let mut writer =
            arrow_ipc::writer::StreamWriter::try_new(&mut out, &schema).map_err(|e| internal(e.to_string()))?;
        writer.write(&batch).map_err(|e| internal(e.to_string()))?;
        writer.finish().map_err(|e| internal(e.to_string()))?;
    }
    Ok(out)
}

pub(super) async fn rollout(State(app): State<App>, Extension(who): Extension<Who>, Path(id): Path<String>) -> Reply {
    ok(app.service.rollout(&who, &id).await?)
}

pub(super) async fn cancel(State(app): State<App>, Extension(who): Extension<Who>, Path(id): Path<String>) -> Reply {
    ok(app.service.cancel(&who, &id).await?)
}

pub(super) async fn cancel_below(State(app): State<App>, Extension(who): Extension<Who>, body: Bytes) -> Reply {
    let request: CancelBelow = parse(&body)?;
    ok(app.service.cancel_below(request.policy_version_below, &who).await)
}

pub(super) async fn capacity(State(app): State<App>, Extension(who): Extension<Who>) -> Reply {
    ok(app.service.capacity(&who))
}

pub(super) async fn open_session(State(app): State<App>, Extension(who): Extension<Who>, body: Bytes) -> Reply {
    let request: ItemRequest = parse(&body)?;
    let service = app.service.clone();
    let (id, opened) = finish(async move { service.open_session(&who, request).await }).await?;
    made(StatusCode::CREATED, &id, opened)
}

pub(super) async fn exec(State(app): State<App>, MySession(id): MySession, body: Bytes) -> Reply {
    let (action, timeout) = parse::<ExecRequest>(&body)?.into_action();
    let service = app.service.clone();
    ok(finish(async move { service.act(&id, action, timeout).await }).await?)
}

pub(super) async fn write_file(State(app): State<App>, MySession(id): MySession, body: Bytes) -> Reply {
    let action = parse::<WriteFileRequest>(&body)?.into_action();
    let service = app.service.clone();
    ok(finish(async move { service.act(&id, action, None).await }).await?)
}

pub(super) async fn branch(State(app): State<App>, Extension(who): Extension<Who>, MySession(id): MySession) -> Reply {
    let service = app.service.clone();
    let (child, branched) = finish(async move { service.branch(&who, &id).await }).await?;
    made(StatusCode::CREATED, &child, branched)
}

pub(super) async fn submit_session(State(app): State<App>, MySession(id): MySession, body: Bytes) -> Reply {
    let request: SubmitSessionRequest = parse(if body.is_empty() { b"{}" } else { &body })?;
    let service = app.service.clone();
    ok(finish(async move { service.submit_session(&id, request.answer).await }).await?)
}

pub(super) async fn pause_session(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    MySession(id): MySession,
) -> Reply {
    let service = app.service.clone();
    ok(finish(async move { service.pause_session(&who, &id).await }).await?)
}

pub(super) async fn resume_session(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    MySession(id): MySession,
    body: axum::body::Bytes,
) -> Reply {
    let request: service::sandbox::sandboxes::kept::ResumeRequest = match body.is_empty() {
        true => Default::default(),
        false => parse(&body)?,
    };
    let service = app.service.clone();
    ok(finish(async move { service.resume_session(&who, &id, request.keep).await }).await?)
}

pub(super) async fn get_session(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    MySession(id): MySession,
) -> Reply {
    ok(app.service.get_session(&who, &id).await?)
}

pub(super) async fn list_sessions(State(app): State<App>, Extension(who): Extension<Who>) -> Reply {
    ok(app.service.list_sessions(&who).await?)
}

pub(super) async fn end_session(State(app): State<App>, MySession(id): MySession) -> Reply {
    ok(app
        .service
        .end_session(&id, "deleted", service::events::Cause::Deleted)
        .await?)
}
