//! Workspaces: named volumes of a tenant that outlive every sandbox.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A workspace as its tenant sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkspaceView {
    pub name: String,
    pub id: String,
    /// The most its archive may hold, MiB.
    pub size_mib: u64,
    /// Bytes of its last accepted sync.
    pub bytes: u64,
    /// Its writable holder's generation (each new writable holder takes the next one).
    pub generation: u64,
    /// The sandbox that holds it writable now.
    pub holder: Option<String>,
    pub created_at_ms: u64,
    pub synced_at_ms: Option<u64>,
    /// Removed this many days after its last use (absent: kept until deleted).
    pub keep_days: Option<u64>,
}

/// `GET /v1/workspaces`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkspaceList {
    pub workspaces: Vec<WorkspaceView>,
}

/// A workspace as a sandbox has it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MountView {
    pub name: String,
    /// Where it is in the guest.
    pub path: String,
    /// `writable` (this sandbox holds it, in `generation`), `read_only` (a copy whose
    /// writes stay in the sandbox) or `copy` (a branch's copy of its parent's writable mount).
    pub mode: String,
    pub generation: u64,
}

/// `POST /v1/sandboxes/{id}/workspaces/sync`: each writable workspace as now accepted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkspacesSynced {
    pub workspaces: Vec<WorkspaceView>,
}
