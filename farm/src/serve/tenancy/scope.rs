//! The middleware every route of `farm serve` runs behind: it says who calls, holds the call
//! to the caller's ids, quotas and network grants, records what the call made as the caller's,
//! shows the caller only its own in lists, and appends the call to the audit.
//!
//! An id in a path the caller does not own answers 404 with the same body whether another
//! tenant owns it or it never existed ([`super::not_found`]).

use crate::serve::error::Respond;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tenants::{Kind, Owner};

use super::usage::Pending;
use super::{not_found, over_quota, Who};
use crate::serve::error::ApiError;
use crate::serve::http::App;
use service::bounds::ID_BYTES;
use service::sandbox::environments::EnvironmentRequest;
use service::sandbox::sandboxes::lifetimes::BranchRequest;
use service::sandbox::sandboxes::SandboxRequest;
use service::state::Service;

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
pub(super) struct Checked {
    /// Forks this call may make, held against the quotas until it answers.
    pending: Option<Pending>,
    /// A build this call may start, held against the build minutes until it ends.
    pub(super) build: Option<super::usage::BuildSlot>,
    /// An answer made without the handler.
    answer: Option<Response>,
    /// A `force` rebuild that was turned into the look of one (see [`unforce`]).
    pub(super) rebuilt: bool,
}

/// Routes that make something: they run to their end (and what they made is recorded as the
/// caller's) even when the client hangs up.
const MAKERS: &[&str] = &[
    "POST /v1/sessions",
    "POST /v1/sessions/{id}/branch",
    "POST /v1/sessions/{id}/resume",
    "POST /v1/sandboxes",
    "POST /v1/sandboxes/{id}/branch",
    "POST /v1/sandboxes/{id}/resume",
    "POST /v1/sandboxes/{id}/snapshot",
    "POST /v1/environments",
    "POST /v1/contexts",
];

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
    if request.method() == Method::HEAD {
        // A HEAD's length would be the unfiltered answer's.
        return ApiError::new(405, "HEAD is not served: use GET").into_response();
    }
    let service = app.service.clone();
    let tenancy = &service.tenancy;
    let path = request.uri().path().to_string();
    if let Some(bounds) = crate::serve::http::id_bounds(&path) {
        return bounds.into_response();
    }
    let authorization = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let who = match tenancy.identify(super::bearer(authorization), &path) {
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
            node_refusal(&who, response).await
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

/// A 429 or 503 that is not about the caller's own quota is about the node, and its figures
/// (live forks, queue length, free memory) are every tenant's work: a tenant other than
/// `default` is told that the node has no room, with the same `Retry-After`.
async fn node_refusal(who: &Who, response: Response) -> Response {
    let status = response.status().as_u16();
    if who.profile.is_default() || !matches!(status, 429 | 503) {
        return response;
    }
    let retry_after = response.headers().get(axum::http::header::RETRY_AFTER).cloned();
    let Ok((_, bytes)) = read_answer(response).await else {
        return ApiError::new(status, "this node has no room now: retry later").into_response();
    };
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if body.get("quota").is_some_and(|q| !q.is_null()) {
        let mut kept = (
            axum::http::StatusCode::from_u16(status).expect("a status"),
            axum::Json(body),
        )
            .into_response();
        if let Some(r) = retry_after {
            kept.headers_mut().insert(axum::http::header::RETRY_AFTER, r);
        }
        return kept;
    }
    let mut error = ApiError::new(
        status,
        "this node, shared by several tenants, has no room now: retry later",
    );
    error.field = body["field"].as_str().map(str::to_string);
    error.retry_after = retry_after.and_then(|v| v.to_str().ok()?.parse().ok());
    error.into_response()
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
    let (mut checked, request) = match check(service, who, route, request).await {
        Ok(v) => v,
        Err(e) => return (e.into_response(), None),
    };
    if let Some(answer) = checked.answer.take() {
        return (answer, None);
    }
    let maker = MAKERS.contains(&route);
    let (service, who, route) = (service.clone(), who.clone(), route.to_string());
    let call = async move {
        let response = next.run(request).await;
        let held = checked.pending.take();
        let answer = super::views::after(&service, &who, (&route, &path), response, checked).await;
        drop(held);
        answer
    };
    if !maker {
        return call.await;
    }
    // Run to the end in a task of its own: a client that hangs up does not leave a fork or
    // an environment made and recorded as nobody's.
    tokio::spawn(call).await.unwrap_or_else(|e| {
        (
            ApiError::new(500, format!("the request's task failed: {e}")).into_response(),
            None,
        )
    })
}

/// The checks before the handler: the path's id, ids and sizes named in the body, quotas.
async fn check(
    service: &Service,
    who: &Who,
    route: &str,
    mut request: Request,
) -> Result<(Checked, Request), ApiError> {
    let mut checked = Checked::default();
    let path = request.uri().path().to_string();
    let mut id = String::new();
    if let Some((kind, raw)) = path_target(&path) {
        // An id is never percent-encoded: the router would decode it after this check.
        let owners = match raw.contains('%') {
            true => Vec::new(),
            false => service.tenancy.owners.of(kind, raw),
        };
        let mine = mine(&owners, who);
        if mine.is_none() {
            if route != MCP_ROUTE {
                return Err(not_found(kind, raw));
            }
            // MCP answers in JSON-RPC, with the request's id: its handler says "no such
            // session" itself, alike for this id and one that never was.
            request.extensions_mut().insert(Hidden);
        }
        if kind == Kind::Environment {
            checked.answer = super::views::environment_before(service, who, route, raw, mine, &owners).await;
        }
        id = raw.to_string();
    }
    checked.pending = match route {
        "POST /v1/sandboxes" => {
            let (request, body) = read_body::<SandboxRequest>(request, false).await?;
            let pending = check_new_sandbox(service, who, &body).await?;
            return Ok((
                Checked {
                    pending: Some(pending),
                    ..checked
                },
                with(request, body),
            ));
        }
        "POST /v1/environments" => {
            let (request, mut body) = read_body::<EnvironmentRequest>(request, false).await?;
            check_context(service, who, &body)?;
            checked.build = Some(service.admit_build(who)?);
            service.check_disk(who)?;
            checked.rebuilt = unforce(service, who, &mut body);
            return Ok((checked, with(request, body)));
        }
        "POST /v1/sandboxes/{id}/branch" => {
            let (request, body) = read_body::<BranchRequest>(request, true).await?;
            // Past its bound (the handler says which) a count is held as the bound.
            let count = body.count.unwrap_or(1);
            let mib = sandbox_mib(service, &id).await;
            checked.pending = Some(service.admit_forks(who, count.clamp(1, 64), mib).await?);
            return Ok((checked, with(request, body)));
        }
        "POST /v1/sessions" => Some(service.admit_forks(who, 1, service.session_mib()).await?),
        "POST /v1/sessions/{id}/branch" | "POST /v1/sessions/{id}/resume" => {
            let mib = service.tenancy.memory.get(&id).unwrap_or_else(|| service.session_mib());
            Some(service.admit_forks(who, 1, mib).await?)
        }
        "POST /v1/sandboxes/{id}/resume" => {
            let mib = sandbox_mib(service, &id).await;
            Some(service.admit_forks(who, 1, mib).await?)
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

/// In a request's extensions: its body as the middleware parsed it (once, strictly) and
/// checked it. The handler takes this typed value and never reads the bytes again, so what
/// was checked is what runs.
#[derive(Debug, Clone)]
pub struct Parsed<T>(pub T);

/// The body of a route whose JSON names ids or sizes, parsed strictly into its typed
/// request (a body that is not one is refused here: a check that cannot run lets nothing
/// through). With `empty_is_object`, an empty body is `{}` (a branch's defaults).
async fn read_body<T: DeserializeOwned>(request: Request, empty_is_object: bool) -> Result<(Request, T), ApiError> {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_CHECKED_BODY)
        .await
        .map_err(|_| ApiError::new(413, format!("a request body is at most {} MiB", MAX_CHECKED_BODY >> 20)))?;
    let typed = match bytes.is_empty() && empty_is_object {
        true => crate::serve::http::parse(b"{}")?,
        false => crate::serve::http::parse(&bytes)?,
    };
    // The bytes stay for what digests them (an `Idempotency-Key` compares bodies).
    Ok((Request::from_parts(parts, Body::from(bytes)), typed))
}

/// The request with its checked body for the handler.
fn with<T: Clone + Send + Sync + 'static>(mut request: Request, body: T) -> Request {
    request.extensions_mut().insert(Parsed(body));
    request
}

/// `POST /v1/sandboxes`: the environment must be the caller's (and look built to it), the
/// network policy granted to it, and the new VM within its quotas.
async fn check_new_sandbox(service: &Service, who: &Who, body: &SandboxRequest) -> Result<Pending, ApiError> {
    let env = body.environment.as_str();
    match mine(&service.tenancy.owners.of(Kind::Environment, env), who) {
        None => {
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
    let mib = body.memory_mib.or_else(|| {
        let api = service.sandbox.as_ref()?;
        let found = api.environments.get(env, "environment").ok()?;
        Some(u64::from(found.view().memory_mib))
    });
    if let Some(network) = &body.network {
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
/// asked for (it would change what they use). Otherwise the request goes on without `force`,
/// and a caller that owned the environment sees it built again after a build's time, as if
/// the rebuild had happened (true: the caller's own share was renewed): nothing shows that
/// others share it.
fn unforce(service: &Service, who: &Who, body: &mut EnvironmentRequest) -> bool {
    if !body.force {
        return false;
    }
    let Some(api) = service.sandbox.as_ref() else {
        return false;
    };
    let Some(id) = api.environments.id_of(body) else {
        return false;
    };
    let tenancy = &service.tenancy;
    let owners = tenancy.owners.of(Kind::Environment, &id);
    let exists = api.environments.get(&id, "id").is_ok();
    let sole = owners.len() == 1 && owners[0].tenant == who.tenant();
    if sole || (owners.is_empty() && !exists) {
        return false;
    }
    body.force = false;
    let renewed = mine(&owners, who).is_some();
    if renewed {
        if let Err(e) = tenancy
            .owners
            .renew(&tenancy.db, Kind::Environment, &id, who.tenant(), tenants::now_ms())
        {
            tracing::error!("renewing an environment's owner: {e}");
        }
    }
    renewed
}

/// `POST /v1/environments`: a Dockerfile's build context must be one the caller uploaded.
fn check_context(service: &Service, who: &Who, body: &EnvironmentRequest) -> Result<(), ApiError> {
    let Some(context) = body.dockerfile.as_ref().map(|d| d.context.as_str()) else {
        return Ok(());
    };
    if !service.tenancy.owns(who.tenant(), Kind::Context, context) {
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
    let target = path_target(path)
        .map(|(_, id)| id.to_string())
        .or(made)
        .filter(|t| t.len() <= ID_BYTES);
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
