//! The layer every route of `farm serve` runs behind: transport and nothing more. It refuses
//! a browser's cross-site request and HEAD, resolves the bearer token to a caller ([`Who`],
//! in the request's extensions), takes the call from the caller's requests a second, scopes
//! an `Idempotency-Key` to the caller, appends a call that changed state to the audit, and
//! says nothing of the node's own figures to a tenant other than `default`.
//!
//! What a call may see and touch (owners, grants, quotas) is the service's: every call on an
//! id takes one the service held to the caller (`service::sandbox::SandboxId`,
//! `service::sessions::SessionId`, `Service::resolve_environment`, ...).

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};

use service::bounds::ID_BYTES;
pub use service::tenancy::*;

use crate::serve::error::{ApiError, Refused, Respond};
use crate::serve::http::{App, Made};

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
    let who = match tenancy.identify(bearer(authorization), &path) {
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
            let response = next.run(request).await;
            if changes {
                let made = response.extensions().get::<Made>().map(|m| m.0.clone());
                let target = path_id(&path).or(made).filter(|t| t.len() <= ID_BYTES);
                tenancy.audit(&who, &route, target, response.status().as_u16());
            }
            node_refusal(&who, response)
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

/// The path's id, for the audit: `/v1/{rollouts,sessions,sandboxes,environments}/{id}...`.
fn path_id(path: &str) -> Option<String> {
    let mut parts = path.strip_prefix("/v1/")?.split('/');
    parts
        .next()
        .filter(|kind| matches!(*kind, "rollouts" | "sessions" | "sandboxes" | "environments"))?;
    parts.next().filter(|id| !id.is_empty()).map(str::to_string)
}

/// A 429 or 503 that is not about the caller's own quota is about the node, and its figures
/// (live forks, queue length, free memory) are every tenant's work: a tenant other than
/// `default` is told that the node has no room, with the same `Retry-After`.
fn node_refusal(who: &Who, response: Response) -> Response {
    let status = response.status().as_u16();
    if who.profile.is_default() || !matches!(status, 429 | 503) {
        return response;
    }
    let refused = response.extensions().get::<Refused>().cloned().unwrap_or_default();
    if refused.quota {
        return response;
    }
    let mut error = ApiError::new(
        status,
        "this node, shared by several tenants, has no room now: retry later",
    );
    error.field = refused.field;
    error.retry_after = refused.retry_after;
    error.into_response()
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_audit_names_the_paths_id() {
        assert_eq!(super::path_id("/v1/sandboxes/sb-1/exec").as_deref(), Some("sb-1"));
        assert_eq!(super::path_id("/v1/environments/env-2").as_deref(), Some("env-2"));
        for none in ["/v1/sandboxes", "/v1/capacity", "/metrics", "/v1/sandboxes/"] {
            assert_eq!(super::path_id(none), None, "{none}");
        }
    }
}
