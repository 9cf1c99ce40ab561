//! The wire contract of `farm serve`'s HTTP API: every answer is one of these types (and every
//! request body a type of `requests.rs` or the sandbox API's), and the OpenAPI document
//! (the HTTP transport's, served at `GET /v1/openapi.json` and printed by `farm openapi`) is
//! generated from them. `docs/openapi.json` is that document as committed (a test keeps the
//! two equal), and the Python SDK's models are checked against it
//! (`clients/python/tests/test_wire.py`).
//!
//! The session and rollout protocols that other clients define (OpenEnv's WebSocket, MCP's
//! JSON-RPC) keep their own messages (`openenv.rs`, `mcp.rs`); their HTTP routes are listed
//! in the document with their protocol's message as the body.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub mod events;
mod rollouts;
mod sandboxes;
mod sessions;
pub mod workspaces;

pub use events::{SandboxMetrics, UsageLife, UsageNow};
pub use rollouts::{Cancelled, CancelledCount, Capacity, Group, MemoryCapacity, RolloutView, Submitted};
pub use sandboxes::{
    Deleted, EntryView, EnvironmentList, EnvironmentView, FileWritten, FolderListing, LogPage, OutputChunk, PoolView,
    PortList, PortView, ProcessList, ProcessView, SandboxBranched, SandboxList, SandboxReset, SandboxView,
};
pub use sessions::{
    Branched, McpAccess, PausedView, SessionEnded, SessionList, SessionOpened, SessionScored, SessionView, Stepped,
};

/// A refusal or a failure: what went wrong, and the request field it concerns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Over a tenant's quota (429): which, its limit and its use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaRefusal>,
}

/// The quota a 429 is about.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QuotaRefusal {
    /// `live`, `memory_mib`, `disk_mib`, `build_minutes_per_day`, `requests_per_second` or
    /// `connections`.
    pub name: String,
    pub limit: u64,
    pub used: u64,
}

/// A chunk of a streamed command's output (`stdout` and `stderr` events).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct StreamData {
    pub data: String,
}

/// Why a streamed command failed (the `error` event).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct StreamError {
    pub error: String,
}
