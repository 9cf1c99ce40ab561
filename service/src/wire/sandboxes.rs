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
    /// Its pool of warm forks and of its sandboxes' VMs kept for a reset, once started.
    pub pool: Option<PoolView>,
}

/// An environment's pool: what it holds and what it did since it started.
pub use snapshotter::PoolCounts as PoolView;
/// How a sandbox's VM came to be in its environment's snapshot: `fork` (a new QEMU process),
/// `reset` (a VM its tenant was done with, reset in place), `reset_failed` (such a reset
/// failed; a new process took its place).
pub use snapshotter::Start as VmStart;

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
    /// When its last checkpoint (a pause, a checkpoint, a graceful stop) was made: what a
    /// restart of the service after a crash brings back. None: a restart forks its
    /// environment again.
    pub checkpoint_at_ms: Option<u64>,
    /// The workspaces it has mounted, and how.
    pub workspaces: Vec<super::workspaces::MountView>,
    /// How its running VM came to be in its environment's snapshot (None while paused).
    pub start: Option<VmStart>,
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<SandboxView>,
}

/// A path in a sandbox: `GET /v1/sandboxes/{id}/stat`, and each entry of a listing.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct EntryView {
    /// Its name in its folder (for `stat`: the path asked for).
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    /// Permission bits, as a number (`0o644` is 420).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub modified_at_ms: i64,
    /// A symbolic link's target (links are never followed).
    pub target: Option<String>,
}

/// `GET /v1/sandboxes/{id}/entries`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct FolderListing {
    pub path: String,
    /// Sorted by name.
    pub entries: Vec<EntryView>,
    /// More entries than `max` were there.
    pub truncated: bool,
}

/// `POST /v1/sandboxes/{id}/branch`: the branch, or with a `count` the list of them.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum SandboxBranched {
    One(Box<SandboxView>),
    Many(SandboxList),
}

/// `POST /v1/sandboxes/{id}/reset`: the sandbox, back at its environment's snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SandboxReset {
    pub sandbox: SandboxView,
    /// True: the same VM put back exactly (same QEMU process). False: a new fork of the
    /// environment took its place, and `why` says why.
    pub in_place: bool,
    pub why: Option<String>,
    /// How long the reset took, identity included.
    pub took_ms: u64,
}

/// `PUT /v1/sandboxes/{id}/files`, `/folders`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct FileWritten {
    pub path: String,
    pub bytes: usize,
}

/// A background process of a sandbox: `POST /v1/sandboxes/{id}/processes` (201), `GET`,
/// `stdin`, `signal`, `wait`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ProcessView {
    /// Its handle: the guest's pid (also after a branch, a pause and a resume).
    pub pid: u32,
    pub command: String,
    pub started_at_ms: u64,
    /// `running` or `exited`.
    pub state: String,
    /// Once exited: its code, or the signal that ended it.
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Whether it runs on a terminal (its output is one stream, `stdout`).
    pub pty: bool,
    /// Bytes it wrote so far to each stream (the offset of the next byte).
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub stdin_open: bool,
}

/// `GET /v1/sandboxes/{id}/processes`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ProcessList {
    pub processes: Vec<ProcessView>,
}

/// `GET /v1/sandboxes/{id}/processes/{pid}/output`: text from `offset` (whole characters:
/// one cut at the end waits for the next read), and where to read next. `dropped` bytes
/// between the offset asked and `offset` fell out of the process's ring before they were
/// read.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct OutputChunk {
    pub data: String,
    pub offset: u64,
    pub next: u64,
    pub dropped: u64,
    /// The stream ended and all of it was read.
    pub eof: bool,
    pub state: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
}

/// An open port of a sandbox: `POST /v1/sandboxes/{id}/ports` (201), `GET`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct PortView {
    /// The guest's port (its service listens on the guest's `127.0.0.1:PORT`).
    pub port: u16,
    /// Where a browser or any HTTP client reaches it: the token is the host name's first
    /// label.
    pub url: String,
    /// The token for this sandbox and port alone.
    pub token: String,
    /// The port listener's address, for clients that send the token in a header instead.
    pub address: String,
    /// The header that carries the token.
    pub header: String,
}

/// `GET /v1/sandboxes/{id}/ports`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct PortList {
    pub ports: Vec<PortView>,
}
