//! What the HTTP routes share: the state they hold, the bearer-token check, strict JSON
//! bodies and replies.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use super::error::ApiError;
use super::service::Service;

#[derive(Clone)]
pub(super) struct App {
    pub service: Arc<Service>,
    /// SHA-256 of the bearer token, when one is required.
    pub token: Option<[u8; 32]>,
}

pub(super) type Reply = Result<Response, ApiError>;

pub(super) fn ok(value: serde_json::Value) -> Reply {
    Ok(axum::Json(value).into_response())
}

/// Every request needs the bearer token when one is set; compared in constant time (of
/// digests, so the token's length does not show either).
pub(super) async fn auth(State(app): State<App>, request: Request, next: Next) -> Response {
    if let Some(expected) = &app.token {
        use subtle::ConstantTimeEq;
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        let digest: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        if !bool::from(digest.ct_eq(expected)) {
            let mut response =
                ApiError::new(401, "a bearer token is required (Authorization: Bearer ...)").into_response();
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return response;
        }
    }
    next.run(request).await
}

/// A JSON body, or a 400 naming the field that is wrong.
pub(super) fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let field = if path == "." { None } else { Some(path) };
        ApiError {
            field,
            ..ApiError::new(400, format!("bad request body: {inner}"))
        }
    })
}

/// The `Idempotency-Key` header, checked (None when absent).
pub(super) fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get("idempotency-key") {
        Some(v) => Ok(Some(
            v.to_str()
                .ok()
                .filter(|k| !k.is_empty() && k.len() <= 256)
                .ok_or_else(|| ApiError::field(400, "Idempotency-Key", "must be 1 to 256 visible ASCII characters"))?
                .to_string(),
        )),
        None => Ok(None),
    }
}

/// The hex SHA-256 of a request body.
pub(super) fn body_digest(body: &[u8]) -> String {
    Sha256::digest(body).iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether a request may act, by its `Origin`: absent (not a browser), or the very host the
/// request was sent to. Browsers send it on every cross-site POST and WebSocket upgrade,
/// which CORS does not stop (MCP's transport asks for this check; OpenEnv's socket gets it
/// too), so a page on another site cannot drive a session on a service without a token.
pub(super) fn origin_allowed(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    let origin = origin.to_str().unwrap_or("");
    let origin_host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .unwrap_or("");
    !host.is_empty() && origin_host.eq_ignore_ascii_case(host)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
