//! Answers about sessions: opening one, its steps, branches, its end, what it is now.

use serde::Serialize;
use utoipa::ToSchema;

/// `POST /v1/sessions` (201).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SessionOpened {
    pub session_id: String,
    pub rollout_id: String,
    pub group_id: String,
    pub task_id: String,
    pub suite: String,
    pub instruction: String,
    /// Where the agent reaches the session over MCP.
    pub mcp: Option<McpAccess>,
}

/// A session's MCP endpoint, and the token that opens only it (null without a service token).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct McpAccess {
    pub path: String,
    pub token: Option<String>,
}

/// `POST /v1/sessions/{id}/exec` and `/write_file`: the step and its observation; when the
/// action ended the session (its VM went down, its time ran out), `ended` is true with the
/// row's status and cursor.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Stepped {
    /// The step as in a row (null when the time ran out before it began).
    #[schema(value_type = Option<Object>)]
    pub step: Option<serde_json::Value>,
    pub observation: String,
    pub ended: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub status: Option<engine::row::Status>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cursor: Option<usize>,
}

/// `POST /v1/sessions/{id}/branch` (201).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Branched {
    pub session_id: String,
    pub rollout_id: String,
    pub group_id: String,
    pub parent: String,
    /// Where the agent reaches the branch over MCP.
    pub mcp: Option<McpAccess>,
}

/// `POST /v1/sessions/{id}/submit`: the verdict, as recorded in the session's row.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SessionScored {
    pub rollout_id: Option<String>,
    #[schema(value_type = String)]
    pub status: engine::row::Status,
    pub reward: Option<f64>,
    pub error: Option<String>,
    #[schema(value_type = Option<String>)]
    pub trust: Option<scorers::Trust>,
    pub trust_reason: Option<String>,
    pub cursor: Option<usize>,
    #[schema(value_type = Object)]
    pub score_details: serde_json::Value,
}

/// `DELETE /v1/sessions/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SessionEnded {
    pub session_id: String,
    pub ended: bool,
}

/// `GET /v1/sessions/{id}`, `pause`, `resume`. A session being scored, or busy with a call
/// when listed, has only its id and state (`submitting`, `busy`).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SessionView {
    pub session_id: String,
    /// `live`, `paused`, `ended`, `submitting` or `busy`.
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suite: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spent_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<PausedView>,
    /// Where the agent reaches it over MCP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpAccess>,
}

/// A paused session's saved state.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct PausedView {
    pub since_unix: u64,
    /// When it is removed (`serve.paused_retention_secs` after its pause).
    pub expires_unix: u64,
    pub disk_bytes: u64,
    pub memory_pages_changed: u64,
    pub memory_bytes: u64,
}

/// `GET /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<SessionView>,
}

impl SessionView {
    /// A session known only by its id and state (being scored, or busy when listed).
    pub fn bare(id: &str, state: &str) -> SessionView {
        SessionView {
            session_id: id.to_string(),
            state: state.to_string(),
            rollout_id: None,
            group_id: None,
            suite: None,
            task_id: None,
            steps: None,
            spent_secs: None,
            paused: None,
            mcp: None,
        }
    }
}
