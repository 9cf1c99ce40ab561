//! E2B's REST API: sandboxes made, listed, described, paused, connected to (which resumes a
//! paused one), given a new timeout and killed, each a call of the service core on the
//! caller's own sandboxes. A template is a farm environment's id.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{no_content, refused, rfc3339, ENVD_VERSION};
use crate::serve::error::HttpError;
use crate::serve::http::{made, parse, App, Mine, Reply, Q};
use crate::serve::tenancy::Who;
use service::sandbox::environments::EnvironmentRequest;
use service::sandbox::sandboxes::lifetimes::{BranchRequest, ListFilter, TimeoutRequest};
use service::sandbox::sandboxes::SandboxRequest;
use service::sandbox::SandboxId;
use service::wire::{SandboxBranched, SandboxView};
use service::ErrorKind;

/// E2B's default timeout of a new sandbox, seconds.
const DEFAULT_TIMEOUT_SECS: u64 = 300;

/// What E2B's SDK sends to make a sandbox (`POST /v2/sandboxes`, `POST /sandboxes`).
/// `autoPause` is farm's `"on_timeout": "pause"` (its connect resumes it). Fields farm does
/// not act on (`autoResume`, `secure`, volumes) are taken and ignored, as a newer SDK may
/// send more.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(in crate::serve) struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<u64>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
    auto_pause: Option<bool>,
    /// E2B's volumes (farm's workspaces), each mounted writable at its path.
    #[serde(default)]
    volume_mounts: Option<Vec<VolumeMount>>,
    #[serde(rename = "allow_internet_access")]
    #[allow(dead_code)] // see `create`
    allow_internet_access: Option<bool>,
}

/// One of `volumeMounts`.
#[derive(Debug, Deserialize)]
pub(in crate::serve) struct VolumeMount {
    name: String,
    path: String,
}

/// `{"timeout": SECONDS}` (a new timeout, or a connect's).
#[derive(Debug, Default, Deserialize)]
pub(in crate::serve) struct Timeout {
    timeout: Option<u64>,
}

/// E2B's `Sandbox` (what create and connect answer). The one access token is both envd's
/// and the code interpreter's (`trafficAccessToken`: its SDK sends no `X-Access-Token` on
/// `/contexts`).
fn sandbox_json(app: &App, who: &Who, view: &SandboxView) -> Value {
    let token = app.service.tenancy.sandbox_access_token(who.tenant(), &view.id);
    json!({
        "sandboxID": view.id,
        "templateID": view.environment,
        "clientID": "farm",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": token,
        "trafficAccessToken": token,
        "domain": domain(app, who, view),
    })
}

/// The `domain` of a sandbox: the SDK's `get_host(port)` is `{port}-{id}.{domain}`, a host
/// name of farm's port listener that opens that port of this sandbox (its host key in it).
fn domain(app: &App, who: &Who, view: &SandboxView) -> Value {
    let Ok(api) = api(app) else { return Value::Null };
    let Ok(id) = api.sandboxes.resolve(who, &view.id) else {
        return Value::Null;
    };
    json!(api.sandboxes.e2b_domain(who.tenant(), &id))
}

/// E2B's `ListedSandbox` and `SandboxDetail` (the detail adds the access token).
fn listed_json(view: &SandboxView) -> Value {
    json!({
        "sandboxID": view.id,
        "templateID": view.environment,
        "clientID": "farm",
        "startedAt": rfc3339(view.created_at_ms),
        "endAt": rfc3339(view.expires_at_ms),
        "cpuCount": view.cpus,
        "memoryMB": view.memory_mib,
        "diskSizeMB": 0,
        "state": view.state,
        "envdVersion": ENVD_VERSION,
        "metadata": view.metadata,
    })
}

fn api(app: &App) -> Result<&service::sandbox::SandboxApi, service::ApiError> {
    app.service.sandbox_api()
}

/// `POST /v2/sandboxes` (and 2.45's `POST /sandboxes`): 201 with the new sandbox.
pub(in crate::serve) async fn create(State(app): State<App>, Extension(who): Extension<Who>, body: Bytes) -> Reply {
    // `allow_internet_access` (which E2B's SDKs send as true unless told otherwise) is taken
    // and not acted on: a sandbox made here has no network, as farm's default is.
    let new: NewSandbox = parse_e2b(&body)?;
    let environment = template_environment(&app, &who, &new.template_id).await?;
    let request = SandboxRequest {
        environment,
        env: new.env_vars.unwrap_or_default(),
        workdir: None,
        user: None,
        network: None,
        disk_mib: None,
        idle_timeout_secs: None,
        lifetime_secs: Some(new.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS)),
        cpus: None,
        memory_mib: None,
        metadata: new.metadata.unwrap_or_default(),
        keep: None,
        workspaces: new
            .volume_mounts
            .unwrap_or_default()
            .into_iter()
            .map(|m| service::workspaces::MountRequest {
                name: m.name,
                path: m.path,
                read_only: false,
            })
            .collect(),
        on_timeout: (new.auto_pause == Some(true)).then_some(service::requests::OnTimeout::Pause),
    };
    let service = app.service.clone();
    let caller = who.clone();
    let (view, _) =
        crate::serve::http::finish(async move { service.create_sandbox(&caller, request, None).await }).await?;
    made(StatusCode::CREATED, &view.id.clone(), sandbox_json(&app, &who, &view))
}

/// E2B's template as a farm environment: the caller's environment of that id, or a name of
/// `[serve.e2b] templates`, whose environment is made for the caller on first use (the create
/// waits for its build). Anything else is left to the create, which names it not found.
async fn template_environment(app: &App, who: &Who, template: &str) -> Result<String, HttpError> {
    let service = &app.service;
    let Some(recipe) = service.settings.e2b.templates.get(template) else {
        return Ok(template.to_string());
    };
    let image = &recipe.image;
    let request: EnvironmentRequest = serde_json::from_value(json!({ "image": image, "setup": recipe.setup }))
        .map_err(|e| refused(ErrorKind::Internal, format!("serve.e2b.templates.{template}: {e}")))?;
    let (view, _) = service.create_environment(who, request)?;
    let id = service.resolve_environment(who, &view.id)?;
    let mut offset = 0;
    loop {
        let view = service.environment_view(who, &id)?;
        match view.state.as_str() {
            "ready" => return Ok(view.id),
            "building" => {
                offset = service
                    .environment_logs(&id, offset, Duration::from_secs(10))
                    .await?
                    .next
            }
            _ => {
                return Err(refused(
                    ErrorKind::Unavailable,
                    format!(
                        "template {template:?} (image {image:?}): its environment failed to build: {}",
                        view.error.map(|e| e.message).unwrap_or_default()
                    ),
                ))
            }
        }
    }
}

/// `GET /v2/sandboxes` (and `GET /sandboxes`): the caller's sandboxes, filtered by E2B's
/// `metadata` (`k=v&...`, each part percent-encoded) and `state` (`running,paused`). One
/// page: no `x-next-token`.
pub(in crate::serve) async fn list(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Q(q): Q<BTreeMap<String, String>>,
) -> Reply {
    let mut wanted_metadata = BTreeMap::new();
    let mut states: BTreeSet<String> = BTreeSet::new();
    for (key, value) in q {
        match key.as_str() {
            "metadata" => {
                for (k, v) in url_pairs(&value) {
                    wanted_metadata.insert(k, v);
                }
            }
            "state" => states.extend(value.split(',').filter(|s| !s.is_empty()).map(str::to_string)),
            "limit" | "nextToken" | "order" | "template" | "startedAfter" => {}
            other => {
                return Err(refused(
                    ErrorKind::Invalid,
                    format!("{other:?} is not a query parameter of the list (metadata, state, limit, nextToken)"),
                ))
            }
        }
    }
    if let Some(bad) = states.iter().find(|s| *s != "running" && *s != "paused") {
        return Err(refused(ErrorKind::Invalid, format!("state {bad:?}: running or paused")));
    }
    let views = api(&app)?.sandboxes.list(&who, &ListFilter::default()).await;
    let listed: Vec<Value> = views
        .iter()
        .filter(|v| states.is_empty() || states.contains(&v.state))
        .filter(|v| wanted_metadata.iter().all(|(k, want)| v.metadata.get(k) == Some(want)))
        .map(listed_json)
        .collect();
    Ok(axum::Json(listed).into_response())
}

/// `GET /sandboxes/{id}`.
pub(in crate::serve) async fn info(State(app): State<App>, Extension(who): Extension<Who>, Mine(id): Mine) -> Reply {
    let view = api(&app)?.sandboxes.view(&id).await?;
    let mut detail = listed_json(&view);
    detail["envdAccessToken"] = json!(app.service.tenancy.sandbox_access_token(who.tenant(), &view.id));
    detail["domain"] = domain(&app, &who, &view);
    Ok(axum::Json(detail).into_response())
}

/// `DELETE /sandboxes/{id}`: 204 (a 404 is the SDK's `False`).
pub(in crate::serve) async fn kill(State(app): State<App>, Mine(id): Mine) -> Reply {
    api(&app)?.sandboxes.delete(&id, "killed (E2B)").await?;
    Ok(no_content())
}

/// `POST /sandboxes/{id}/timeout`: it ends `timeout` seconds from now.
pub(in crate::serve) async fn set_timeout(State(app): State<App>, Mine(id): Mine, body: Bytes) -> Reply {
    let timeout: Timeout = parse_e2b(&body)?;
    let secs = timeout
        .timeout
        .ok_or_else(|| refused(ErrorKind::Invalid, "timeout: seconds from now are required"))?;
    expire_in(&app, &id, secs).await?;
    Ok(no_content())
}

async fn expire_in(app: &App, id: &SandboxId, secs: u64) -> Result<(), service::ApiError> {
    let request = TimeoutRequest {
        idle_timeout_secs: None,
        lifetime_secs: None,
        expires_in_secs: Some(secs),
    };
    api(app)?.sandboxes.set_timeout(id, request).await.map(|_| ())
}

/// `POST /sandboxes/{id}/pause`: 204, or 409 when it is paused already (the SDK's `False`).
/// Its body, which says nothing farm uses, is read (and dropped) so that the connection
/// stays open for the client's next request (`serve::unread`).
pub(in crate::serve) async fn pause(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Mine(id): Mine,
    _body: axum::body::Bytes,
) -> Reply {
    if api(&app)?.sandboxes.view(&id).await?.state != "running" {
        return Err(refused(ErrorKind::Conflict, format!("sandbox {id} is paused already")));
    }
    app.service.pause_sandbox(&who, &id).await?;
    Ok(no_content())
}

/// `POST /v2/sandboxes/{id}/connect` (and `POST /sandboxes/{id}/connect`): resumes it when
/// paused, sets its timeout when one is given, and answers as create does (200).
pub(in crate::serve) async fn connect(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Mine(id): Mine,
    body: Bytes,
) -> Reply {
    let timeout: Timeout = if body.is_empty() {
        Timeout::default()
    } else {
        parse_e2b(&body)?
    };
    let mut view = api(&app)?.sandboxes.view(&id).await?;
    if view.state != "running" {
        view = app.service.resume_sandbox(&who, &id, None).await?;
    }
    if let Some(secs) = timeout.timeout {
        expire_in(&app, &id, secs).await?;
    }
    Ok(axum::Json(sandbox_json(&app, &who, &view)).into_response())
}

/// `{"count", "timeout"}` of `POST /sandboxes/{id}/fork`.
#[derive(Debug, Default, Deserialize)]
pub(in crate::serve) struct Fork {
    count: Option<u64>,
    timeout: Option<u64>,
}

/// `POST /sandboxes/{id}/fork`: `count` branches of the live sandbox (farm's branch: memory,
/// processes and files as they are now), all or none; 201 with E2B's fork results.
pub(in crate::serve) async fn fork(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Mine(id): Mine,
    body: Bytes,
) -> Reply {
    let fork: Fork = parse_e2b(&body)?;
    let request = BranchRequest {
        count: Some(fork.count.unwrap_or(1)),
    };
    let (service, caller, parent) = (app.service.clone(), who.clone(), id.clone());
    let (branched, _) =
        crate::serve::http::finish(async move { service.branch_sandbox(&caller, &parent, request, None).await })
            .await?;
    let views = match branched {
        SandboxBranched::One(view) => vec![*view],
        SandboxBranched::Many(list) => list.sandboxes,
    };
    let mut results = Vec::new();
    for view in &views {
        if let Some(secs) = fork.timeout {
            let child = api(&app)?.sandboxes.resolve(&who, &view.id)?;
            expire_in(&app, &child, secs).await?;
        }
        results.push(json!({ "sandbox": sandbox_json(&app, &who, view) }));
    }
    let first = views.first().map(|v| v.id.clone()).unwrap_or_default();
    made(StatusCode::CREATED, &first, results)
}

/// `POST /sandboxes/{id}/snapshots`: farm's snapshot of the sandbox, a new environment of the
/// caller's, whose id is the template a later create names. A `name` is not kept.
pub(in crate::serve) async fn snapshot(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Mine(id): Mine,
    _body: axum::body::Bytes,
) -> Reply {
    let (service, caller) = (app.service.clone(), who.clone());
    let (environment, _) =
        crate::serve::http::finish(async move { service.snapshot_sandbox(&caller, &id, None).await }).await?;
    made(
        StatusCode::CREATED,
        &environment.id.clone(),
        json!({ "snapshotID": environment.id, "names": [] }),
    )
}

/// A body of E2B's, read strictly as every body is (one value, no key twice), which may carry
/// fields farm ignores (its types do not refuse unknown fields); an empty body is `{}`.
fn parse_e2b<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, service::ApiError> {
    parse(if body.is_empty() { b"{}" } else { body })
}

/// E2B's metadata filter once the query string is decoded: `k=v&k2=v2` as Python's
/// `urlencode` wrote it of keys and values `quote`d before, so each is decoded twice.
fn url_pairs(text: &str) -> Vec<(String, String)> {
    let decode = |part: &str| percent_decode(&percent_decode(part));
    text.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metadata_filter_is_decoded_once_more() {
        // What the query string holds once axum decoded it: `urlencode` of `quote`d keys
        // and values ({"k": "v w", "team": "a&b", "pct": "100%"}).
        assert_eq!(
            url_pairs("k=v%2520w&team=a%2526b&pct=100%2525"),
            vec![
                ("k".into(), "v w".into()),
                ("team".into(), "a&b".into()),
                ("pct".into(), "100%".into())
            ]
        );
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
