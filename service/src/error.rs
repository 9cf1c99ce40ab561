//! The failure a call of the service is told about: a status (HTTP's numbers, which every
//! transport maps), a message and the field it concerns; the HTTP transport answers it as
//! `{"error": ..., "field": ...}`.

use engine::book::Refusal;
use engine::session::SessionCallError;

/// A failure a request can be told about: an HTTP status and a message (and the request
/// field it concerns).
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
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
    pub fn new(status: u16, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
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
            ..ApiError::new(429, e.to_string())
        }
    }

    /// This 401 asks for a bearer token.
    pub fn challenge(self) -> ApiError {
        ApiError {
            challenge: true,
            ..self
        }
    }

    pub fn field(status: u16, field: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
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
            Refusal::Full { .. } => 429,
            Refusal::NoLive(_) | Refusal::NoneLiveOrPaused(_) => 404,
            Refusal::BeingSubmitted(_) | Refusal::BeingScored(_) | Refusal::Paused(_) => 409,
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
        ApiError::new(500, format!("the tenants database: {e}"))
    }
}

impl ApiError {
    /// A session's refusal of a call, naming the session: 404 once it has ended, 409 while
    /// it is paused or when it took its steps.
    pub fn session(id: &str, refusal: SessionCallError) -> ApiError {
        let status = match refusal {
            SessionCallError::Ended | SessionCallError::NoTask => 404,
            SessionCallError::Paused | SessionCallError::StepsTaken(_) => 409,
        };
        let what = refusal.to_string();
        let what = what.strip_prefix("the session ").unwrap_or(&what);
        ApiError::new(status, format!("session {id:?} {what}"))
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
