//! What a tenant is shown: the ids a call made become its own, lists hold only its own, and
//! an environment it shares with another tenant looks to it as if it had built it alone (built
//! after a build's time, with its own sandboxes counted, its own time of asking).

use crate::serve::error::Respond;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tenants::{Kind, Owner};

use super::scope::read_answer;
use super::{Tenancy, Who};
use crate::serve::error::ApiError;
use service::state::Service;

use tenants::UNKNOWN_BUILD_MS;

/// Whether the owner may see the environment as what it is now ([`Owner::sees_built`]).
pub(super) fn visible(service: &Service, env: &str, owner: &Owner) -> bool {
    let found = service
        .sandbox
        .as_ref()
        .and_then(|api| api.environments.get(env, "id").ok());
    let building = found.as_ref().is_none_or(|e| e.is_building());
    let took = found
        .and_then(|e| e.built_in_ms())
        .or_else(|| service.tenancy.db.build_ms(env).ok().flatten());
    owner.sees_built(tenants::now_ms(), took, building)
}

/// The answer, after the handler: ids made are the caller's, lists are filtered, views of
/// environments made the caller's own. Also the first id the call made (for the audit).
pub(super) async fn after(
    service: &Service,
    who: &Who,
    (route, path): (&str, &str),
    response: Response,
    checked: super::scope::Checked,
) -> (Response, Option<String>) {
    let status = response.status();
    let interesting = match route {
        "POST /v1/sessions"
        | "POST /v1/sessions/{id}/branch"
        | "POST /v1/sandboxes"
        | "POST /v1/sandboxes/{id}/branch"
        | "POST /v1/sandboxes/{id}/snapshot"
        | "POST /v1/environments"
        | "POST /v1/contexts"
        | "POST /v1/rollouts"
        | "DELETE /v1/environments/{id}" => status.is_success(),
        "GET /v1/sessions"
        | "GET /v1/sandboxes"
        | "GET /v1/environments"
        | "GET /v1/environments/{id}"
        | "GET /v1/environments/{id}/logs" => status.is_success(),
        "GET /v1/capacity" | "GET /metrics" => status.is_success() && !who.profile.is_default(),
        _ => false,
    };
    if !interesting {
        return (response, None);
    }
    let (mut parts, bytes) = match read_answer(response).await {
        Ok(v) => v,
        Err(r) => return (r, None),
    };
    if route == "GET /metrics" {
        let text = own_metrics(&String::from_utf8_lossy(&bytes), &who.profile.tenant.name);
        return (Response::from_parts(parts, Body::from(text)), None);
    }
    let Ok(mut value) = serde_json::from_slice::<Value>(&bytes) else {
        return (Response::from_parts(parts, Body::from(bytes)), None);
    };
    let handler_made = status == axum::http::StatusCode::ACCEPTED;
    let (made, new_status) = match shape(service, who, (route, path), &mut value, (checked, handler_made)).await {
        Ok(v) => v,
        Err(e) => return (e.into_response(), None),
    };
    if let Some(s) = new_status {
        parts.status = s;
    }
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    let body = serde_json::to_vec(&value).expect("JSON serializes");
    (Response::from_parts(parts, Body::from(body)), made)
}

/// Records and rewrites one answer's JSON.
async fn shape(
    service: &Service,
    who: &Who,
    (route, path): (&str, &str),
    value: &mut Value,
    (checked, handler_made): (super::scope::Checked, bool),
) -> Result<(Option<String>, Option<axum::http::StatusCode>), crate::serve::error::ApiError> {
    let tenancy = &service.tenancy;
    let tenant = who.tenant();
    let str_of = |v: &Value| v.as_str().map(str::to_string);
    let made = match route {
        "POST /v1/sessions" | "POST /v1/sessions/{id}/branch" => {
            let session = str_of(&value["session_id"]).unwrap_or_default();
            let parent = super::scope::path_target(path).map(|(_, id)| id.to_string());
            let mib = parent
                .and_then(|p| tenancy.memory.get(&p))
                .unwrap_or_else(|| service.session_mib());
            tenancy.memory.set(&session, mib, None);
            tenancy.own(tenant, Kind::Session, std::slice::from_ref(&session))?;
            if let Some(rollout) = str_of(&value["rollout_id"]) {
                tenancy.own(tenant, Kind::Rollout, &[rollout])?;
            }
            value["mcp"]["token"] = json!(tenancy.mcp_token(tenant, &session));
            Some(session)
        }
        "POST /v1/sandboxes" | "POST /v1/sandboxes/{id}/branch" => {
            let views: Vec<Value> = match value["sandboxes"].as_array() {
                Some(list) => list.clone(),
                None => vec![value.clone()],
            };
            let mut ids = Vec::new();
            for view in &views {
                let id = str_of(&view["id"]).unwrap_or_default();
                let mib = view["memory_mib"].as_u64().unwrap_or(0);
                tenancy.memory.set(&id, mib, view["environment"].as_str());
                ids.push(id);
            }
            tenancy.own(tenant, Kind::Sandbox, &ids)?;
            ids.into_iter().next()
        }
        "POST /v1/sandboxes/{id}/snapshot" => {
            let id = str_of(&value["id"]).unwrap_or_default();
            tenancy.own(tenant, Kind::Environment, std::slice::from_ref(&id))?;
            Some(id)
        }
        "POST /v1/contexts" => {
            let id = str_of(&value["context"]).unwrap_or_default();
            tenancy.own(tenant, Kind::Context, std::slice::from_ref(&id))?;
            Some(id)
        }
        "POST /v1/rollouts" => value["groups"][0]["rollout_ids"][0].as_str().map(str::to_string),
        "POST /v1/environments" => return asked_for_environment(service, who, value, checked, handler_made),
        "DELETE /v1/environments/{id}" => {
            if let Some(id) = str_of(&value["id"]) {
                let _ = tenancy.owners.disown(&tenancy.db, Kind::Environment, &id, tenant);
            }
            None
        }
        _ => {
            shape_reads(service, who, (route, path), value).await;
            None
        }
    };
    Ok((made, None))
}

/// A list or a view as the caller may see it.
async fn shape_reads(service: &Service, who: &Who, (route, path): (&str, &str), value: &mut Value) {
    let tenancy = &service.tenancy;
    match route {
        "GET /v1/environments/{id}" => own_view(service, who, value),
        "GET /v1/environments/{id}/logs" => {
            let id = super::scope::path_target(path)
                .map(|(_, id)| id.to_string())
                .unwrap_or_default();
            own_logs(service, who, &id, value);
        }
        "GET /v1/environments" => {
            keep_own(tenancy, who, value, "environments", "id", Kind::Environment);
            if let Some(list) = value["environments"].as_array_mut() {
                list.iter_mut().for_each(|v| own_view(service, who, v));
            }
        }
        "GET /v1/sessions" => keep_own(tenancy, who, value, "sessions", "session_id", Kind::Session),
        "GET /v1/sandboxes" => keep_own(tenancy, who, value, "sandboxes", "id", Kind::Sandbox),
        "GET /v1/capacity" => own_capacity(service, who, value).await,
        _ => {}
    }
}

/// `POST /v1/environments`: the caller owns the environment now. Content it had not asked
/// for before, that another tenant's request had built or is building, looks to it as a
/// build of its own: 202, building, for a build's time from now.
fn asked_for_environment(
    service: &Service,
    who: &Who,
    value: &mut Value,
    checked: super::scope::Checked,
    handler_made: bool,
) -> Result<(Option<String>, Option<axum::http::StatusCode>), crate::serve::error::ApiError> {
    let tenancy = &service.tenancy;
    let id = value["id"].as_str().unwrap_or_default().to_string();
    let owners = tenancy.owners.of(Kind::Environment, &id);
    let now = tenants::now_ms();
    let mut status = None;
    let new_here = super::scope::mine(&owners, who).is_none();
    if new_here {
        // The first to ask sees its own build as it goes; a later asker, as a build of its own.
        let visible_ms = if owners.is_empty() { now } else { 0 };
        tenancy.owners.own(
            &tenancy.db,
            Kind::Environment,
            std::slice::from_ref(&id),
            who.tenant(),
            now,
            visible_ms,
        )?;
        if visible_ms == 0 {
            status = Some(axum::http::StatusCode::ACCEPTED);
        }
    }
    if new_here || handler_made || checked.rebuilt {
        // A build started, joined or shown: its minutes are the caller's.
        charge_build(service, who, &id, checked.build);
    }
    own_view(service, who, value);
    if status.is_some() || checked.rebuilt {
        // Asked for (or rebuilt) just now: a build of its own would not have ended yet.
        hide_build(value);
        status = Some(axum::http::StatusCode::ACCEPTED);
    }
    Ok((Some(id), status))
}

/// Charges the caller's build minutes for an environment it asked for: the build's time once
/// it ends (or the recorded time of the build another tenant ran).
fn charge_build(service: &Service, who: &Who, id: &str, slot: Option<super::usage::BuildSlot>) {
    let Some(api) = &service.sandbox else { return };
    let environments = api.environments.clone();
    let tenancy: std::sync::Arc<Tenancy> = service.tenancy.clone();
    let (tenant, id) = (who.tenant(), id.to_string());
    tokio::spawn(async move {
        // Held (against the build minutes) until the build ends.
        let _slot = slot;
        loop {
            let Ok(env) = environments.get(&id, "id") else { return };
            if !env.is_building() {
                // This process's build time when it built it, else the one recorded before.
                let ms = match env.built_in_ms() {
                    Some(ms) => {
                        let _ = tenancy.db.set_build_ms(&id, ms);
                        ms
                    }
                    None => tenancy.db.build_ms(&id).ok().flatten().unwrap_or(UNKNOWN_BUILD_MS),
                };
                let _ = tenancy
                    .db
                    .add_build_seconds(tenant, super::usage::today().0, ms as f64 / 1000.0);
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
}

/// An environment's view as the caller sees it: its own time of asking, its own sandboxes,
/// and, until a build of its own would have ended, building.
pub(super) fn own_view(service: &Service, who: &Who, view: &mut Value) {
    let id = view["id"].as_str().unwrap_or_default().to_string();
    let Some(owner) = service.tenancy.owners.owner(Kind::Environment, &id, who.tenant()) else {
        return;
    };
    let own_sandboxes = own_live_sandboxes_of(service, who, &id);
    view["created_at_ms"] = json!(owner.since_ms);
    view["sandboxes"] = json!(own_sandboxes);
    if own_sandboxes == 0 {
        view["warm"] = json!(0);
    }
    if !visible(service, &id, &owner) {
        hide_build(view);
        view["log_lines"] = json!(shown_lines(service, &id, &owner));
    }
}

/// An environment's view as of a build still running.
fn hide_build(view: &mut Value) {
    view["state"] = json!("building");
    view["snapshot"] = Value::Null;
    view["error"] = Value::Null;
    view["log_lines"] = json!(0);
}

/// The caller's live sandboxes made from an environment.
fn own_live_sandboxes_of(service: &Service, who: &Who, env: &str) -> usize {
    let book = service.forks();
    book.all(engine::book::Kind::Sandbox)
        .iter()
        .filter(|(id, _)| {
            service.tenancy.owns(who.tenant(), Kind::Sandbox, id)
                && service.tenancy.memory.env_of(id).as_deref() == Some(env)
        })
        .count()
}

/// Keeps, of the list at `key`, the items whose `id_key` the caller owns.
fn keep_own(tenancy: &Tenancy, who: &Who, value: &mut Value, key: &str, id_key: &str, kind: Kind) {
    if let Some(list) = value[key].as_array_mut() {
        list.retain(|item| {
            item[id_key].as_str().is_some_and(|id| {
                tenancy.owns(who.tenant(), kind, id)
                    || (who.profile.is_default() && tenancy.owners.of(kind, id).is_empty())
            })
        });
    }
}

/// `GET /v1/capacity` for a tenant other than the default: its own rollouts, sessions and
/// sandboxes in place of the node's.
async fn own_capacity(service: &Service, who: &Who, value: &mut Value) {
    let tenant = who.tenant();
    let (queued, in_flight) = {
        let inner = service.lock();
        let running = inner
            .running
            .keys()
            .filter(|id| service.tenancy.owns(tenant, Kind::Rollout, id))
            .count();
        (inner.queue.len_of(tenant), running)
    };
    let live = service.live_forks(tenant);
    let sessions = live.iter().filter(|(kind, _)| *kind == Kind::Session).count();
    let sandboxes = live.len() - sessions;
    value["queued"] = json!(queued);
    value["in_flight"] = json!(in_flight);
    value["sessions"] = json!(sessions);
    value["sandboxes"] = json!(sandboxes);
    value["warm"] = json!(0);
}

/// The Prometheus text a tenant other than the default sees: its own `farm_tenant_*` series.
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

/// Before the handler, for a path on an environment: a DELETE by one of several owners only
/// gives up its share; logs of one that does not look built yet show none.
pub(super) async fn environment_before(
    service: &Service,
    who: &Who,
    route: &str,
    id: &str,
    mine: Option<Owner>,
    owners: &[Owner],
) -> Option<Response> {
    let mine = mine?;
    match route {
        "DELETE /v1/environments/{id}" if owners.len() > 1 => {
            // What the caller's own environment would answer: 409 while it looks to be
            // building or while the caller has sandboxes of it; else only its share goes.
            if !visible(service, id, &mine) {
                let e = ApiError::new(409, format!("environment {id} is still building"));
                return Some(e.into_response());
            }
            let live = own_live_sandboxes_of(service, who, id);
            if live > 0 {
                let e = ApiError::new(
                    409,
                    format!("environment {id} has {live} live sandboxes: delete them first"),
                );
                return Some(e.into_response());
            }
            let tenancy = &service.tenancy;
            if let Err(e) = tenancy.owners.disown(&tenancy.db, Kind::Environment, id, who.tenant()) {
                return Some(ApiError::from(e).into_response());
            }
            Some(axum::Json(json!({ "id": id, "deleted": true })).into_response())
        }
        _ => None,
    }
}

/// The build log as the caller sees it: while the environment does not look built to it, the
/// recorded lines in proportion to the time since it asked, as a build of its own would show
/// them (`next` counts what it has seen).
fn own_logs(service: &Service, who: &Who, id: &str, page: &mut Value) {
    let Some(owner) = service.tenancy.owners.owner(Kind::Environment, id, who.tenant()) else {
        return;
    };
    if visible(service, id, &owner) {
        return;
    }
    let shown = shown_lines(service, id, &owner);
    let lines = page["lines"].as_array().cloned().unwrap_or_default();
    let next = page["next"].as_u64().unwrap_or(0) as usize;
    let from = next.saturating_sub(lines.len());
    let keep = shown.saturating_sub(from).min(lines.len());
    page["lines"] = json!(lines[..keep]);
    page["next"] = json!(from + keep);
    page["state"] = json!("building");
    page["error"] = Value::Null;
}

/// How many of an environment's log lines a build of the caller's own would have printed by
/// now.
fn shown_lines(service: &Service, id: &str, owner: &Owner) -> usize {
    let Some(env) = service
        .sandbox
        .as_ref()
        .and_then(|api| api.environments.get(id, "id").ok())
    else {
        return 0;
    };
    let total = env.view().log_lines;
    let took = env
        .built_in_ms()
        .or_else(|| service.tenancy.db.build_ms(id).ok().flatten())
        .unwrap_or(UNKNOWN_BUILD_MS)
        .max(1);
    let elapsed = tenants::now_ms().saturating_sub(owner.since_ms);
    // The last line (ready, or why it failed) only once it looks built.
    ((total as u64 * elapsed / took) as usize).min(total.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_sees_only_its_own_metric_series() {
        let text = "# HELP farm_rollouts_total x\nfarm_rollouts_total{status=\"ok\"} 3\n# HELP farm_tenant_requests_total y\n# TYPE farm_tenant_requests_total counter\nfarm_tenant_requests_total{class=\"2xx\",tenant=\"a\"} 2\nfarm_tenant_requests_total{class=\"2xx\",tenant=\"ab\"} 9\n";
        let own = own_metrics(text, "a");
        assert!(own.contains("tenant=\"a\"} 2"), "{own}");
        assert!(!own.contains("ab"), "{own}");
        assert!(!own.contains("farm_rollouts_total"), "{own}");
    }
}
