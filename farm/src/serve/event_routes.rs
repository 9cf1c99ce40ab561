//! The HTTP routes of lifecycle events and webhooks (`/v1/events`, `/v1/webhooks`); the
//! reference is `docs/sandbox-api.md`.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::Event;
use axum::Extension;
use serde::Deserialize;

use super::error::ApiError;
use super::http::{made, ok, parse, sse, App, Mine, QueryOf, Reply, Q};
use super::tenancy::Who;
use service::events::webhooks::WebhookRequest;
use service::wire::Deleted;
use service::ErrorKind;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EventsQuery {
    #[serde(default)]
    after: u64,
    sandbox: Option<String>,
    limit: Option<u64>,
}

impl QueryOf for EventsQuery {
    const HINT: &'static str = "after=ID, sandbox=ID and limit=N (1-1000)";
}

pub(super) async fn list_events(State(app): State<App>, Extension(who): Extension<Who>, Q(q): Q<EventsQuery>) -> Reply {
    ok(app.service.list_events(&who, q.after, q.sandbox.as_deref(), q.limit)?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StreamQuery {
    after: Option<u64>,
    sandbox: Option<String>,
}

impl QueryOf for StreamQuery {
    const HINT: &'static str = "after=ID and sandbox=ID (or the header Last-Event-ID)";
}

/// `GET /v1/events/stream`: from `Last-Event-ID` (what an `EventSource` sends when it
/// reconnects), else `?after=`, else from now on.
pub(super) async fn stream_events(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    headers: HeaderMap,
    Q(q): Q<StreamQuery>,
) -> Reply {
    let resumed = match headers.get("last-event-id") {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::field(ErrorKind::Invalid, "Last-Event-ID", "must be an event id (a number)")
                })?,
        ),
    };
    let after = resumed.or(q.after).unwrap_or_else(|| app.service.events.last_id());
    let held = app.service.tenancy.hold(&who)?;
    let rx = app.service.follow_events(&who, after, q.sandbox.as_deref())?;
    Ok(sse(rx, held, |event| {
        let data = serde_json::to_string(&event).expect("events serialize");
        (
            Event::default().id(event.id.to_string()).event("event").data(data),
            false,
        )
    }))
}

pub(super) async fn sandbox_metrics(State(app): State<App>, Mine(id): Mine) -> Reply {
    ok(app.service.sandbox_api()?.sandboxes.metrics(&id).await?)
}

pub(super) async fn add_webhook(State(app): State<App>, Extension(who): Extension<Who>, body: Bytes) -> Reply {
    let request: WebhookRequest = parse(&body)?;
    let hook = app.service.events.add_webhook(who.tenant(), request)?;
    made(StatusCode::CREATED, &hook.id.clone(), hook)
}

pub(super) async fn list_webhooks(State(app): State<App>, Extension(who): Extension<Who>) -> Reply {
    ok(app.service.events.webhooks(who.tenant())?)
}

pub(super) async fn delete_webhook(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Path(id): Path<String>,
) -> Reply {
    app.service.events.remove_webhook(who.tenant(), &id)?;
    ok(Deleted { id, deleted: true })
}
