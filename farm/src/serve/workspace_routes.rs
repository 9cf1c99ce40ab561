//! The HTTP routes of workspaces (`/v1/workspaces`, and a sandbox's sync); the reference is
//! `docs/sandbox-api.md`.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Extension;

use super::http::{finish, made, ok, parse, App, Mine, Reply};
use super::tenancy::Who;
use service::wire::Deleted;
use service::workspaces::WorkspaceRequest;

pub(super) async fn create(State(app): State<App>, Extension(who): Extension<Who>, body: Bytes) -> Reply {
    let request: WorkspaceRequest = parse(&body)?;
    let view = app.service.create_workspace(&who, request)?;
    made(StatusCode::CREATED, &view.id.clone(), view)
}

pub(super) async fn list(State(app): State<App>, Extension(who): Extension<Who>) -> Reply {
    ok(app.service.list_workspaces(&who)?)
}

pub(super) async fn get(State(app): State<App>, Extension(who): Extension<Who>, Path(name): Path<String>) -> Reply {
    ok(app.service.workspace(&who, &name)?)
}

pub(super) async fn delete(State(app): State<App>, Extension(who): Extension<Who>, Path(name): Path<String>) -> Reply {
    app.service.delete_workspace(&who, &name)?;
    ok(Deleted {
        id: name,
        deleted: true,
    })
}

pub(super) async fn fence(State(app): State<App>, Extension(who): Extension<Who>, Path(name): Path<String>) -> Reply {
    ok(app.service.fence_workspace(&who, &name)?)
}

pub(super) async fn sync(State(app): State<App>, Mine(id): Mine) -> Reply {
    let service = app.service.clone();
    ok(finish(async move { service.sandbox_api()?.sandboxes.sync_workspaces(&id).await }).await?)
}
