//! A session as an MCP server (Model Context Protocol, the streamable HTTP transport):
//! `POST /v1/sessions/{id}/mcp` takes one JSON-RPC message and answers it with one JSON
//! body. Tools: `exec`, `read_file`, `write_file`, `submit`, each one step of the session
//! (the same budget, limits and journal as the session API's). A call runs to its end even
//! if the client hangs up (the step is recorded; a submit scores).
//!
//! The server is stateless in MCP's sense: it gives no `Mcp-Session-Id`, since the farm
//! session is in the path and outlives the agent's connection (whoever opened it submits or
//! deletes it). GET (a server-to-client stream) and DELETE answer 405. Auth is serve's
//! bearer token or the session's own MCP token (`serve::http::mcp_token`), which opens this
//! route of this session only: the agent gets that one, never the service's. The verdict
//! of a submit is not told to the agent.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::error::ApiError;
use super::http::{finish, App};
use super::tenancy::{not_found, Who};
use axum::Extension;
use engine::config::Action;
use service::requests::{ExecRequest, SubmitSessionRequest, WriteFileRequest};
use service::sessions::SessionId;
use service::ErrorKind;

/// Protocol revisions this server speaks; a client asking for another gets the newest.
const VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// Largest file `read_file` returns (bytes; less when the session's output cap is): longer
/// files are cut, and the tool says so.
const READ_LIMIT: u64 = 1 << 20;

pub(super) async fn not_here() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "POST")],
        axum::Json(json!({ "error": "this MCP server answers each POST with JSON; it has no stream to GET and no MCP session to DELETE (end the farm session with DELETE /v1/sessions/{id})" })),
    )
        .into_response()
}

/// JSON-RPC error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const NO_METHOD: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

#[derive(Deserialize)]
struct Message {
    jsonrpc: String,
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    params: Option<Value>,
}

/// A JSON-RPC 2.0 answer: its result, or its error.
#[derive(Serialize)]
struct RpcAnswer<T> {
    jsonrpc: &'static str,
    id: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<RpcError>,
}

#[derive(Serialize)]
struct RpcError {
    code: i64,
    message: String,
}

/// A tool's result (MCP `CallToolResult`): text for the model, the step as structured
/// content, and whether the tool failed.
#[derive(Serialize)]
struct ToolResult {
    content: Vec<TextContent>,
    #[serde(rename = "structuredContent")]
    structured_content: Value,
    #[serde(rename = "isError")]
    is_error: bool,
}

#[derive(Serialize)]
struct TextContent {
    #[serde(rename = "type")]
    kind: &'static str,
    text: String,
}

/// `initialize`'s result.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Initialized {
    protocol_version: &'static str,
    capabilities: Value,
    server_info: ServerInfo,
    instructions: String,
}

#[derive(Serialize)]
struct ServerInfo {
    name: &'static str,
    version: &'static str,
}

fn reply(id: Value, result: impl Serialize) -> Response {
    let answer = RpcAnswer {
        jsonrpc: "2.0",
        id,
        result: Some(result),
        error: None,
    };
    axum::Json(answer).into_response()
}

fn rpc_error(status: StatusCode, id: Value, code: i64, message: impl Into<String>) -> Response {
    let answer: RpcAnswer<()> = RpcAnswer {
        jsonrpc: "2.0",
        id,
        result: None,
        error: Some(RpcError {
            code,
            message: message.into(),
        }),
    };
    (status, axum::Json(answer)).into_response()
}

/// One JSON-RPC message: whether it has an id, the message, and the id to answer with; or
/// the error answer for a body that is not one.
// An error here is the request's answer, made once: boxing it would buy nothing.
#[allow(clippy::result_large_err)]
fn read_message(body: &[u8]) -> Result<(bool, Message, Value), Response> {
    let value: Value = match super::strict::parse(body) {
        Ok(v) => v,
        Err(e) => {
            return Err(rpc_error(
                StatusCode::BAD_REQUEST,
                Value::Null,
                PARSE_ERROR,
                format!("not one JSON value with each key once: {e}"),
            ))
        }
    };
    if value.is_array() {
        return Err(rpc_error(
            StatusCode::BAD_REQUEST,
            Value::Null,
            INVALID_REQUEST,
            "batches are not accepted: send one JSON-RPC message per POST",
        ));
    }
    // A request has an id (even a null one); a notification or a response has none.
    let has_id = value.get("id").is_some();
    let message: Message = match serde_json::from_value(value) {
        Ok(m) => m,
        Err(e) => {
            return Err(rpc_error(
                StatusCode::BAD_REQUEST,
                Value::Null,
                INVALID_REQUEST,
                format!("not a JSON-RPC message: {e}"),
            ))
        }
    };
    let request_id = message.id.clone().unwrap_or(Value::Null);
    if message.jsonrpc != "2.0" {
        return Err(rpc_error(
            StatusCode::BAD_REQUEST,
            request_id,
            INVALID_REQUEST,
            "jsonrpc must be \"2.0\"",
        ));
    }
    Ok((has_id, message, request_id))
}

pub(super) async fn message(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (has_id, message, request_id) = match read_message(&body) {
        Ok(v) => v,
        Err(answer) => return answer,
    };
    let (true, Some(method)) = (has_id, message.method) else {
        // A notification (`notifications/initialized`, `notifications/cancelled`) or a
        // response to a server request: nothing to answer.
        return StatusCode::ACCEPTED.into_response();
    };
    // The session must be the caller's and exist for every method, so that a wrong URL fails
    // at `initialize`; checked without waiting for a command running in it. Not found reads
    // the same for a session of another tenant and one that never was.
    let known = app.service.resolve_session(&who, &id).and_then(|id| {
        app.service.session_known(&id)?;
        Ok(id)
    });
    let id = match known.map_err(|e| {
        if e.kind == ErrorKind::NotFound {
            not_found(tenants::Kind::Session, &id)
        } else {
            e
        }
    }) {
        Ok(id) => id,
        Err(e) => {
            return rpc_error(
                StatusCode::from_u16(e.kind.http_status()).unwrap_or(StatusCode::NOT_FOUND),
                request_id,
                INVALID_REQUEST,
                e.message,
            )
        }
    };
    app.service.touch(&id);
    let params = message.params.unwrap_or(Value::Null);
    match method.as_str() {
        "initialize" => reply(request_id, initialize(&id, &params)),
        "ping" => reply(request_id, json!({})),
        "tools/list" => reply(request_id, json!({ "tools": tools() })),
        "tools/call" => match finish(async move { Ok(call(&app, &id, &params).await) }).await {
            Ok(Ok(result)) => reply(request_id, result),
            Ok(Err(why)) => rpc_error(StatusCode::OK, request_id, INVALID_PARAMS, why.to_string()),
            Err(e) => rpc_error(StatusCode::INTERNAL_SERVER_ERROR, request_id, -32603, e.message),
        },
        other => rpc_error(
            StatusCode::OK,
            request_id,
            NO_METHOD,
            format!("no method {other:?} (this server has tools only: tools/list, tools/call)"),
        ),
    }
}

fn initialize(id: &str, params: &Value) -> Initialized {
    let asked = params.get("protocolVersion").and_then(Value::as_str).unwrap_or("");
    let version = VERSIONS
        .iter()
        .find(|v| **v == asked)
        .copied()
        .unwrap_or(VERSIONS[VERSIONS.len() - 1]);
    Initialized {
        protocol_version: version,
        capabilities: json!({ "tools": { "listChanged": false } }),
        server_info: ServerInfo {
            name: "farm",
            version: env!("CARGO_PKG_VERSION"),
        },
        instructions: format!("Tools act inside farm session {id}, an isolated Linux microVM. Commands run in the task's working folder. Call submit when the task is done: the session ends and is scored where you cannot reach."),
    }
}

fn tools() -> Value {
    json!([
        {
            "name": "exec",
            "description": "Run a shell command (sh -c) in the task's working folder. Returns its exit code, stdout and stderr (each cut at the session's output cap).",
            "inputSchema": { "type": "object", "properties": {
                "command": { "type": "string", "description": "The command line." },
                "timeout_secs": { "type": "integer", "minimum": 1, "description": "At most the session's step timeout." },
            }, "required": ["command"], "additionalProperties": false },
        },
        {
            "name": "read_file",
            "description": "Read a text file (relative paths are in the task's working folder): at most 1 MiB or the session's output cap, whichever is less; a longer file is cut, and the result says so.",
            "inputSchema": { "type": "object", "properties": {
                "path": { "type": "string" },
            }, "required": ["path"], "additionalProperties": false },
        },
        {
            "name": "write_file",
            "description": "Write a file (relative paths are in the task's working folder), creating its folders.",
            "inputSchema": { "type": "object", "properties": {
                "path": { "type": "string" },
                "content": { "type": "string" },
                "mode": { "type": "integer", "minimum": 0, "maximum": 4095, "description": "File mode, default 0644 (420)." },
            }, "required": ["path", "content"], "additionalProperties": false },
        },
        {
            "name": "submit",
            "description": "End the task. The session is scored where you cannot reach; nothing can be done in it afterwards.",
            "inputSchema": { "type": "object", "properties": {
                "answer": { "type": "string", "description": "The final answer, when the task asks for one." },
            }, "additionalProperties": false },
        },
    ])
}

/// `tools/call`'s params (fields a later revision adds are let through).
#[derive(Deserialize)]
struct Call {
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default, rename = "_meta")]
    _meta: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    path: String,
}

/// A call that cannot run: a JSON-RPC error (-32602) rather than a tool's error.
#[derive(Debug, thiserror::Error)]
enum BadCall {
    #[error("bad tools/call params: {0}")]
    Params(serde_json::Error),
    #[error("{tool}: bad arguments at {path}: {why}")]
    Arguments {
        tool: String,
        path: String,
        why: serde_json::Error,
    },
    #[error("{tool}: {}{}", .error.field.as_deref().map(|f| format!("{f}: ")).unwrap_or_default(), .error.message)]
    Refused { tool: String, error: ApiError },
    #[error("no tool {0:?} (the tools are exec, read_file, write_file, submit)")]
    NoTool(String),
}

fn args<T: serde::de::DeserializeOwned>(tool: &str, arguments: Option<Value>) -> Result<T, BadCall> {
    let value = arguments.unwrap_or_else(|| json!({}));
    serde_path_to_error::deserialize(value).map_err(|e| BadCall::Arguments {
        tool: tool.to_string(),
        path: e.path().to_string(),
        why: e.into_inner(),
    })
}

/// A tool's result: text for the model, and the step as structured content.
fn result(text: String, structured: Value, is_error: bool) -> Value {
    let result = ToolResult {
        content: vec![TextContent { kind: "text", text }],
        structured_content: structured,
        is_error,
    };
    serde_json::to_value(result).expect("results serialize")
}

/// A tool that ran but failed (a session that ended, its step limit): told to the model as
/// a tool error, as MCP asks, rather than as a protocol error.
fn tool_failed(e: ApiError) -> Value {
    result(
        e.message.clone(),
        json!({ "error": e.message, "status": e.kind.http_status() }),
        true,
    )
}

/// Quotes `s` for `sh`.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Runs one tool: Ok is the tool's result (also when the tool failed), Err a bad call.
async fn call(app: &App, id: &SessionId, params: &Value) -> Result<Value, BadCall> {
    let call: Call = serde_json::from_value(params.clone()).map_err(BadCall::Params)?;
    let tool = call.name.clone();
    let service = &app.service;
    Ok(match call.name.as_str() {
        "exec" => {
            let (action, timeout) = args::<ExecRequest>("exec", call.arguments)?.into_action();
            match service.act(id, action, timeout).await {
                Ok(out) => stepped(serde_json::to_value(out).expect("answers serialize")),
                Err(e) => failed(&tool, e)?,
            }
        }
        "read_file" => read_file(app, id, args("read_file", call.arguments)?).await?,
        "write_file" => {
            let action = args::<WriteFileRequest>("write_file", call.arguments)?.into_action();
            match service.act(id, action, None).await {
                Ok(out) => stepped(serde_json::to_value(out).expect("answers serialize")),
                Err(e) => failed(&tool, e)?,
            }
        }
        "submit" => {
            let a: SubmitSessionRequest = args("submit", call.arguments)?;
            match service.submit_session(id, a.answer).await {
                // The verdict goes to whoever runs the session (its row, GET
                // /v1/rollouts/{id}), not to the agent being scored: not even the id.
                Ok(_) => result(
                    "submitted: the session has ended and was scored where you cannot reach".into(),
                    json!({ "submitted": true }),
                    false,
                ),
                Err(e) => failed(&tool, e)?,
            }
        }
        other => return Err(BadCall::NoTool(other.to_string())),
    })
}

/// A refusal of `tool`'s call. A value the service refuses (a field error) is the caller's
/// bad argument; any other failure (an ended session, its step limit) is the tool's, told
/// to the model.
fn failed(tool: &str, e: ApiError) -> Result<Value, BadCall> {
    if e.kind == ErrorKind::Invalid && e.field.is_some() {
        Err(BadCall::Refused {
            tool: tool.to_string(),
            error: e,
        })
    } else {
        Ok(tool_failed(e))
    }
}

/// A step's result: its observation for the model (with why the session ended, if it did),
/// an error when the command failed or the session ended.
fn stepped(out: Value) -> Value {
    let observation = out["observation"].as_str().unwrap_or_default().to_string();
    let ended = out["ended"].as_bool().unwrap_or(false);
    let text = if ended {
        format!(
            "{observation}\n(the session has ended: {})",
            out["error"].as_str().unwrap_or("over its limits")
        )
    } else {
        observation
    };
    let failed = out["step"]["exit_code"].as_i64().is_some_and(|c| c != 0) || ended;
    result(text, out, failed)
}

/// `read_file`: the file's text through `head`, cut at the limit (the session's output cap,
/// at most [`READ_LIMIT`]) and saying so.
async fn read_file(app: &App, id: &SessionId, a: ReadArgs) -> Result<Value, BadCall> {
    let service = &app.service;
    let cap = match service.session_output_cap(id).await {
        Ok(cap) => cap,
        Err(e) => return failed("read_file", e),
    };
    // One byte past the limit tells a longer file from one of exactly the limit.
    let limit = READ_LIMIT.min(cap.saturating_sub(1)).max(1);
    let command = format!("head -c {} -- {}", limit + 1, quoted(&a.path));
    let acted = service
        .act(id, Action::Exec { command }, None)
        .await
        .map(|out| serde_json::to_value(out).expect("answers serialize"));
    Ok(match acted {
        Ok(out) if out["step"]["exit_code"] == 0 && !out["ended"].as_bool().unwrap_or(false) => {
            let stdout = out["step"]["stdout"].as_str().unwrap_or_default();
            let cut = stdout.len() as u64 > limit;
            let mut text: String = stdout.to_string();
            if cut {
                let mut end = limit as usize;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.truncate(end);
                text.push_str(&format!("\n[farm: the file goes on; cut at {limit} bytes]"));
            }
            result(text, json!({ "path": a.path, "cut": cut, "limit": limit }), false)
        }
        Ok(out) => {
            let why = out["step"]["stderr"].as_str().unwrap_or_default().trim().to_string();
            result(format!("reading {:?} failed: {why}", a.path), out, true)
        }
        Err(e) => failed("read_file", e)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(quoted("a'b"), r"'a'\''b'");
    }

    #[test]
    fn arguments_name_the_bad_field() {
        let e = args::<WriteFileRequest>("write_file", Some(json!({ "path": "a", "content": 3 })))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("content"), "{e}");
        let e = args::<ExecRequest>("exec", Some(json!({ "command": "ls", "cwd": "/" })))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("cwd"), "{e}");
    }
}
