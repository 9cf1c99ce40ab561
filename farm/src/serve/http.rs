//! What the HTTP routes share: the state they hold, the bearer-token check, strict JSON
//! bodies and replies.

use std::sync::Arc;

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use super::error::ApiError;
use service::state::Service;
use service::ErrorKind;

#[derive(Clone)]
pub(super) struct App {
    pub service: Arc<Service>,
}

pub(super) type Reply = Result<Response, super::error::HttpError>;

pub(super) fn ok(value: impl serde::Serialize) -> Reply {
    Ok(axum::Json(value).into_response())
}

/// The path's sandbox (`{id}`), held to the caller: another tenant's and one that never was
/// are the same 404. A handler gets a sandbox to act on only through this (or the calls that
/// make one), so no route on a sandbox can skip its owner check.
pub(super) struct Mine(pub service::sandbox::SandboxId);

/// The path's session (`{id}`), held to the caller as [`Mine`] holds a sandbox.
pub(super) struct MySession(pub service::sessions::SessionId);

/// The path's environment (`{id}`), held to the caller as [`Mine`] holds a sandbox.
pub(super) struct MyEnvironment(pub service::sandbox::EnvironmentId);

/// The caller and the path's `{id}`.
async fn caller_and_id(
    parts: &mut axum::http::request::Parts,
    app: &App,
) -> Result<(super::tenancy::Who, String), ApiError> {
    use axum::extract::{FromRequestParts, Path};
    let Path(mut params) = Path::<std::collections::HashMap<String, String>>::from_request_parts(parts, app)
        .await
        .map_err(|e| ApiError::new(ErrorKind::Invalid, e.body_text()))?;
    let id = params
        .remove("id")
        .ok_or_else(|| ApiError::new(ErrorKind::Internal, "a route without {id}"))?;
    let who = parts
        .extensions
        .get::<super::tenancy::Who>()
        .ok_or_else(|| ApiError::new(ErrorKind::Internal, "a route outside the tenancy layer"))?;
    Ok((who.clone(), id))
}

impl axum::extract::FromRequestParts<App> for Mine {
    type Rejection = super::error::HttpError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, app: &App) -> Result<Mine, Self::Rejection> {
        let (who, id) = caller_and_id(parts, app).await?;
        let id = app.service.sandbox_api()?.sandboxes.resolve(&who, &id)?;
        let route = parts
            .extensions
            .get::<axum::extract::MatchedPath>()
            .map(|m| m.as_str().to_string());
        if route.as_deref().is_some_and(uses_the_guest) {
            app.service.wake_sandbox(&who, &id).await?;
        }
        Ok(Mine(id))
    }
}

/// Whether a sandbox route uses its guest, so that a call on a sandbox its timeout paused
/// resumes it first (reading it, deleting it, and its pause, resume, timers and metrics do
/// not).
fn uses_the_guest(route: &str) -> bool {
    const CONTROL: [&str; 9] = [
        "/{id}",
        "/pause",
        "/resume",
        "/timeout",
        "/metrics",
        "/checkpoint",
        "/ports",
        "/{port}",
        "/network",
    ];
    !CONTROL.iter().any(|end| route.ends_with(end))
}

impl axum::extract::FromRequestParts<App> for MySession {
    type Rejection = super::error::HttpError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        app: &App,
    ) -> Result<MySession, Self::Rejection> {
        let (who, id) = caller_and_id(parts, app).await?;
        Ok(MySession(app.service.resolve_session(&who, &id)?))
    }
}

impl axum::extract::FromRequestParts<App> for MyEnvironment {
    type Rejection = super::error::HttpError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        app: &App,
    ) -> Result<MyEnvironment, Self::Rejection> {
        let (who, id) = caller_and_id(parts, app).await?;
        Ok(MyEnvironment(app.service.resolve_environment(&who, &id)?))
    }
}

/// A query string of `T`, or a 400 saying what is wrong with it (and what `T` wants).
pub(super) struct Q<T>(pub T);

/// What a route's query string is: the field a refusal names, and a hint of the right form.
pub(super) trait QueryOf: DeserializeOwned + Send {
    const FIELD: Option<&'static str> = None;
    const HINT: &'static str = "";
}

impl QueryOf for std::collections::BTreeMap<String, String> {}

impl<T: QueryOf> axum::extract::FromRequestParts<App> for Q<T> {
    type Rejection = super::error::HttpError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, app: &App) -> Result<Q<T>, Self::Rejection> {
        use axum::extract::Query;
        match Query::<T>::from_request_parts(parts, app).await {
            Ok(Query(q)) => Ok(Q(q)),
            Err(e) => {
                let why = format!("bad query: {}{}", e.body_text(), T::HINT);
                Err(match T::FIELD {
                    Some(field) => ApiError::field(ErrorKind::Invalid, field, why),
                    None => ApiError::new(ErrorKind::Invalid, why),
                }
                .into())
            }
        }
    }
}

/// An answer with a status, marked with the id it made.
pub(super) fn made(status: axum::http::StatusCode, id: &str, value: impl serde::Serialize) -> Reply {
    let mut response = (status, axum::Json(value)).into_response();
    response.extensions_mut().insert(super::tenancy::Made(id.to_string()));
    Ok(response)
}

/// A JSON body, strictly ([`super::strict`]), or a 400 naming the field that is wrong.
pub(super) use super::strict::body as parse;

/// The `Idempotency-Key` header, checked (None when absent).
pub(super) fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get("idempotency-key") {
        Some(v) => Ok(Some(
            v.to_str()
                .ok()
                .filter(|k| !k.is_empty() && k.len() <= 256)
                .ok_or_else(|| {
                    ApiError::field(
                        ErrorKind::Invalid,
                        "Idempotency-Key",
                        "must be 1 to 256 visible ASCII characters",
                    )
                })?
                .to_string(),
        )),
        None => Ok(None),
    }
}

/// The hex SHA-256 of a request body.
pub(super) fn body_digest(body: &[u8]) -> String {
    Sha256::digest(body).iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs a session call to its end even if the client hangs up meanwhile: a command the guest
/// runs is then still a recorded step, and a submit still scores and writes its row.
pub(super) async fn finish<T: Send + 'static>(
    call: impl std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::spawn(call).await.unwrap_or_else(|e| {
        Err(ApiError::new(
            ErrorKind::Internal,
            format!("the request's task failed: {e}"),
        ))
    })
}

/// An answer of server-sent events: each of `rx`'s items as `event` makes it (with whether it
/// is the last), for as long as `held` lasts. Nothing is read ahead of the client: the next
/// item is taken when the last one was sent, so a client that does not read holds one event
/// of the service's memory. A revoked key ends the stream with an `error` event.
pub(super) fn sse<T: Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<T>,
    held: super::tenancy::Held,
    event: fn(T) -> (axum::response::sse::Event, bool),
) -> Response {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let events = futures::stream::unfold((rx, held, false), move |(mut rx, mut held, done)| async move {
        if done {
            return None;
        }
        let (next, last) = tokio::select! {
            item = rx.recv() => event(item?),
            _ = held.revoked() => {
                let error = service::wire::StreamError {
                    error: "the key that opened this stream was revoked or has expired".into(),
                };
                (Event::default().event("error").data(serde_json::to_string(&error).expect("events serialize")), true)
            }
        };
        Some((Ok::<_, std::convert::Infallible>(next), (rx, held, last)))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs(15)))
        .into_response()
}
