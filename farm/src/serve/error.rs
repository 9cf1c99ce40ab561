//! A service error as an HTTP answer: its status, `{"error": ..., "field": ..., "quota": ...}`,
//! `Retry-After` and the bearer challenge. The one place a failure becomes a response.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

pub use service::ApiError;

/// An [`ApiError`] as handlers return it (`?` converts).
#[derive(Debug)]
pub struct HttpError(pub ApiError);

impl From<ApiError> for HttpError {
    fn from(e: ApiError) -> HttpError {
        HttpError(e)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        respond(self.0)
    }
}

/// A refusal the transport makes by itself with a status of its own (a WebSocket upgrade's),
/// answered as every failure is.
pub fn refuse(status: StatusCode, message: String) -> Response {
    let body = service::wire::ErrorBody {
        error: message,
        field: None,
        quota: None,
    };
    (status, axum::Json(body)).into_response()
}

/// In a failure's answer: what the middleware may need of it (the tenancy layer tells a 429
/// about the caller's own quota from one about the node).
#[derive(Debug, Clone)]
pub struct Refused {
    pub kind: service::ErrorKind,
    pub quota: bool,
    pub field: Option<String>,
    pub retry_after: Option<u64>,
}

/// The answer of a failure.
pub fn respond(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.kind.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, axum::Json(e.body())).into_response();
    response.extensions_mut().insert(Refused {
        kind: e.kind,
        quota: e.quota.is_some(),
        field: e.field.clone(),
        retry_after: e.retry_after,
    });
    if let Some(secs) = e.retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if e.challenge {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

/// A service error answered by the transport itself (a middleware, a socket's upgrade).
pub trait Respond {
    fn into_response(self) -> Response;
}

impl Respond for ApiError {
    fn into_response(self) -> Response {
        respond(self)
    }
}
