//! The served tasks as an OpenEnv environment (the `openenv` client on PyPI, which TRL's
//! trainers use): a WebSocket at `/v1/openenv/ws` where each connection holds one farm
//! session, plus `/v1/openenv/health`, `/schema` and `/metadata`.
//!
//! Messages, one reply each: `{"type": "reset", "data": {...}}` ends the connection's
//! session, if any, and opens a new one in the task's pristine state: its VM reset in place
//! when it was of the same snapshot (`[rollouts] reuse`), else a fresh fork; or a branch of a
//! live session (`branch_of`). The first observation carries the instruction. `{"type": "step", "data": <action>}` runs an
//! `exec`, a `write_file` or a `submit` (the reward: farm's protected scoring, at submit
//! only). `{"type": "state"}` tells the session and its step count; `{"type": "close"}` and
//! a disconnect end the session (no row, as a DELETE). Failures answer `{"type": "error",
//! "data": {"message", "code"}}` and keep the connection.
//!
//! The socket is read while a step runs, so the client's pings are answered on long steps;
//! every frame (pings too) renews the session's lease, and a connection silent for a whole
//! lease is closed. The auth middleware's bearer token and `Origin` rule apply to the
//! upgrade.

use crate::serve::error::Respond;
use service::events::Cause;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::Extension;
use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::error::ApiError;
use super::http::App;
use super::tenancy::Who;
use service::requests::{ExecRequest, LimitsRequest, SubmitSessionRequest, WriteFileRequest};
use service::sessions::SessionId;

mod describe;
mod open;
pub(super) use describe::{health, metadata, schema_route};
use open::{open_branch, open_session, session_request};
use service::ErrorKind;

/// Largest message a client may send (a `write_file` carries the file).
const MAX_MESSAGE: usize = 16 << 20;

/// Tasks handed out in turn to resets that name none.
static NEXT_TASK: AtomicUsize = AtomicUsize::new(0);

/// `GET /v1/openenv/ws`: the upgrade to an episode's socket.
pub(super) async fn socket(
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
    State(app): State<App>,
    Extension(who): Extension<Who>,
) -> axum::response::Response {
    // One of the tenant's connections while it is open.
    let held = match app.service.tenancy.hold(&who) {
        Ok(held) => held,
        Err(e) => return e.into_response(),
    };
    match ws {
        Ok(ws) => ws
            .max_message_size(MAX_MESSAGE)
            .on_upgrade(move |socket| connection(socket, app, who, &NEXT_TASK, held)),
        Err(e) => crate::serve::error::refuse(
            e.status(),
            format!(
                "{} (OpenEnv's socket: connect with a WebSocket client, e.g. openenv's GenericEnvClient)",
                e.body_text()
            ),
        ),
    }
}

/// What one connection holds.
#[derive(Default)]
struct Conn {
    session: Option<SessionId>,
    rollout: Option<String>,
    task_id: Option<String>,
    episode_id: Option<String>,
    steps: usize,
    done: bool,
}

/// A reply that failed: OpenEnv's error codes.
struct Failure {
    code: &'static str,
    message: String,
}

impl Failure {
    fn new(code: &'static str, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Failure {
        let code = match e.kind {
            _ if e.field.is_some() => "VALIDATION_ERROR",
            ErrorKind::Invalid | ErrorKind::Unprocessable => "VALIDATION_ERROR",
            // Full (sessions, memory): worth a retry later.
            ErrorKind::Busy => "CAPACITY_REACHED",
            ErrorKind::Unavailable if e.retry_after.is_some() => "CAPACITY_REACHED",
            ErrorKind::NotFound | ErrorKind::Conflict | ErrorKind::Gone => "SESSION_ERROR",
            _ => "EXECUTION_ERROR",
        };
        let message = match e.field {
            Some(f) => format!("{f}: {}", e.message),
            None => e.message,
        };
        Failure { code, message }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    data: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Reset {
    #[serde(default)]
    suite: Option<String>,
    #[serde(default)]
    task_id: Option<String>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    episode_id: Option<String>,
    #[serde(default)]
    branch_of: Option<String>,
    #[serde(default)]
    limits: LimitsRequest,
    #[serde(default)]
    policy_version: Option<u64>,
    #[serde(default)]
    metadata: Option<Value>,
}

/// `step`'s action: the session API's step bodies, told apart by `kind`.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum StepAction {
    Exec(ExecRequest),
    WriteFile(WriteFileRequest),
    Submit(SubmitSessionRequest),
}

fn parse<T: serde::de::DeserializeOwned>(what: &str, value: Value) -> Result<T, Failure> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." {
            String::new()
        } else {
            format!(" at {path}")
        };
        Failure::new("VALIDATION_ERROR", format!("bad {what}{at}: {}", e.into_inner()))
    })
}

/// The session a connection holds, kept outside the request's task so that it is ended on
/// every way out, a panic included.
type Holding = Arc<std::sync::Mutex<Option<SessionId>>>;

async fn connection(
    socket: WebSocket,
    app: App,
    who: Who,
    next_task: &'static AtomicUsize,
    mut held: super::tenancy::Held,
) {
    let (mut sender, mut receiver) = socket.split();
    let holding: Holding = Default::default();
    let mut conn = Some(Conn::default());
    let mut work: Option<tokio::task::JoinHandle<(Conn, Value)>> = None;
    let lease = std::time::Duration::from_secs(app.service.settings.session_lease_secs);
    loop {
        tokio::select! {
            // A revoked key closes the socket even while no message comes.
            _ = held.revoked() => {
                let reply = error_reply(&Failure::new("EXECUTION_ERROR", "the key that opened this socket was revoked or has expired"));
                let _ = sender.send(Message::text(reply.to_string())).await;
                break;
            }
            incoming = tokio::time::timeout(lease, receiver.next()) => {
                let text = match incoming {
                    Ok(Some(Ok(Message::Text(t)))) => t.to_string(),
                    Ok(Some(Ok(Message::Binary(b)))) => String::from_utf8_lossy(&b).into_owned(),
                    Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => {
                        touch(&app, &holding);
                        continue;
                    }
                    // Closed, broken, or silent for a whole lease (a half-open connection).
                    Ok(Some(Ok(Message::Close(_))) | Some(Err(_)) | None) | Err(_) => break,
                };
                touch(&app, &holding);
                let request = match read_request(&app, &who, &text) {
                    Ok(r) => r,
                    Err((reply, close)) => {
                        if sender.send(Message::text(reply.to_string())).await.is_err() || close { break; }
                        continue;
                    }
                };
                // A close ends the connection even while a request runs (it finishes first).
                if request.kind == "close" {
                    break;
                }
                let Some(c) = conn.take() else {
                    let busy = error_reply(&Failure::new("EXECUTION_ERROR", "one request at a time: the last one is still running"));
                    if sender.send(Message::text(busy.to_string())).await.is_err() { break; }
                    continue;
                };
                let (app, who, holding) = (app.clone(), who.clone(), holding.clone());
                work = Some(tokio::spawn(async move { handle(&app, &who, next_task, &holding, c, request).await }));
            }
            finished = async { work.as_mut().expect("guarded").await }, if work.is_some() => {
                work = None;
                match finished {
                    Ok((c, reply)) => {
                        conn = Some(c);
                        if sender.send(Message::text(reply.to_string())).await.is_err() { break; }
                    }
                    Err(e) => {
                        tracing::error!("an OpenEnv request's task failed: {e}");
                        break;
                    }
                }
            }
        }
    }
    // A request still running finishes first (it may be opening or scoring the session).
    if let Some(w) = work {
        let _ = w.await;
    }
    let held = holding.lock().unwrap().take();
    if let Some(id) = held {
        let _ = app
            .service
            .end_session(&id, "the OpenEnv client disconnected", Cause::Deleted)
            .await;
    }
    let _ = sender.close().await;
}

/// A message as a request of the connection's tenant: its key must still be live (a revoked
/// one closes the socket), it counts against its rate, and it is one strict JSON request.
/// Err: the reply, and whether the socket closes after it.
fn read_request(app: &App, who: &Who, text: &str) -> Result<Request, (Value, bool)> {
    if let Err(e) = app.service.tenancy.admit_message(who) {
        let reply = error_reply(&Failure::new("EXECUTION_ERROR", e.message.clone()));
        return Err((reply, e.kind == ErrorKind::Unauthenticated));
    }
    super::strict::parse::<Request>(text.as_bytes()).map_err(|e| {
        let code = match super::strict::parse::<Value>(text.as_bytes()) {
            Ok(_) => "UNKNOWN_TYPE",
            Err(_) => "INVALID_JSON",
        };
        let what = "not a request ({\"type\": \"reset\"|\"step\"|\"state\"|\"close\", \"data\": ...})";
        (error_reply(&Failure::new(code, format!("{what}: {e}"))), false)
    })
}

/// A message the service sends on the socket: `{"type": ..., "data": ...}`.
#[derive(Debug, Serialize)]
#[serde(tag = "type", content = "data", rename_all = "snake_case")]
enum Outgoing {
    Observation(Box<Observed>),
    State(EpisodeState),
    Error(ErrorData),
}

/// An observation with its reward, and whether the episode is done.
#[derive(Debug, Serialize)]
struct Observed {
    observation: FarmObservation,
    reward: Option<f64>,
    done: bool,
}

/// What a model sees: the instruction after a reset, a step's output after a step, the
/// verdict at the end (fields that do not apply are left out).
#[derive(Debug, Default, Serialize)]
struct FarmObservation {
    text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    instruction: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    task_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<String>,
    /// Null after a reset without one (absent after a step).
    #[serde(skip_serializing_if = "Option::is_none")]
    rollout_id: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stdout: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stderr: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trust: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<Value>,
}

/// `state`: where the connection's episode is.
#[derive(Debug, Serialize)]
struct EpisodeState {
    episode_id: Option<String>,
    session_id: Option<String>,
    rollout_id: Option<String>,
    task_id: Option<String>,
    step_count: usize,
    done: bool,
}

#[derive(Debug, Serialize)]
struct ErrorData {
    message: String,
    code: &'static str,
}

/// Renews the lease of the connection's session.
fn touch(app: &App, holding: &Holding) {
    if let Some(id) = holding.lock().unwrap().as_ref() {
        app.service.touch(id);
    }
}

fn error_reply(f: &Failure) -> Value {
    to_value(Outgoing::Error(ErrorData {
        message: f.message.clone(),
        code: f.code,
    }))
}

async fn handle(
    app: &App,
    who: &Who,
    next_task: &AtomicUsize,
    holding: &Holding,
    mut conn: Conn,
    request: Request,
) -> (Conn, Value) {
    let reply = match request.kind.as_str() {
        "reset" => reset(app, who, next_task, holding, &mut conn, request.data).await,
        "step" => match request.data {
            Some(data) => step(app, holding, &mut conn, data).await,
            None => Err(Failure::new("VALIDATION_ERROR", "step needs data: the action")),
        },
        "state" => Ok(to_value(Outgoing::State(state(&conn)))),
        other => Err(Failure::new(
            "UNKNOWN_TYPE",
            format!("Unknown message type: {other} (reset, step, state, close)"),
        )),
    };
    if matches!(request.kind.as_str(), "reset" | "step") {
        // Each reset and step changes state: the audit has it, as a REST call's.
        let route = format!("WS /v1/openenv/ws {}", request.kind);
        let status = if reply.is_ok() { 200 } else { 400 };
        app.service
            .tenancy
            .audit(who, &route, conn.session.as_ref().map(|s| s.to_string()), status);
    }
    (conn, reply.unwrap_or_else(|f| error_reply(&f)))
}

fn state(conn: &Conn) -> EpisodeState {
    EpisodeState {
        episode_id: conn.episode_id.clone(),
        session_id: conn.session.as_ref().map(|s| s.to_string()),
        rollout_id: conn.rollout.clone(),
        task_id: conn.task_id.clone(),
        step_count: conn.steps,
        done: conn.done,
    }
}

fn observation(observation: FarmObservation, reward: Option<f64>, done: bool) -> Value {
    to_value(Outgoing::Observation(Box::new(Observed {
        observation,
        reward,
        done,
    })))
}

async fn reset(
    app: &App,
    who: &Who,
    next_task: &AtomicUsize,
    holding: &Holding,
    conn: &mut Conn,
    data: Option<Value>,
) -> Result<Value, Failure> {
    let reset: Reset = match data {
        Some(Value::Null) | None => Reset::default(),
        Some(v) => parse("reset arguments", v)?,
    };
    let service = &app.service;
    let episode_id = reset.episode_id.clone();
    // A branch is opened before the old session ends (it may continue the connection's own
    // session). A new episode is checked (suite, task, limits), then the old session ends,
    // so that its VM is reset in place for the new one when both are of the same snapshot
    // (`[rollouts] reuse`) instead of a new QEMU process; a session that still cannot be
    // opened (the service is full) leaves the connection with none: its error says why,
    // and the next reset opens one.
    let opened = match &reset.branch_of {
        Some(parent) => open_branch(app, who, parent, &reset).await?,
        None => {
            let request = session_request(app, next_task, reset)?;
            let old = holding.lock().unwrap().take();
            if let Some(old) = old.filter(|_| !conn.done) {
                let _ = service
                    .end_session(&old, "reset by the OpenEnv client", Cause::Deleted)
                    .await;
            }
            *conn = Conn::default();
            open_session(app, who, request).await?
        }
    };
    let (id, opened) = opened;
    let old = holding.lock().unwrap().replace(id.clone());
    if let Some(old) = old.filter(|_| !conn.done) {
        let _ = service
            .end_session(&old, "reset by the OpenEnv client", Cause::Deleted)
            .await;
    }
    *conn = Conn {
        session: Some(id.clone()),
        rollout: opened["rollout_id"].as_str().map(String::from),
        episode_id: Some(episode_id.unwrap_or_else(|| id.to_string())),
        ..Conn::default()
    };
    let described = to_value(service.get_session(who, &id).await?);
    let (task_id, instruction) = service.session_task(&id).await?;
    conn.task_id = Some(task_id.clone());
    conn.steps = described["steps"].as_u64().unwrap_or(0) as usize;
    let seen = FarmObservation {
        text: instruction.clone(),
        instruction: Some(instruction),
        task_id: Some(task_id),
        session_id: Some(id.to_string()),
        rollout_id: Some(json!(conn.rollout)),
        ..FarmObservation::default()
    };
    Ok(observation(seen, None, false))
}

async fn step(app: &App, holding: &Holding, conn: &mut Conn, data: Value) -> Result<Value, Failure> {
    let Some(id) = conn.session.clone() else {
        return Err(Failure::new("SESSION_ERROR", "no session yet: reset first"));
    };
    if conn.done {
        return Err(Failure::new("SESSION_ERROR", "the episode is done: reset for another"));
    }
    let action: StepAction = parse("action", data)?;
    let service = &app.service;
    let (action, timeout) = match action {
        StepAction::Submit(SubmitSessionRequest { answer }) => {
            let out = to_value(
                service
                    .submit_session(&id, answer)
                    .await
                    .map_err(|e| gone(holding, conn, e))?,
            );
            conn.done = true;
            holding.lock().unwrap().take();
            conn.steps += 1;
            let status = out["status"].as_str().unwrap_or_default().to_string();
            let text = match out["error"].as_str() {
                Some(e) if !e.is_empty() => format!("{status}: {e}"),
                _ => status.clone(),
            };
            let verdict = FarmObservation {
                text,
                status: Some(json!(status)),
                trust: Some(out["trust"].clone()),
                error: Some(out["error"].clone()),
                rollout_id: Some(out["rollout_id"].clone()),
                ..FarmObservation::default()
            };
            return Ok(observation(verdict, out["reward"].as_f64(), true));
        }
        StepAction::Exec(exec) => exec.into_action(),
        StepAction::WriteFile(write) => (write.into_action(), None),
    };
    let out = to_value(
        service
            .act(&id, action, timeout)
            .await
            .map_err(|e| gone(holding, conn, e))?,
    );
    conn.steps += 1;
    let step = &out["step"];
    let mut seen = FarmObservation {
        text: out["observation"].as_str().unwrap_or_default().to_string(),
        exit_code: Some(step["exit_code"].clone()),
        stdout: Some(step["stdout"].clone()),
        stderr: Some(step["stderr"].clone()),
        ..FarmObservation::default()
    };
    if out["ended"].as_bool().unwrap_or(false) {
        // Over its time budget, or the action took the VM down: the episode ends unscored.
        conn.done = true;
        holding.lock().unwrap().take();
        seen.status = Some(out["status"].clone());
        seen.error = Some(out["error"].clone());
        return Ok(observation(seen, Some(0.0), true));
    }
    Ok(observation(seen, None, false))
}

/// A failed step; when the session is gone (expired, deleted), the episode is done.
fn gone(holding: &Holding, conn: &mut Conn, e: ApiError) -> Failure {
    if e.kind == ErrorKind::NotFound {
        conn.done = true;
        holding.lock().unwrap().take();
    }
    e.into()
}

/// An answer of the service's, as the OpenEnv messages carry it.
fn to_value(answer: impl serde::Serialize) -> Value {
    serde_json::to_value(answer).expect("answers serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_parse_strictly_and_name_the_field() {
        let a: StepAction = parse("action", json!({ "kind": "exec", "command": "ls" }))
            .ok()
            .unwrap();
        assert!(matches!(a, StepAction::Exec(ExecRequest { timeout_secs: None, .. })));
        let e = parse::<StepAction>("action", json!({ "kind": "exec", "command": "ls", "cwd": "/" }))
            .err()
            .unwrap();
        assert_eq!(e.code, "VALIDATION_ERROR");
        assert!(e.message.contains("cwd"), "{}", e.message);
        let e = parse::<StepAction>("action", json!({ "kind": "rm" })).err().unwrap();
        assert!(e.message.contains("rm"), "{}", e.message);
        let e = parse::<Reset>("reset arguments", json!({ "seeds": 3 })).err().unwrap();
        assert!(e.message.contains("seeds"), "{}", e.message);
    }

    #[test]
    fn service_failures_map_to_openenv_codes() {
        let f: Failure = ApiError::field(ErrorKind::Invalid, "task_id", "no task").into();
        assert_eq!((f.code, f.message.as_str()), ("VALIDATION_ERROR", "task_id: no task"));
        assert_eq!(
            Failure::from(ApiError::new(ErrorKind::Busy, "at serve.max_sessions")).code,
            "CAPACITY_REACHED"
        );
        let low_memory = ApiError {
            retry_after: Some(5),
            ..ApiError::new(ErrorKind::Unavailable, "memory")
        };
        assert_eq!(Failure::from(low_memory).code, "CAPACITY_REACHED");
        // A VM that did not boot is no reason to come back later.
        assert_eq!(
            Failure::from(ApiError::new(ErrorKind::Unavailable, "opening the session failed")).code,
            "EXECUTION_ERROR"
        );
        assert_eq!(
            Failure::from(ApiError::field(ErrorKind::NotFound, "task_id", "no task")).code,
            "VALIDATION_ERROR"
        );
        assert_eq!(
            Failure::from(ApiError::new(ErrorKind::NotFound, "gone")).code,
            "SESSION_ERROR"
        );
    }
}
