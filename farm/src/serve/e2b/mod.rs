//! E2B's protocol as a front door: code written for E2B's SDKs (`e2b` on PyPI) runs on farm
//! unmodified, with `E2B_API_URL` and `E2B_SANDBOX_URL` both set to this service (`farm e2b
//! env` prints the settings). The reference is `docs/e2b.md`.
//!
//! ```text
//! E2B's REST API (X-API-KEY: a tenant's key)     /sandboxes, /v2/sandboxes   -> control
//! envd in a sandbox (E2b-Sandbox-Id, X-Access-Token)
//!     Connect RPC, JSON            /process.Process/*                         -> envd
//!     plain HTTP                   /files, /health                            -> envd
//! the code interpreter in a sandbox (E2b-Sandbox-Id, an access token)
//!     NDJSON and JSON              /execute, /contexts                        -> interpreter
//! ```
//!
//! A transport like the others: every call lands on the service core's typed calls (the same
//! sandboxes, owners, quotas and audit as `/v1/sandboxes`). What is E2B's here is the shape
//! of requests and answers, and the errors: `{"code": <status>, "message"}` on the REST API
//! and `/files`, Connect's `{"code": "<name>", "message"}` on RPCs ([`errors`]).

pub(super) mod connect;
pub(super) mod control;
pub(super) mod envd;
pub(super) mod filesystem;
pub(super) mod interpreter;
pub(super) mod volumes;
pub(super) mod watch;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::Refused;
use service::ErrorKind;

/// The envd version this front door reports: the SDK turns features on by it (below 0.4.0 it
/// names a user on every call; at 0.5.7 file-like uploads go as octet-stream).
pub(super) const ENVD_VERSION: &str = "0.6.4";

/// The header that names the sandbox an in-sandbox request is for.
pub(super) const SANDBOX_HEADER: &str = "e2b-sandbox-id";

/// The header that carries a sandbox's access token.
pub(super) const ACCESS_HEADER: &str = "x-access-token";

/// The header the code interpreter's SDK carries a sandbox's token in on every call (it
/// sends `X-Access-Token` on `/execute` alone): farm answers the same token for both.
pub(super) const TRAFFIC_HEADER: &str = "e2b-traffic-access-token";

/// Marks an answer relayed from a sandbox's code interpreter: its status and body are the
/// interpreter's, not reshaped by [`errors`].
#[derive(Clone, Copy)]
pub(super) struct Relayed;

/// What a request is, for E2B's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Face {
    /// Not E2B's.
    None,
    /// The REST API (errors `{"code": <status>, "message"}`).
    Rest,
    /// envd's plain HTTP routes, in a sandbox (errors as the REST API's).
    EnvdHttp,
    /// envd's Connect RPCs, in a sandbox (errors Connect's).
    EnvdRpc,
    /// The code interpreter, in a sandbox (errors as the REST API's).
    Interpreter,
}

impl Face {
    pub(super) fn of(path: &str) -> Face {
        if path == "/files" || path == "/health" {
            Face::EnvdHttp
        } else if path == "/execute" || path == "/contexts" || path.starts_with("/contexts/") {
            Face::Interpreter
        } else if path.starts_with("/process.Process/") || path.starts_with("/filesystem.Filesystem/") {
            Face::EnvdRpc
        } else if path == "/sandboxes"
            || path.starts_with("/sandboxes/")
            || path == "/v2/sandboxes"
            || path.starts_with("/v2/sandboxes/")
            || path == "/volumes"
            || path.starts_with("/volumes/")
        {
            Face::Rest
        } else {
            Face::None
        }
    }

    /// Whether its requests are identified by a sandbox's access token, not a key.
    pub(super) fn in_sandbox(self) -> bool {
        matches!(self, Face::EnvdHttp | Face::EnvdRpc | Face::Interpreter)
    }
}

/// The sandbox an in-sandbox request names and the access token it carries (empty: none):
/// `X-Access-Token`, or else `E2B-Traffic-Access-Token`.
pub(super) fn sandbox_access(headers: &HeaderMap) -> (&str, &str) {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
    let token = match get(ACCESS_HEADER) {
        "" => get(TRAFFIC_HEADER),
        token => token,
    };
    (get(SANDBOX_HEADER), token)
}

/// `?path=...&username=...` of `/files`, and a signed URL's `signature` and
/// `signature_expiration`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::serve) struct FileQuery {
    pub(super) path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    signature_expiration: Option<u64>,
}

/// Who a request to `/files` with a signature and no access token is, by its signed URL
/// (E2B's `download_url`, `upload_url`): the query read as the handler reads it (one value a
/// key, so both read the same path), the operation its method. `None`: not such a request.
pub(in crate::serve) fn signed_claim(
    tenancy: &service::tenancy::Tenancy,
    request: &axum::extract::Request,
) -> Option<Result<service::tenancy::Who, service::ApiError>> {
    if request.uri().path() != "/files" || !sandbox_access(request.headers()).1.is_empty() {
        return None;
    }
    let q = axum::extract::Query::<FileQuery>::try_from_uri(request.uri()).ok()?.0;
    let signature = q.signature.as_deref()?;
    let claim = service::tenancy::SignedFile {
        path: q.path.as_deref().unwrap_or(""),
        write: request.method() == axum::http::Method::POST,
        user: q.username.as_deref().unwrap_or(""),
        expiration: q.signature_expiration,
        signature,
    };
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Some(tenancy.identify_signed_file(&claim, now_s))
}

/// The key of an E2B client: `X-API-KEY`, where `e2b_HEX` is the tenant key `farm_HEX` (E2B's
/// SDK of 2.45 refuses a key not shaped `e2b_<hex>`; `farm e2b env` gives it that shape).
pub(super) fn api_key(headers: &HeaderMap) -> Option<String> {
    let key = headers.get("x-api-key")?.to_str().ok()?;
    Some(match key.strip_prefix("e2b_") {
        Some(hex) => format!("{}{hex}", tenants::KEY_PREFIX),
        None => key.to_string(),
    })
}

/// The outermost layer: a failure on an E2B route, whoever refused it (the tenancy layer, an
/// extractor, a handler), is answered in E2B's error shape, which its SDK needs to raise the
/// right exception (a body it cannot parse crashes it instead).
pub(super) async fn errors(request: Request, next: Next) -> Response {
    let face = Face::of(request.uri().path());
    let response = next.run(request).await;
    if face == Face::None || response.status().is_success() || response.extensions().get::<Relayed>().is_some() {
        return response;
    }
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
    let message = serde_json::from_slice::<service::wire::ErrorBody>(&bytes)
        .map(|e| e.error)
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
    let kind = parts.extensions.get::<Refused>().map(|r| r.kind);
    let body = match face {
        Face::EnvdRpc => serde_json::json!({ "code": connect::code(parts.status, kind), "message": message }),
        _ => serde_json::json!({ "code": parts.status.as_u16(), "message": message }),
    };
    let mut answer = (parts.status, axum::Json(body)).into_response();
    for name in [header::RETRY_AFTER, header::WWW_AUTHENTICATE] {
        if let Some(value) = parts.headers.get(&name) {
            answer.headers_mut().insert(name, value.clone());
        }
    }
    answer
}

/// An answer with no body (E2B's 204s).
pub(super) fn no_content() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

/// `ms` since the epoch as RFC 3339 in UTC, as E2B's API gives times.
pub(super) fn rfc3339(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// JSON with a content type of E2B's choosing.
pub(super) fn typed(status: StatusCode, content_type: &'static str, body: impl Into<Body>) -> Response {
    let mut response = (status, body.into()).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A refusal a handler makes in E2B's terms.
pub(super) fn refused(kind: ErrorKind, message: impl Into<String>) -> super::error::HttpError {
    super::error::HttpError::from(service::ApiError::new(kind, message.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_told_apart() {
        assert_eq!(Face::of("/v2/sandboxes"), Face::Rest);
        assert_eq!(Face::of("/sandboxes/abc/timeout"), Face::Rest);
        assert_eq!(Face::of("/files"), Face::EnvdHttp);
        assert_eq!(Face::of("/process.Process/Start"), Face::EnvdRpc);
        assert_eq!(Face::of("/execute"), Face::Interpreter);
        assert_eq!(Face::of("/contexts/abc/restart"), Face::Interpreter);
        for path in [
            "/v1/sandboxes",
            "/v1/sandboxes/x/files",
            "/sandboxesX",
            "/metrics",
            "/executeX",
            "/contextsX",
        ] {
            assert_eq!(Face::of(path), Face::None, "{path}");
        }
        assert!(Face::EnvdRpc.in_sandbox() && Face::Interpreter.in_sandbox() && !Face::Rest.in_sandbox());
    }

    #[test]
    fn an_e2b_shaped_key_is_a_tenant_key() {
        let mut headers = HeaderMap::new();
        assert_eq!(api_key(&headers), None);
        headers.insert("x-api-key", "e2b_00ff".parse().unwrap());
        assert_eq!(api_key(&headers).as_deref(), Some("farm_00ff"));
        headers.insert("x-api-key", "farm_00ff".parse().unwrap());
        assert_eq!(api_key(&headers).as_deref(), Some("farm_00ff"));
    }

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
