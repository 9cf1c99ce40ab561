//! E2B's volumes as farm's workspaces: `Volume.create(name)`, `Volume.list()`,
//! `Volume.get_info(id)`, `Volume.destroy(id)`, and `Sandbox.create(volume_mounts={path:
//! volume})`, which mounts each writable (one sandbox at a time: a second is a 409 naming the
//! holder). What a sandbox writes there is kept when it is killed (or synced with farm's
//! `POST /v1/sandboxes/{id}/workspaces/sync`). E2B's volume content API (files of a volume
//! without a sandbox) is not served: the `token` answered opens nothing.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{no_content, refused};
use crate::serve::http::{parse, App, Reply};
use crate::serve::tenancy::Who;
use service::wire::workspaces::WorkspaceView;
use service::workspaces::{WorkspaceRequest, MAX_SIZE_MIB};
use service::ErrorKind;

/// `{"name"}` of `POST /volumes` (more fields a newer SDK may send are taken and ignored).
#[derive(Debug, Deserialize)]
pub(in crate::serve) struct NewVolume {
    name: String,
}

fn volume_json(view: &WorkspaceView) -> Value {
    json!({ "volumeID": view.id, "name": view.name, "token": "" })
}

/// The caller's workspace of E2B's `volumeID` (another tenant's is a 404 as none).
fn by_id(app: &App, who: &Who, id: &str) -> Result<WorkspaceView, crate::serve::error::HttpError> {
    let all = app.service.list_workspaces(who)?;
    all.workspaces
        .into_iter()
        .find(|w| w.id == id)
        .ok_or_else(|| refused(ErrorKind::NotFound, format!("no volume {id:?}")))
}

pub(in crate::serve) async fn create(State(app): State<App>, Extension(who): Extension<Who>, body: Bytes) -> Reply {
    let new: NewVolume = parse(&body)?;
    let request = WorkspaceRequest {
        name: new.name,
        size_mib: MAX_SIZE_MIB,
        keep_days: None,
    };
    let view = app.service.create_workspace(&who, request)?;
    Ok((StatusCode::CREATED, axum::Json(volume_json(&view))).into_response())
}

pub(in crate::serve) async fn list(State(app): State<App>, Extension(who): Extension<Who>) -> Reply {
    let all = app.service.list_workspaces(&who)?;
    let volumes: Vec<Value> = all
        .workspaces
        .iter()
        .map(|w| json!({ "volumeID": w.id, "name": w.name }))
        .collect();
    Ok(axum::Json(volumes).into_response())
}

pub(in crate::serve) async fn get(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Path(id): Path<String>,
) -> Reply {
    Ok(axum::Json(volume_json(&by_id(&app, &who, &id)?)).into_response())
}

pub(in crate::serve) async fn destroy(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Path(id): Path<String>,
) -> Reply {
    let view = by_id(&app, &who, &id)?;
    app.service.delete_workspace(&who, &view.name)?;
    Ok(no_content())
}
