//! Answers of the sandbox API: environments, their build logs, sandboxes, files.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::ToSchema;

/// `POST /v1/environments` (202 while it builds, 200 when it existed), `GET`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct EnvironmentView {
    pub id: String,
    /// `building`, `ready` or `failed`.
    pub state: String,
    /// What it is made of (its id is a digest of this).
    #[schema(value_type = Object)]
    pub spec: serde_json::Value,
    pub cpus: u32,
    pub memory_mib: u32,
    pub created_at_ms: u64,
    pub log_lines: usize,
    /// Its snapshot, once ready.
    pub snapshot: Option<String>,
    /// Why its build failed.
    pub error: Option<engine::sandbox::BuildFailure>,
    /// Live sandboxes made from it.
    pub sandboxes: usize,
    /// Warm forks of it ready.
    pub warm: usize,
}

/// `GET /v1/environments`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct EnvironmentList {
    pub environments: Vec<EnvironmentView>,
}

/// `GET /v1/environments/{id}/logs`: build lines from the offset asked, the offset to ask
/// for next, and the build's state.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct LogPage {
    pub lines: Vec<String>,
    pub next: usize,
    pub state: String,
    pub error: Option<engine::sandbox::BuildFailure>,
}

/// `DELETE /v1/environments/{id}`, `DELETE /v1/sandboxes/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Deleted {
    pub id: String,
    pub deleted: bool,
}

/// `POST /v1/sandboxes` (201, or 200 for a retried create), `GET`, `branch`, `pause`,
/// `resume`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SandboxView {
    pub id: String,
    pub environment: String,
    /// `running` or `paused`.
    pub state: String,
    pub cpus: u32,
    pub memory_mib: u32,
    pub network: Option<String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
    pub idle_timeout_secs: u64,
    /// The sandbox it was branched from.
    pub parent: Option<String>,
    pub metadata: BTreeMap<String, String>,
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<SandboxView>,
}

/// `PUT /v1/sandboxes/{id}/files`, `/folders`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct FileWritten {
    pub path: String,
    pub bytes: usize,
}
