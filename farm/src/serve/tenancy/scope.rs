//! The middleware every route of `farm serve` runs behind: it says who calls, holds the call
//! to the caller's ids, quotas and network grants, records what the call made as the caller's,
//! shows the caller only its own in lists, and appends the call to the audit.
//!
//! An id in a path the caller does not own answers 404 with the same body whether another
//! tenant owns it or it never existed ([`super::not_found`]).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tenants::{Kind, Owner};

use super::usage::Pending;
use super::{not_found, over_quota, Who};
use crate::serve::error::ApiError;
use crate::serve::http::App;
use crate::serve::service::Service;

/// Largest JSON body the middleware reads to check the ids and sizes it names.
const MAX_CHECKED_BODY: usize = 16 << 20;
/// Largest answer the middleware reads to record or filter ids.
const MAX_READ_ANSWER: usize = 64 << 20;

/// A session's MCP route (its not-found answers are JSON-RPC: see [`Hidden`]).
const MCP_ROUTE: &str = "POST /v1/sessions/{id}/mcp";

/// In a request's extensions: the path's id is not the caller's, and the handler must answer
/// as for one that does not exist.
#[derive(Debug, Clone, Copy)]
pub struct Hidden;

/// What the checks before the handler leave for after it.
#[derive(Default)]
pub(super) struct Checked<'a> {
    /// Forks this call may make, held against the quotas until it answers.
    pending: Option<Pending<'a>>,
    /// The path's id (its kind, and whether nobody owns it: then a 404 is made uniform).
    target: Option<(Kind, String, bool)>,
    /// An answer made without the handler.
    answer: Option<Response>,
    /// A `force` rebuild that was turned into the look of one (see [`unforce`]).
    rebuilt: bool,
}

/// The path's id: `/v1/{rollouts,sessions,sandboxes,environments}/{id}...`.
pub(super) fn path_target(path: &str) -> Option<(Kind, &str)> {
    let mut parts = path.strip_prefix("/v1/")?.split('/');
    let kind = match parts.next()? {
        "rollouts" => Kind::Rollout,
        "sessions" => Kind::Session,
        "sandboxes" => Kind::Sandbox,
        "environments" => Kind::Environment,
        _ => return None,
    };
    let id = parts.next().filter(|id| !id.is_empty())?;
    Some((kind, id))
}

pub(in crate::serve) async fn layer(State(app): State<App>, mut request: Request, next: Next) -> Response {
    if !crate::serve::http::origin_allowed(request.headers()) {
        return ApiError::new(
            403,
            "a browser page may reach this service only at its address, from a page it serves (Origin and Host differ, or Host is a DNS name)",
        )
        .into_response();
    }
    let service = app.service.clone();
    let tenancy = &service.tenancy;
    let path = request.uri().path().to_string();
    let who = match tenancy.identify(request.headers(), &path) {
        Ok(who) => who,
        Err(e) => return e.into_response(),
    };
    let route = format!(
        "{} {}",
        request.method(),
        request
            .extensions()
            .get::<MatchedPath>()
            .map_or("(no route)", |m| m.as_str())
    );
    let response = match tenancy.take_request(&who) {
        Err(e) => over_quota(&who, e).into_response(),
        Ok(()) => {
            scope_idempotency_key(&who, request.headers_mut());
            request.extensions_mut().insert(who.clone());
            let changes = request.method() != Method::GET || request.headers().contains_key("upgrade");
            let (response, made) = guarded(&service, &who, &route, request, next).await;
            if changes {
                audit(&service, &who, &route, &path, made, response.status().as_u16());
            }
            response
        }
    };
    let class = match response.status().as_u16() {
        200..=399 => "2xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    engine::metrics::get()
        .tenant_requests
        .with_label_values(&[who.profile.tenant.name.as_str(), class])
        .inc();
    response
}

/// The checks, the handler, and what follows it: the answer, and the first id it made.
async fn guarded(
    service: &Arc<Service>,
    who: &Who,
    route: &str,
    request: Request,
    next: Next,
) -> (Response, Option<String>) {
    let path = request.uri().path().to_string();
    let (checked, request) = match check(service, who, route, request).await {
        Ok(v) => v,
        Err(e) => return (e.into_response(), None),
    };
    if let Some(answer) = checked.answer {
        return (answer, None);
    }
    if let Some(bounds) = crate::serve::http::id_bounds(&path) {
        return (bounds.into_response(), None);
    }
    let response = next.run(request).await;
    let _held = checked.pending;
    if let Some((kind, id, nobodys)) = &checked.target {
        if *nobodys && response.status() == 404 {
            return (not_found(*kind, id).into_response(), None);
        }
    }
    super::views::after(service, who, (route, &path), response, checked.rebuilt).await
}

/// The checks before the handler: the path's id, ids and sizes named in the body, quotas.
async fn check<'a>(
    service: &'a Service,
    who: &Who,
    route: &str,
    mut request: Request,
) -> Result<(Checked<'a>, Request), ApiError> {
    let mut checked = Checked::default();
    let path = request.uri().path().to_string();
    if let Some((kind, id)) = path_target(&path) {
        let owners = service.tenancy.owners.of(kind, id);
        let mine = owners.iter().find(|o| o.tenant == who.tenant()).copied();
        if mine.is_none() && (!owners.is_empty() || !who.profile.is_default()) {
            if route != MCP_ROUTE {
                return Err(not_found(kind, id));
            }
            // MCP answers in JSON-RPC, with the request's id: its handler says "no such
            // session" itself, alike for this id and one that never was.
            request.extensions_mut().insert(Hidden);
        }
        checked.target = Some((kind, id.to_string(), owners.is_empty() && route != MCP_ROUTE));
        if kind == Kind::Environment {
            checked.answer = super::views::environment_before(service, who, route, id, mine, &owners).await;
        }
    }
    let (mut request, body) = read_json(route, request).await?;
    let id = checked.target.as_ref().map(|(_, id, _)| id.clone()).unwrap_or_default();
    checked.pending = match route {
        "POST /v1/sandboxes" => Some(check_new_sandbox(service, who, body.as_ref()).await?),
        "POST /v1/environments" => {
            check_context(service, who, body.as_ref())?;
            service.check_build_minutes(who)?;
            service.check_disk(who)?;
            if let Some((unforced, renewed)) = unforce(service, who, body.as_ref()) {
                let (parts, _) = request.into_parts();
                request = Request::from_parts(parts, Body::from(unforced));
                checked.rebuilt = renewed;
            }
            None
        }
        "POST /v1/sessions" => Some(service.admit_forks(who, 1, service.session_mib()).await?),
        "POST /v1/sessions/{id}/branch" | "POST /v1/sessions/{id}/resume" => {
            let mib = service.tenancy.memory.get(&id).unwrap_or_else(|| service.session_mib());
            Some(service.admit_forks(who, 1, mib).await?)
        }
        "POST /v1/sandboxes/{id}/branch" | "POST /v1/sandboxes/{id}/resume" => {
            let count = body.as_ref().and_then(|b| b["count"].as_u64()).unwrap_or(1);
            let mib = sandbox_mib(service, &id).await;
            Some(service.admit_forks(who, count.max(1), mib).await?)
        }
        "POST /v1/sandboxes/{id}/pause"
        | "POST /v1/sandboxes/{id}/checkpoint"
        | "POST /v1/sandboxes/{id}/snapshot"
        | "POST /v1/sessions/{id}/pause" => {
            service.check_disk(who)?;
            None
        }
        _ => None,
    };
    Ok((checked, request))
}

/// The body of a route whose JSON names ids or sizes, read (and put back) to check them.
async fn read_json(route: &str, request: Request) -> Result<(Request, Option<Value>), ApiError> {
    if !matches!(
        route,
        "POST /v1/sandboxes" | "POST /v1/environments" | "POST /v1/sandboxes/{id}/branch"
    ) {
        return Ok((request, None));
    }
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_CHECKED_BODY)
        .await
        .map_err(|_| ApiError::new(413, format!("a request body is at most {} MiB", MAX_CHECKED_BODY >> 20)))?;
    let value = serde_json::from_slice::<Value>(&bytes).ok();
    Ok((Request::from_parts(parts, Body::from(bytes)), value))
}

/// `POST /v1/sandboxes`: the environment must be the caller's (and look built to it), the
/// network policy granted to it, and the new VM within its quotas.
async fn check_new_sandbox<'a>(service: &'a Service, who: &Who, body: Option<&Value>) -> Result<Pending<'a>, ApiError> {
    let Some(body) = body else {
        // Not JSON: the handler says what is wrong with it.
        return service.admit_forks(who, 0, 0).await;
    };
    let mut mib = body["memory_mib"].as_u64();
    if let Some(env) = body["environment"].as_str() {
        let owners = service.tenancy.owners.of(Kind::Environment, env);
        let mine = owners.iter().find(|o| o.tenant == who.tenant()).copied();
        match mine {
            None if !owners.is_empty() || !who.profile.is_default() => {
                return Err(ApiError::field(404, "environment", format!("no environment {env:?}")));
            }
            Some(owner) if !super::views::visible(service, env, &owner) => {
                return Err(ApiError::field(
                    409,
                    "environment",
                    format!("environment {env} is still building (GET /v1/environments/{env}/logs)"),
                ));
            }
            _ => {}
        }
        if mib.is_none() {
            if let Some(api) = &service.sandbox {
                mib = api
                    .environments
                    .get(env, "environment")
                    .ok()
                    .map(|e| u64::from(e.view().memory_mib));
            }
        }
    }
    if let Some(network) = body["network"].as_str() {
        if !who.profile.may_use_network(network) {
            let granted: Vec<&str> = who.profile.grants.iter().map(String::as_str).collect();
            return Err(ApiError::field(
                400,
                "network",
                format!(
                    "no network policy {network:?} is granted to tenant {} (granted: {}; farm tenant grant)",
                    who.profile.tenant.name,
                    if granted.is_empty() {
                        "none".to_string()
                    } else {
                        granted.join(", ")
                    }
                ),
            ));
        }
    }
    service.admit_forks(who, 1, mib.unwrap_or(512)).await
}

/// `POST /v1/environments` with `force`: a rebuild happens only for content no other tenant
/// asked for (it would change what they use). Otherwise the request goes on without `force`
/// (its new body is returned), and a caller that owned the environment sees it built again
/// after a build's time, as if the rebuild had happened: nothing shows that others share it.
fn unforce(service: &Service, who: &Who, body: Option<&Value>) -> Option<(Bytes, bool)> {
    let body = body.filter(|b| b["force"] == Value::Bool(true))?;
    let api = service.sandbox.as_ref()?;
    let request = serde_json::from_value(body.clone()).ok()?;
    let id = api.environments.id_of(&request)?;
    let tenancy = &service.tenancy;
    let owners = tenancy.owners.of(Kind::Environment, &id);
    if owners.iter().all(|o| o.tenant == who.tenant()) {
        return None;
    }
    let renewed = mine(&owners, who).is_some();
    if renewed {
        if let Err(e) = tenancy
            .owners
            .renew(&tenancy.db, Kind::Environment, &id, who.tenant(), tenants::now_ms())
        {
            tracing::error!("renewing an environment's owner: {e}");
        }
    }
    let mut body = body.clone();
    body["force"] = Value::Bool(false);
    Some((
        Bytes::from(serde_json::to_vec(&body).expect("JSON serializes")),
        renewed,
    ))
}

/// `POST /v1/environments`: a Dockerfile's build context must be one the caller uploaded.
fn check_context(service: &Service, who: &Who, body: Option<&Value>) -> Result<(), ApiError> {
    let Some(context) = body.and_then(|b| b["dockerfile"]["context"].as_str()) else {
        return Ok(());
    };
    let owners = service.tenancy.owners.of(Kind::Context, context);
    let mine = owners.iter().any(|o| o.tenant == who.tenant());
    if !mine && (!owners.is_empty() || !who.profile.is_default()) {
        return Err(ApiError::field(
            404,
            "dockerfile.context",
            format!("no uploaded context {context:?} (POST the tar archive to /v1/contexts first)"),
        ));
    }
    Ok(())
}

/// The guest memory of a sandbox, as made.
async fn sandbox_mib(service: &Service, id: &str) -> u64 {
    if let Some(mib) = service.tenancy.memory.get(id) {
        return mib;
    }
    match &service.sandbox {
        Some(api) => match api.sandboxes.view(id).await {
            Ok(view) => u64::from(view.memory_mib),
            Err(_) => 0,
        },
        None => 0,
    }
}

/// An `Idempotency-Key` is the caller's own: another tenant's same key is another key.
fn scope_idempotency_key(who: &Who, headers: &mut axum::http::HeaderMap) {
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return;
    };
    if who.profile.is_default() || key.is_empty() || key.len() > 256 {
        return;
    }
    let digest = Sha256::digest(format!("tenant {} key {key}", who.tenant().0).as_bytes());
    let scoped: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    headers.insert(
        "idempotency-key",
        HeaderValue::from_str(&scoped).expect("hex is a header value"),
    );
}

/// Appends the call to the audit: its path's id, else the first id it made.
fn audit(service: &Service, who: &Who, route: &str, path: &str, made: Option<String>, status: u16) {
    let target = path_target(path).map(|(_, id)| id.to_string()).or(made);
    service.tenancy.audit(who, route, target, status);
}

/// Reads an answer's body (to record or filter the ids in it), or gives it back as it was.
pub(super) async fn read_answer(response: Response) -> Result<(axum::http::response::Parts, Bytes), Response> {
    let (parts, body) = response.into_parts();
    match axum::body::to_bytes(body, MAX_READ_ANSWER).await {
        Ok(bytes) => Ok((parts, bytes)),
        Err(e) => Err(ApiError::new(500, format!("reading an answer: {e}")).into_response()),
    }
}

/// Whether an owner record is this caller's.
pub(super) fn mine(owners: &[Owner], who: &Who) -> Option<Owner> {
    owners.iter().find(|o| o.tenant == who.tenant()).copied()
}
