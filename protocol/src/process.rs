//! Background processes: programs the agent starts and keeps running after the request that
//! started them, each with a bounded ring of its output per stream, its standard input open
//! until closed, and its exit status once it ends. They live in the agent (guest memory), so
//! a snapshot, a branch or a pause keeps them exactly as they were, handles (pids) included.
//!
//! Output is addressed by byte offsets from the stream's start: a ring keeps the newest
//! [`SpawnRequest::ring_bytes`] of each stream, and a read from an offset that fell out of it
//! starts at the oldest byte kept and says how many were dropped.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Program;

/// The most processes an agent keeps at once (running, or ended and not yet forgotten).
pub const MAX_PROCESSES: usize = 1024;
/// Ended processes an agent keeps for reads and waits before forgetting the oldest.
pub const MAX_ENDED: usize = 256;
/// The default, and the largest, ring of one output stream.
pub const DEFAULT_RING_BYTES: u64 = 1 << 20;
pub const MAX_RING_BYTES: u64 = 16 << 20;
/// The most one read returns.
pub const MAX_READ_BYTES: u64 = 4 << 20;

/// Start a program in the background.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpawnRequest {
    pub program: Program,
    /// Working directory; the agent's default when absent.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Variables added to (and overriding) the agent's base environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Run as this guest user (as in [`crate::ExecRequest::user`]); root when absent.
    #[serde(default)]
    pub user: Option<String>,
    /// Bytes kept of each output stream (at most [`MAX_RING_BYTES`]).
    pub ring_bytes: u64,
    /// Run on a terminal of this size (its output is one stream, `stdout`), not pipes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<TermSize>,
}

/// A terminal's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TermSize {
    pub rows: u16,
    pub cols: u16,
}

/// Which output a read is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Where a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ProcessStatus {
    Running,
    /// It ended: its exit code, or the signal that killed it.
    Exited {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
}

/// A process as the agent knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessInfo {
    pub pid: u32,
    /// The program as started (argv joined, or the shell line).
    pub command: String,
    /// When it started, in the guest's clock (ms since the Unix epoch).
    pub started_unix_ms: u64,
    pub status: ProcessStatus,
    /// Whether it runs on a terminal.
    pub pty: bool,
    /// Bytes written so far to each stream (the next offset of a read at the end).
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Whether its standard input is still open.
    pub stdin_open: bool,
}

/// Read a process's output from `offset`, waiting up to `wait_ms` for a byte past it (or
/// the stream's end).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadOutputRequest {
    pub pid: u32,
    pub stream: Stream,
    pub offset: u64,
    /// At most this many bytes (and at most [`MAX_READ_BYTES`]).
    pub max_bytes: u64,
    #[serde(default)]
    pub wait_ms: u64,
}

/// What a read got. The response body holds the bytes, from `offset`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputRead {
    /// Where the bytes start: the asked offset, or the oldest byte kept when that fell out
    /// of the ring.
    pub offset: u64,
    /// Bytes between the asked offset and `offset`, dropped from the ring before they were
    /// read.
    pub dropped: u64,
    /// The offset to read from next.
    pub next: u64,
    /// The stream is closed and every byte of it was read: nothing more comes.
    pub eof: bool,
    pub status: ProcessStatus,
}

/// The requests about background processes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProcessRequest {
    /// Start one; answered with its [`ProcessInfo`].
    Spawn(SpawnRequest),
    /// Every process kept.
    List,
    /// One process.
    Get { pid: u32 },
    /// Its output (see [`ReadOutputRequest`]).
    Read(ReadOutputRequest),
    /// Write the body to its standard input; then close it when `close`.
    Write { pid: u32, close: bool },
    /// Send it (its whole process group) a signal.
    Signal { pid: u32, signal: i32 },
    /// Wait up to `timeout_ms` for it to end; answered with its [`ProcessInfo`] either way.
    Wait { pid: u32, timeout_ms: u64 },
    /// Resize its terminal.
    Resize { pid: u32, size: TermSize },
}

/// The answers to [`ProcessRequest`]s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "process", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProcessResponse {
    Info(ProcessInfo),
    List {
        processes: Vec<ProcessInfo>,
    },
    /// Body: the bytes read.
    Output(OutputRead),
    Written {
        bytes: u64,
    },
    Done,
}
