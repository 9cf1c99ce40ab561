//! The routes of lifecycle events and webhooks.

use utoipa::openapi::path::HttpMethod;

use super::{Body, Routes};
use crate::serve::event_routes as h;
use service::events::webhooks::WebhookRequest;
use service::wire::events::{EventList, SandboxMetrics, WebhookList, WebhookView};
use service::wire::Deleted;

pub(super) fn workspace_routes(r: &mut Routes) {
    use crate::serve::workspace_routes as w;
    use service::wire::workspaces::{WorkspaceList, WorkspaceView, WorkspacesSynced};
    use HttpMethod::{Delete, Get, Post};
    let (body, answer) = (
        r.json::<service::workspaces::WorkspaceRequest>(),
        r.json::<WorkspaceView>(),
    );
    r.add(
        Post,
        "/v1/workspaces",
        w::create,
        "a workspace: a named volume of the caller's that outlives every sandbox",
        &[],
        Some(body),
        vec![("201", "made", answer)],
    );
    let answer = r.json::<WorkspaceList>();
    r.add(
        Get,
        "/v1/workspaces",
        w::list,
        "the caller's workspaces",
        &[],
        None,
        vec![("200", "workspaces", answer)],
    );
    let answer = r.json::<WorkspaceView>();
    r.add(
        Get,
        "/v1/workspaces/{name}",
        w::get,
        "one workspace: its size, generation and holder",
        &[],
        None,
        vec![("200", "the workspace", answer)],
    );
    let deleted = r.json::<Deleted>();
    r.add(
        Delete,
        "/v1/workspaces/{name}",
        w::delete,
        "remove a workspace no sandbox holds writable",
        &[],
        None,
        vec![("200", "removed", deleted)],
    );
    let answer = r.json::<WorkspaceView>();
    r.add(
        Post,
        "/v1/workspaces/{name}/fence",
        w::fence,
        "take a workspace from its writable holder: that holder's later syncs are refused",
        &[],
        None,
        vec![("200", "the workspace", answer)],
    );
    let answer = r.json::<WorkspacesSynced>();
    r.add(
        Post,
        "/v1/sandboxes/{id}/workspaces/sync",
        w::sync,
        "keep what the sandbox wrote to the workspaces it holds writable (409 once fenced)",
        &[],
        None,
        vec![("200", "the workspaces as synced", answer)],
    );
}

pub(super) fn event_routes(r: &mut Routes) {
    use HttpMethod::{Delete, Get, Post};
    let answer = r.json::<EventList>();
    let query = [
        ("after", "events after this id (default 0)"),
        ("sandbox", "of this sandbox or session alone"),
        ("limit", "at most this many (1-1000, default 100)"),
    ];
    r.add(
        Get,
        "/v1/events",
        h::list_events,
        "the caller's lifecycle events, oldest first",
        &query,
        None,
        vec![("200", "events", answer)],
    );
    let query = [
        (
            "after",
            "events after this id (default: from now on; the header Last-Event-ID wins)",
        ),
        ("sandbox", "of this sandbox or session alone"),
    ];
    r.add(
        Get,
        "/v1/events/stream",
        h::stream_events,
        "the caller's lifecycle events as they happen: server-sent events named `event` (EventView), each with its id",
        &query,
        None,
        vec![("200", "events", Body::Raw("text/event-stream"))],
    );
    let answer = r.json::<SandboxMetrics>();
    r.add(
        Get,
        "/v1/sandboxes/{id}/metrics",
        h::sandbox_metrics,
        "what a sandbox uses now (CPU, memory, disk, network) and over its life",
        &[],
        None,
        vec![("200", "its use", answer)],
    );
    let (body, answer) = (r.json::<WebhookRequest>(), r.json::<WebhookView>());
    r.add(
        Post,
        "/v1/webhooks",
        h::add_webhook,
        "a webhook sent every later event of the caller's, signed (its secret is in this answer only)",
        &[],
        Some(body),
        vec![("201", "made", answer)],
    );
    let answer = r.json::<WebhookList>();
    r.add(
        Get,
        "/v1/webhooks",
        h::list_webhooks,
        "the caller's webhooks and how far each got",
        &[],
        None,
        vec![("200", "webhooks", answer)],
    );
    let answer = r.json::<Deleted>();
    r.add(
        Delete,
        "/v1/webhooks/{id}",
        h::delete_webhook,
        "remove a webhook",
        &[],
        None,
        vec![("200", "removed", answer)],
    );
}
