//! The failure a call of the service is told about: its [`ErrorKind`] (which each transport
//! maps to its own code, HTTP's in one place), a message and the field it concerns; the HTTP
//! transport answers it as `{"error": ..., "field": ...}`.

use engine::book::Refusal;
use engine::session::SessionCallError;

/// What kind of failure a call met. The service names no transport's codes: the HTTP
/// transport gives each kind its status (`farm/src/serve/error.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is wrong: a field, a body, a query.
    Invalid,
    /// No credentials, or ones that are not live.
    Unauthenticated,
    /// Refused whoever asks (a browser's cross-site call).
    Forbidden,
    /// No such thing, or one the caller may not see: alike.
    NotFound,
    /// A method this route does not serve.
    MethodNotAllowed,
    /// Not in its present state: paused, still building, being submitted, cut by a change.
    Conflict,
    /// It was there and is gone (its VM died).
    Gone,
    /// Past a size the service takes.
    TooLarge,
    /// An idempotency key again with another body.
    Unprocessable,
    /// Over one of the caller's quotas, or no room on the node now.
    Busy,
    /// The service itself failed.
    Internal,
    /// The guest failed the request: its VM died, or its agent answered badly.
    GuestFailed,
    /// Not now: the service is stopping, or short of memory.
    Unavailable,
    /// The guest did not answer the request in time (it goes on).
    GuestTimeout,
}

impl ErrorKind {
    /// Its HTTP status: the one place a kind becomes one (the REST transport's answers, the
    /// port listener's refusals).
    pub fn http_status(self) -> u16 {
        match self {
            ErrorKind::Invalid => 400,
            ErrorKind::Unauthenticated => 401,
            ErrorKind::Forbidden => 403,
            ErrorKind::NotFound => 404,
            ErrorKind::MethodNotAllowed => 405,
            ErrorKind::Conflict => 409,
            ErrorKind::Gone => 410,
            ErrorKind::TooLarge => 413,
            ErrorKind::Unprocessable => 422,
            ErrorKind::Busy => 429,
            ErrorKind::Internal => 500,
            ErrorKind::GuestFailed => 502,
            ErrorKind::Unavailable => 503,
            ErrorKind::GuestTimeout => 504,
        }
    }
}

/// A failure a request can be told about: its kind and a message (and the request field it
/// concerns).
#[derive(Debug)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    pub field: Option<String>,
    /// Seconds, for 429.
    pub retry_after: Option<u64>,
    /// The tenant's quota it is over.
    pub quota: Option<Box<super::wire::QuotaRefusal>>,
    /// A 401 that asks for a bearer token (`WWW-Authenticate`).
    pub challenge: bool,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ApiError {
        ApiError {
            kind,
            message: message.into(),
            field: None,
            retry_after: None,
            quota: None,
            challenge: false,
        }
    }

    /// Over a tenant's quota: 429 naming it, its limit and its use.
    pub fn quota(e: &tenants::Exceeded) -> ApiError {
        ApiError {
            retry_after: e.retry_after_secs,
            quota: Some(Box::new(super::wire::QuotaRefusal {
                name: e.quota.as_str().to_string(),
                limit: e.limit,
                used: e.used,
            })),
            ..ApiError::new(ErrorKind::Busy, e.to_string())
        }
    }

    /// This 401 asks for a bearer token.
    pub fn challenge(self) -> ApiError {
        ApiError {
            challenge: true,
            ..self
        }
    }

    pub fn field(kind: ErrorKind, field: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError {
            kind,
            message: message.into(),
            field: Some(field.into()),
            retry_after: None,
            quota: None,
            challenge: false,
        }
    }
}

/// The session book's refusals: 429 (with a retry hint) when every slot is taken, 404 when
/// there is no such session, 409 when it is busy being scored or is paused.
impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> ApiError {
        let status = match refusal {
            Refusal::Full { .. } => ErrorKind::Busy,
            Refusal::NoLive(_) | Refusal::NoneLiveOrPaused(_) => ErrorKind::NotFound,
            Refusal::BeingSubmitted(_) | Refusal::BeingScored(_) | Refusal::Paused(_) => ErrorKind::Conflict,
        };
        ApiError {
            retry_after: refusal.retryable().then_some(5),
            ..ApiError::new(status, refusal.to_string())
        }
    }
}

/// The tenants database failed (not the caller's doing): 500.
impl From<tenants::Error> for ApiError {
    fn from(e: tenants::Error) -> ApiError {
        ApiError::new(ErrorKind::Internal, format!("the tenants database: {e}"))
    }
}

impl ApiError {
    /// A session's refusal of a call, naming the session: 404 once it has ended, 409 while
    /// it is paused or when it took its steps.
    pub fn session(id: &str, refusal: SessionCallError) -> ApiError {
        let status = match refusal {
            SessionCallError::Ended | SessionCallError::NoTask => ErrorKind::NotFound,
            SessionCallError::Paused | SessionCallError::StepsTaken(_) => ErrorKind::Conflict,
        };
        let what = refusal.to_string();
        let what = what.strip_prefix("the session ").unwrap_or(&what);
        ApiError::new(status, format!("session {id:?} {what}"))
    }
}

/// A refused idempotency key, as the caller is told: 409 (retry) while a request with it is
/// admitted, 422 when it came with another body.
impl From<engine::idempotency::KeyRefusal> for ApiError {
    fn from(refusal: engine::idempotency::KeyRefusal) -> ApiError {
        use engine::idempotency::KeyRefusal;
        match refusal {
            KeyRefusal::InProgress => ApiError {
                retry_after: Some(1),
                ..ApiError::field(
                    ErrorKind::Conflict,
                    "Idempotency-Key",
                    "a request with this key is being admitted: retry",
                )
            },
            KeyRefusal::OtherBody => ApiError::field(ErrorKind::Unprocessable, "Idempotency-Key", refusal.to_string()),
        }
    }
}

pub type ApiResult<T> = std::result::Result<T, ApiError>;

impl ApiError {
    /// What a client is told: the message, the field, the quota.
    pub fn body(&self) -> crate::wire::ErrorBody {
        crate::wire::ErrorBody {
            error: self.message.clone(),
            field: self.field.clone(),
            quota: self.quota.as_deref().cloned(),
        }
    }
}
