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
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};

use service::bounds::ID_BYTES;
pub use service::tenancy::*;

use crate::serve::error::{ApiError, Refused, Respond};
use service::ErrorKind;

pub(in crate::serve) async fn layer(
    State(service): State<std::sync::Arc<service::Service>>,
    mut request: Request,
    next: Next,
) -> Response {
    if !origin_allowed(request.headers()) {
        return ApiError::new(
            ErrorKind::Forbidden,
            "a browser page may reach this service only at its address, from a page it serves (Origin and Host differ, or Host is a DNS name)",
        )
        .into_response();
    }
    if request.method() == Method::HEAD {
        // A HEAD's length would be the unfiltered answer's.
        return ApiError::new(ErrorKind::MethodNotAllowed, "HEAD is not served: use GET").into_response();
    }
    let tenancy = &service.tenancy;
    let path = request.uri().path().to_string();
    if let Some(bounds) = id_bounds(&path) {
        return bounds.into_response();
    }
    let identified = if super::e2b::Face::of(&path).in_sandbox() {
        // E2B's envd routes: a sandbox's access token, for that sandbox alone, or a signed
        // file URL, for the one file operation it signs.
        match super::e2b::signed_claim(tenancy, &request) {
            Some(signed) => signed,
            None => {
                let (sandbox, token) = super::e2b::sandbox_access(request.headers());
                tenancy.identify_sandbox_access(sandbox, token)
            }
        }
    } else {
        let authorization = request
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        match (bearer(authorization), super::e2b::api_key(request.headers())) {
            ("", Some(key)) => tenancy.identify(&key, &path),
            (given, _) => tenancy.identify(given, &path),
        }
    };
    let who = match identified {
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

/// The path's id, for the audit: `/v1/{rollouts,sessions,sandboxes,environments}/{id}...`
/// (and E2B's `/sandboxes/{id}...`, `/v2/sandboxes/{id}...`).
fn path_id(path: &str) -> Option<String> {
    let rest = path
        .strip_prefix("/v1/")
        .or_else(|| path.strip_prefix("/v2/"))
        .or_else(|| path.strip_prefix('/').filter(|p| p.starts_with("sandboxes/")))?;
    let mut parts = rest.split('/');
    parts
        .next()
        .filter(|kind| matches!(*kind, "rollouts" | "sessions" | "sandboxes" | "environments"))?;
    parts.next().filter(|id| !id.is_empty()).map(str::to_string)
}

/// A 429 or 503 that is not about the caller's own quota is about the node, and its figures
/// (live forks, queue length, free memory) are every tenant's work: a tenant other than
/// `default` is told that the node has no room, with the same `Retry-After`.
fn node_refusal(who: &Who, response: Response) -> Response {
    if who.profile.is_default() {
        return response;
    }
    let Some(refused) = response.extensions().get::<Refused>().cloned() else {
        return response;
    };
    if refused.quota || !matches!(refused.kind, ErrorKind::Busy | ErrorKind::Unavailable) {
        return response;
    }
    let mut error = ApiError::new(
        refused.kind,
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

/// In an answer's extensions: the first id the call made (for the audit).
#[derive(Debug, Clone)]
pub(in crate::serve) struct Made(pub String);

/// A 400 when a path segment is longer than an id may be.
fn id_bounds(path: &str) -> Option<ApiError> {
    let segment = path.split('/').find(|s| s.len() > service::bounds::ID_BYTES)?;
    Some(ApiError::field(
        ErrorKind::Invalid,
        "id",
        format!(
            "a path's id must be at most {} bytes; got {} bytes",
            service::bounds::ID_BYTES,
            segment.len()
        ),
    ))
}

/// Whether a request may act, by its `Origin`: absent (not a browser), or the very host the
/// request was sent to when that host is an IP address or `localhost`. Browsers send
/// `Origin` on every cross-site POST and WebSocket upgrade, which CORS does not stop (a form
/// can POST JSON-looking text; WebSockets have no preflight), and a page that rebinds its
/// own DNS name to the service's address sends that name as both `Origin` and `Host`: so a
/// browser may reach the service by address only. Clients that are not browsers send no
/// `Origin` and are not affected.
fn origin_allowed(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    let origin = origin.to_str().unwrap_or("");
    let origin_host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .unwrap_or("");
    !host.is_empty() && origin_host.eq_ignore_ascii_case(host) && is_address(host)
}

/// `host[:port]` names an IP address (`[v6]` too) or `localhost`, not a DNS name.
fn is_address(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        }),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_names_the_paths_id() {
        assert_eq!(super::path_id("/v1/sandboxes/sb-1/exec").as_deref(), Some("sb-1"));
        assert_eq!(super::path_id("/v1/environments/env-2").as_deref(), Some("env-2"));
        for none in ["/v1/sandboxes", "/v1/capacity", "/metrics", "/v1/sandboxes/"] {
            assert_eq!(super::path_id(none), None, "{none}");
        }
    }

    #[test]
    fn origin_must_be_the_host_itself() {
        let mut h = HeaderMap::new();
        assert!(origin_allowed(&h), "no Origin: not a browser");
        h.insert(header::HOST, "127.0.0.1:8080".parse().unwrap());
        h.insert(header::ORIGIN, "http://127.0.0.1:8080".parse().unwrap());
        assert!(origin_allowed(&h));
        h.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert!(!origin_allowed(&h));
        h.insert(header::ORIGIN, "null".parse().unwrap());
        assert!(!origin_allowed(&h));
        h.insert(header::ORIGIN, "http://127.0.0.1:8080.evil.example".parse().unwrap());
        assert!(!origin_allowed(&h));
        // DNS rebinding: the attacker's name as both Origin and Host.
        h.insert(header::HOST, "evil.example:8080".parse().unwrap());
        h.insert(header::ORIGIN, "http://evil.example:8080".parse().unwrap());
        assert!(!origin_allowed(&h));
        for host in ["localhost:8765", "[::1]:8765", "10.1.2.3", "[fe80::1]"] {
            h.insert(header::HOST, host.parse().unwrap());
            h.insert(header::ORIGIN, format!("http://{host}").parse().unwrap());
            assert!(origin_allowed(&h), "{host}");
        }
    }
}
