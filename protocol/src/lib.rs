//! The wire protocol between the farm host and the guest agent (`farm-agent`).
//!
//! Both ends exchange *frames* over one byte stream (a virtio-serial port in the guest, a UNIX
//! socket on the host). A frame is
//!
//! ```text
//! +-------------+-------------+-------------+----------------------+------------------+
//! | magic "FRM1"| length: u32 | header: u32 | header bytes (JSON)  | body bytes (raw) |
//! +-------------+-------------+-------------+----------------------+------------------+
//!                 big endian    big endian
//! length = 4 + header length + body length   (the bytes after the length field)
//! ```
//!
//! The magic lets the agent find the start of the next frame when the guest kernel dropped
//! part of the stream (a virtio port discards what arrives before the agent opens it).
//!
//! The header is a JSON [`Envelope`]: the protocol version, the request id that pairs a
//! response with its request, and the message. Bulk bytes (stdin, file contents, command
//! output) travel raw in the body so nothing is base64-encoded. Several requests may be in
//! flight at once; responses come back in any order, matched by id.
//!
//! Limits are part of the protocol: a reader refuses a frame longer than its configured
//! maximum *before* allocating for it, and a header longer than [`MAX_HEADER_BYTES`].
//! `docs/agent-protocol.md` describes every message.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::io::{self, Read};

use serde::{Deserialize, Serialize};

/// Version of this protocol. The agent answers requests of another version with an error.
pub const PROTOCOL_VERSION: u32 = 4;

/// The unprivileged guest user that runs everything derived from an agent in a scoring VM
/// (its files, the code the tests import, the commands they run): `farm`, uid and gid 1000.
pub const CANDIDATE_UID: u32 = 1000;

/// The unprivileged guest user a test command runs as when a task asks for a separate
/// checker (`test_user = "checker"`): `farm-checker`, uid and gid 999. It is not the
/// candidate, so the candidate can neither read its files nor signal or trace it.
pub const CHECKER_UID: u32 = 999;

/// The setuid helper in every image that runs a command as [`CANDIDATE_UID`]; only root and
/// the checker's group may execute it.
pub const SANDBOX_PROGRAM: &str = "/usr/local/bin/farm-sandbox";

/// Name of the virtio-serial port the agent listens on (`virtserialport,name=...`).
pub const PORT_NAME: &str = "org.farm.agent.0";

/// Largest header a reader accepts: an exec's arguments (up to 2 MiB by the service's bounds,
/// Linux's `ARG_MAX`) and environment, as JSON, whose escapes may make each byte six.
pub const MAX_HEADER_BYTES: u32 = 16 << 20;

/// Default largest frame a reader accepts (header + body).
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 96 << 20;

/// The four bytes every frame starts with.
pub const MAGIC: [u8; 4] = *b"FRM1";

/// Bytes of the magic and the two length fields at the start of every frame.
pub const PREFIX_BYTES: usize = 12;

/// A frame's header: protocol version, request id and message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope<M> {
    pub v: u32,
    pub id: u64,
    pub msg: M,
}

/// What the host asks of the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Liveness and version check. Also used after a fork to learn the agent is serving.
    Ping,
    /// Run a command. Body: bytes for its standard input.
    Exec(ExecRequest),
    /// Write a file. Body: its contents.
    WriteFile(WriteFileRequest),
    /// Read a file. The response body holds at most `max_bytes` of it.
    ReadFile(ReadFileRequest),
    /// List regular files under a directory, recursively (not crossing file systems).
    ListFiles(ListFilesRequest),
    /// Remove a file (missing files are not an error). With `beneath`, `path` is relative to
    /// that folder and no symbolic link is followed on the way.
    RemoveFile {
        path: String,
        #[serde(default)]
        beneath: Option<String>,
    },
    /// Flush every file system to the disk (before a snapshot).
    Quiesce,
    /// Take a new identity after a fork. Body: entropy bytes for the kernel RNG.
    Identity(IdentityRequest),
    /// Give a folder and everything under it to a user (no symbolic link is followed, no
    /// other file system is entered).
    Handover(HandoverRequest),
    /// Remove a folder and everything under it, without following symbolic links.
    RemoveTree { path: String },
    /// Kill processes and wait until they are gone (see [`SweepRequest`]).
    Sweep(SweepRequest),
    /// Run a task's hidden tests: prepare the tests folder and the verdict files, run the
    /// command as the given user, kill every process of the sweep users once it ends, and
    /// only then read the verdict files. Body: bytes for the command's standard input.
    RunTests(RunTestsRequest),
    /// Start, read, feed, signal or wait for a background process ([`process`]). Body: the
    /// bytes of a `Write`.
    Process(ProcessRequest),
    /// A path's facts or a folder's entries ([`folder`]), without running a command.
    Folder(folder::FolderRequest),
}

/// The program to run: an argument vector, or a string for `/bin/sh -c`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Program {
    Argv(Vec<String>),
    Shell(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    pub program: Program,
    /// Working directory; the agent's default (`/workspace` or `/`) when absent.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Variables added to (and overriding) the agent's base environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Wall-clock limit; on expiry the command's whole process group is killed.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Bytes of standard output kept; the rest is read and dropped.
    pub stdout_cap: u64,
    /// Bytes of standard error kept; the rest is read and dropped.
    pub stderr_cap: u64,
    /// Run as this guest user: a name from the guest's `/etc/passwd`, `UID` or `UID:GID`.
    /// Root when absent.
    #[serde(default)]
    pub user: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteFileRequest {
    pub path: String,
    /// Permission bits, e.g. `0o644`.
    pub mode: u32,
    /// Create missing parent directories.
    #[serde(default)]
    pub create_parents: bool,
    /// Confine the write to this folder: `path` is relative to it, no symbolic link is
    /// followed, parents are created inside it, and the file is written under a temporary
    /// name and renamed into place, so an existing link (symbolic or hard) is replaced rather
    /// than written through. The mode loses its setuid, setgid and sticky bits.
    #[serde(default)]
    pub beneath: Option<String>,
    /// Owner of the file (and of the parents created for it): a user as in
    /// [`ExecRequest::user`]. Root when absent.
    #[serde(default)]
    pub owner: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadFileRequest {
    pub path: String,
    pub max_bytes: u64,
    /// Confine the read to this folder (`path` relative to it, no symbolic link followed).
    #[serde(default)]
    pub beneath: Option<String>,
    /// Start reading this many bytes into the file (the size answered is still the whole
    /// file's).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub offset: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// See [`Request::Handover`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandoverRequest {
    pub root: String,
    /// A user as in [`ExecRequest::user`].
    pub user: String,
}

/// See [`Request::Sweep`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepRequest {
    /// Kill every process whose real, effective, saved or file-system uid is one of these.
    /// Empty: every process except PID 1 and the agent itself.
    pub uids: Vec<u32>,
}

/// See [`Request::RunTests`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunTestsRequest {
    pub program: Program,
    pub cwd: String,
    /// Variables added to the agent's base environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The user the command runs as (as in [`ExecRequest::user`]).
    pub user: String,
    pub timeout_ms: u64,
    pub stdout_cap: u64,
    pub stderr_cap: u64,
    /// The folder holding the hidden tests. With `private_tests` it is given to `user` with
    /// mode 0700 (only that user and root can read it); otherwise it belongs to root, is
    /// readable by everyone and writable by nobody but root.
    pub tests_dir: String,
    pub private_tests: bool,
    /// Created empty before the command starts, owned by `user`, mode 0600; read back (at
    /// most 4 KiB, a regular file only) after the sweep.
    pub reward_file: String,
    /// Created and read back like the reward file (at most [`MAX_JUNIT_BYTES`]).
    pub junit_file: String,
    /// Users whose every process is killed once the command ends, before anything is read.
    pub sweep_uids: Vec<u32>,
    /// The command is a checker: it runs in a mount namespace of its own where the workspace
    /// is a view that follows no symbolic link and opens no device node, so no link the agent
    /// planted can point it at the tests (`farm-sandbox` returns the agent's code to the
    /// ordinary view).
    #[serde(default)]
    pub checker_view: bool,
    /// The scoring VM serves more checks after this one (`[scoring] isolation =
    /// "sandbox"`): the check runs in a process the harness zygote forks, with a fresh
    /// candidate in a private view, and after the verdict is read the agent makes the VM
    /// ready for the next check ([`TestsResult::reset`]). Only for checks in the zygote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<SharedCheck>,
}

/// A check in a scoring VM that serves more checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedCheck {
    /// The workspace, removed and made again empty after the check.
    pub workspace: String,
}

/// Whether a scoring VM is ready for its next check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResetResult {
    pub ready: bool,
    /// Why it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// The most entries one [`Request::ListFiles`] may ask for: a workspace listing is complete
/// up to here (what was deleted is computed from it), far beyond the files read back.
pub const MAX_LISTING: u32 = 200_000;

/// The largest JUnit report a [`Request::RunTests`] reads back.
pub const MAX_JUNIT_BYTES: u64 = 4 << 20;

/// What [`Request::RunTests`] found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestsResult {
    /// The command's ending. The response body holds its standard output and error as for
    /// [`Response::Exec`], then the JUnit report's bytes.
    pub exec: ExecResult,
    /// Contents of the reward file after the sweep (None: missing or not a regular file).
    pub reward: Option<String>,
    /// Bytes of the JUnit report at the end of the body (None: the file is missing, empty or
    /// not a regular file). At most [`MAX_JUNIT_BYTES`].
    pub junit_len: Option<u64>,
    /// The JUnit file's size: more than [`MAX_JUNIT_BYTES`] means the report was not read.
    #[serde(default)]
    pub junit_file_bytes: u64,
    /// Processes the sweep killed.
    pub swept: u32,
    /// Whether every process of the sweep users was gone before the files were read.
    pub sweep_complete: bool,
    /// For a shared check ([`RunTestsRequest::shared`]): whether the VM is ready for the
    /// next one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset: Option<ResetResult>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListFilesRequest {
    pub root: String,
    /// Entries returned at most; the response says whether more were left out.
    pub max_entries: u32,
}

/// One regular file found by [`Request::ListFiles`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Path relative to the listed root.
    pub path: String,
    pub size: u64,
    /// Modification time, nanoseconds since the UNIX epoch.
    pub mtime_ns: i64,
    pub mode: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityRequest {
    /// Host wall clock, nanoseconds since the UNIX epoch.
    pub unix_time_ns: u64,
    pub hostname: String,
    /// Variables every later command sees (e.g. `FARM_SEED`, `FARM_FORK_ID`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// What the agent answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Response {
    Pong(Pong),
    /// Body: `stdout_len` bytes of standard output, then `stderr_len` bytes of standard error.
    Exec(ExecResult),
    WriteFile {
        bytes: u64,
    },
    /// Body: the entries as a JSON array of [`FileEntry`] (a listing can be far larger
    /// than a header may be).
    ListFiles {
        count: u32,
        truncated: bool,
    },
    RemoveFile,
    /// Body: the file's first bytes (at most the requested cap).
    ReadFile {
        size: u64,
        truncated: bool,
    },
    Quiesce,
    Identity,
    Handover {
        entries: u64,
    },
    RemoveTree {
        entries: u64,
    },
    Sweep {
        killed: u32,
        complete: bool,
    },
    /// Body: the command's output, as for `Exec`.
    RunTests(TestsResult),
    /// Body: the bytes of an `Output`.
    Process(ProcessResponse),
    /// Body: a listing's entries, as JSON.
    Folder(folder::FolderResponse),
    Error(AgentError),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pong {
    pub protocol_version: u32,
    pub agent_version: String,
    /// Seconds since the guest booted.
    pub uptime_secs: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecResult {
    /// Exit status when the command exited normally.
    pub exit_code: Option<i32>,
    /// Signal number when the command was killed by a signal.
    pub signal: Option<i32>,
    /// The command ran past its timeout and its process group was killed.
    pub timed_out: bool,
    pub stdout_len: u64,
    pub stderr_len: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Microseconds from spawn to exit, measured in the guest.
    pub duration_us: u64,
}

/// A request the agent could not carry out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentError {
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The frame or request was malformed or of another protocol version.
    BadRequest,
    /// The program could not be started (not found, not executable, bad cwd).
    Spawn,
    /// A file operation failed.
    Io,
    /// Anything else inside the agent.
    Internal,
    /// What the request names is not there (a background process).
    NotFound,
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("the channel closed")]
    Closed,
    #[error("the channel closed in the middle of a frame")]
    Truncated,
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: u64, max: u64 },
    #[error("frame is malformed: {0}")]
    Malformed(String),
    #[error("frame header is not valid JSON for this message: {0}")]
    BadHeader(#[source] serde_json::Error),
    #[error("reading or writing the channel failed")]
    Io(#[source] io::Error),
}

/// Encodes a frame: length prefix, JSON header, raw body.
pub fn encode_frame<M: Serialize>(envelope: &Envelope<M>, body: &[u8]) -> Vec<u8> {
    let header = serde_json::to_vec(envelope).expect("protocol messages always serialize");
    let len = 4 + header.len() + body.len();
    let mut out = Vec::with_capacity(8 + len);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.extend_from_slice(&(header.len() as u32).to_be_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(body);
    out
}

/// Checks the magic and the two length fields at the start of a frame and returns the
/// (header, body) lengths.
///
/// This runs before anything is allocated for the frame, so a hostile length cannot make the
/// reader allocate more than `max_frame`.
pub fn check_prefix(prefix: [u8; PREFIX_BYTES], max_frame: u32) -> Result<(usize, usize), FrameError> {
    if prefix[0..4] != MAGIC {
        return Err(FrameError::Malformed(format!(
            "frame does not start with the magic {MAGIC:?}: {:?}",
            &prefix[0..4]
        )));
    }
    let len = u32::from_be_bytes(prefix[4..8].try_into().expect("4 bytes"));
    let header_len = u32::from_be_bytes(prefix[8..12].try_into().expect("4 bytes"));
    if len > max_frame {
        return Err(FrameError::TooLarge {
            len: len.into(),
            max: max_frame.into(),
        });
    }
    if len < 4 {
        return Err(FrameError::Malformed(format!(
            "length {len} is shorter than the header-length field"
        )));
    }
    if header_len > MAX_HEADER_BYTES {
        return Err(FrameError::TooLarge {
            len: header_len.into(),
            max: MAX_HEADER_BYTES.into(),
        });
    }
    if header_len > len - 4 {
        return Err(FrameError::Malformed(format!(
            "header length {header_len} exceeds the frame's remaining {} bytes",
            len - 4
        )));
    }
    Ok((header_len as usize, (len - 4 - header_len) as usize))
}

/// Decodes a header read from a frame and checks its protocol version.
pub fn decode_header<M: for<'de> Deserialize<'de>>(header: &[u8]) -> Result<Envelope<M>, FrameError> {
    // Read the version first so a peer of another version gets a precise answer rather
    // than a schema error.
    #[derive(Deserialize)]
    struct VersionOnly {
        v: u32,
        id: Option<u64>,
    }
    let version: VersionOnly = serde_json::from_slice(header).map_err(FrameError::BadHeader)?;
    if version.v != PROTOCOL_VERSION {
        return Err(FrameError::Malformed(format!(
            "protocol version {} (request id {:?}) is not the supported version {PROTOCOL_VERSION}",
            version.v, version.id
        )));
    }
    serde_json::from_slice(header).map_err(FrameError::BadHeader)
}

/// Reads one frame, blocking. Returns the header bytes and the body.
pub fn read_frame_blocking(reader: &mut impl Read, max_frame: u32) -> Result<(Vec<u8>, Vec<u8>), FrameError> {
    let mut prefix = [0u8; PREFIX_BYTES];
    read_exact_or_closed(reader, &mut prefix, true)?;
    read_after_prefix(reader, prefix, max_frame)
}

/// Reads one frame like [`read_frame_blocking`], but first skips bytes until the magic, so
/// a reader that joined the stream mid-frame finds the next whole frame.
pub fn read_frame_resync(reader: &mut impl Read, max_frame: u32) -> Result<(Vec<u8>, Vec<u8>), FrameError> {
    let mut prefix = [0u8; PREFIX_BYTES];
    read_exact_or_closed(reader, &mut prefix[..4], true)?;
    while prefix[..4] != MAGIC {
        prefix.copy_within(1..4, 0);
        read_exact_or_closed(reader, &mut prefix[3..4], false)?;
    }
    read_exact_or_closed(reader, &mut prefix[4..], false)?;
    read_after_prefix(reader, prefix, max_frame)
}

/// The header and body of a frame whose prefix was read.
fn read_after_prefix(
    reader: &mut impl Read,
    prefix: [u8; PREFIX_BYTES],
    max_frame: u32,
) -> Result<(Vec<u8>, Vec<u8>), FrameError> {
    let (header_len, body_len) = check_prefix(prefix, max_frame)?;
    let mut header = vec![0u8; header_len];
    read_exact_or_closed(reader, &mut header, false)?;
    let mut body = vec![0u8; body_len];
    read_exact_or_closed(reader, &mut body, false)?;
    Ok((header, body))
}

fn read_exact_or_closed(reader: &mut impl Read, buf: &mut [u8], at_start: bool) -> Result<(), FrameError> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 && at_start => return Err(FrameError::Closed),
            Ok(0) => return Err(FrameError::Truncated),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    Ok(())
}

pub mod folder;
pub mod net;
pub mod process;
pub use process::{ProcessRequest, ProcessResponse};

#[cfg(test)]
mod tests;
