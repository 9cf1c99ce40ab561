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
use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

/// Version of this protocol. The agent answers requests of another version with an error.
pub const PROTOCOL_VERSION: u32 = 3;

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

/// Largest header a reader accepts.
pub const MAX_HEADER_BYTES: u32 = 1 << 20;

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
    WriteFile { bytes: u64 },
    /// Body: the entries as a JSON array of [`FileEntry`] (a listing can be far larger
    /// than a header may be).
    ListFiles { count: u32, truncated: bool },
    RemoveFile,
    /// Body: the file's first bytes (at most the requested cap).
    ReadFile { size: u64, truncated: bool },
    Quiesce,
    Identity,
    Handover { entries: u64 },
    RemoveTree { entries: u64 },
    Sweep { killed: u32, complete: bool },
    /// Body: the command's output, as for `Exec`.
    RunTests(TestsResult),
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
        return Err(FrameError::Malformed(format!("frame does not start with the magic {MAGIC:?}: {:?}", &prefix[0..4])));
    }
    let len = u32::from_be_bytes(prefix[4..8].try_into().expect("4 bytes"));
    let header_len = u32::from_be_bytes(prefix[8..12].try_into().expect("4 bytes"));
    if len > max_frame {
        return Err(FrameError::TooLarge { len: len.into(), max: max_frame.into() });
    }
    if len < 4 {
        return Err(FrameError::Malformed(format!("length {len} is shorter than the header-length field")));
    }
    if header_len > MAX_HEADER_BYTES {
        return Err(FrameError::TooLarge { len: header_len.into(), max: MAX_HEADER_BYTES.into() });
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
    let (header_len, body_len) = check_prefix(prefix, max_frame)?;
    let mut header = vec![0u8; header_len];
    read_exact_or_closed(reader, &mut header, false)?;
    let mut body = vec![0u8; body_len];
    read_exact_or_closed(reader, &mut body, false)?;
    Ok((header, body))
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

/// Writes one frame, blocking.
pub fn write_frame_blocking<M: Serialize>(writer: &mut impl Write, envelope: &Envelope<M>, body: &[u8]) -> Result<(), FrameError> {
    writer.write_all(&encode_frame(envelope, body)).map_err(FrameError::Io)?;
    writer.flush().map_err(FrameError::Io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec_request() -> Request {
        Request::Exec(ExecRequest {
            program: Program::Argv(vec!["echo".into(), "hi".into()]),
            cwd: Some("/tmp".into()),
            env: BTreeMap::from([("A".into(), "1".into())]),
            timeout_ms: Some(1000),
            stdout_cap: 10,
            stderr_cap: 10,
            user: Some("farm".into()),
        })
    }

    #[test]
    fn frame_round_trips_header_and_binary_body() {
        let body: Vec<u8> = (0..=255u8).collect();
        let envelope = Envelope { v: PROTOCOL_VERSION, id: 7, msg: exec_request() };
        let bytes = encode_frame(&envelope, &body);
        let (header, read_body) = read_frame_blocking(&mut &bytes[..], DEFAULT_MAX_FRAME_BYTES).unwrap();
        let decoded: Envelope<Request> = decode_header(&header).unwrap();
        assert_eq!(decoded, envelope);
        assert_eq!(read_body, body);
    }

    #[test]
    fn every_response_round_trips() {
        let responses = [
            Response::Pong(Pong { protocol_version: 1, agent_version: "x".into(), uptime_secs: 1.5 }),
            Response::Exec(ExecResult {
                exit_code: Some(3),
                signal: None,
                timed_out: false,
                stdout_len: 1,
                stderr_len: 2,
                stdout_truncated: true,
                stderr_truncated: false,
                duration_us: 9,
            }),
            Response::WriteFile { bytes: 4 },
            Response::ReadFile { size: 10, truncated: true },
            Response::Quiesce,
            Response::Identity,
            Response::Handover { entries: 3 },
            Response::RemoveTree { entries: 2 },
            Response::Sweep { killed: 4, complete: true },
            Response::RunTests(TestsResult {
                exec: ExecResult {
                    exit_code: None,
                    signal: Some(9),
                    timed_out: true,
                    stdout_len: 0,
                    stderr_len: 0,
                    stdout_truncated: false,
                    stderr_truncated: false,
                    duration_us: 5,
                },
                reward: Some("1".into()),
                junit_len: Some(3),
                junit_file_bytes: 3,
                swept: 2,
                sweep_complete: true,
            }),
            Response::Error(AgentError { kind: ErrorKind::Spawn, message: "nope".into() }),
        ];
        for msg in responses {
            let envelope = Envelope { v: PROTOCOL_VERSION, id: 1, msg };
            let bytes = encode_frame(&envelope, b"");
            let (header, _) = read_frame_blocking(&mut &bytes[..], DEFAULT_MAX_FRAME_BYTES).unwrap();
            assert_eq!(decode_header::<Response>(&header).unwrap(), envelope);
        }
    }

    #[test]
    fn every_request_round_trips() {
        let requests = [
            Request::Ping,
            exec_request(),
            Request::WriteFile(WriteFileRequest {
                path: "a/b".into(),
                mode: 0o644,
                create_parents: true,
                beneath: Some("/workspace".into()),
                owner: Some("1000".into()),
            }),
            Request::ReadFile(ReadFileRequest { path: "a".into(), max_bytes: 9, beneath: Some("/workspace".into()) }),
            Request::RemoveFile { path: "a".into(), beneath: None },
            Request::Handover(HandoverRequest { root: "/workspace".into(), user: "farm".into() }),
            Request::RemoveTree { path: "/opt/farm-tests".into() },
            Request::Sweep(SweepRequest { uids: vec![CANDIDATE_UID, CHECKER_UID] }),
            Request::RunTests(RunTestsRequest {
                program: Program::Shell("true".into()),
                cwd: "/workspace".into(),
                env: BTreeMap::from([("K".into(), "V".into())]),
                user: "999".into(),
                timeout_ms: 1000,
                stdout_cap: 10,
                stderr_cap: 10,
                tests_dir: "/opt/farm-tests".into(),
                private_tests: true,
                reward_file: "/opt/farm-tests/.reward-x".into(),
                junit_file: "/opt/farm-tests/junit.xml".into(),
                sweep_uids: vec![999, 1000],
                checker_view: true,
            }),
        ];
        for msg in requests {
            let envelope = Envelope { v: PROTOCOL_VERSION, id: 2, msg };
            let bytes = encode_frame(&envelope, b"stdin");
            let (header, body) = read_frame_blocking(&mut &bytes[..], DEFAULT_MAX_FRAME_BYTES).unwrap();
            assert_eq!(decode_header::<Request>(&header).unwrap(), envelope);
            assert_eq!(body, b"stdin");
        }
    }

    #[test]
    fn resync_skips_garbage_before_the_next_frame() {
        let envelope = Envelope { v: PROTOCOL_VERSION, id: 3, msg: Request::Ping };
        let frame = encode_frame(&envelope, b"xyz");
        // The tail of an earlier frame (including a partial magic), then a whole frame.
        let mut bytes = b"FRjunk\x00\x01FR".to_vec();
        bytes.extend_from_slice(&frame[5..]);
        bytes.extend_from_slice(&frame);
        let (header, body) = read_frame_resync(&mut &bytes[..], 1024).unwrap();
        assert_eq!(decode_header::<Request>(&header).unwrap(), envelope);
        assert_eq!(body, b"xyz");
        // The strict reader refuses the same stream.
        assert!(matches!(read_frame_blocking(&mut &bytes[..], 1024), Err(FrameError::Malformed(_))));
    }

    #[test]
    fn oversized_length_is_refused_before_allocation() {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&u32::MAX.to_be_bytes());
        bytes.extend_from_slice(&4u32.to_be_bytes());
        let err = read_frame_blocking(&mut &bytes[..], 1024).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { len, max: 1024 } if len == u32::MAX as u64), "{err}");
    }

    #[test]
    fn oversized_header_is_refused() {
        let prefix = [&MAGIC[..], &(MAX_HEADER_BYTES + 8).to_be_bytes()[..], &(MAX_HEADER_BYTES + 1).to_be_bytes()[..]].concat();
        let err = check_prefix(prefix.try_into().unwrap(), u32::MAX).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn header_longer_than_frame_is_malformed() {
        let prefix = [&MAGIC[..], &10u32.to_be_bytes()[..], &20u32.to_be_bytes()[..]].concat();
        let err = check_prefix(prefix.try_into().unwrap(), 1024).unwrap_err();
        assert!(matches!(err, FrameError::Malformed(_)), "{err}");
        let prefix = [&MAGIC[..], &2u32.to_be_bytes()[..], &0u32.to_be_bytes()[..]].concat();
        assert!(matches!(check_prefix(prefix.try_into().unwrap(), 1024), Err(FrameError::Malformed(_))));
    }

    #[test]
    fn truncated_frames_are_reported_as_truncated_not_closed() {
        let envelope = Envelope { v: PROTOCOL_VERSION, id: 1, msg: Request::Ping };
        let bytes = encode_frame(&envelope, b"body");
        assert!(matches!(read_frame_blocking(&mut &bytes[..0], 1024), Err(FrameError::Closed)));
        for cut in 1..bytes.len() {
            let err = read_frame_blocking(&mut &bytes[..cut], 1024).unwrap_err();
            assert!(matches!(err, FrameError::Truncated), "cut at {cut}: {err}");
        }
    }

    #[test]
    fn garbage_header_is_a_clear_error() {
        for header in [&b"not json"[..], br#"{"v":1,"id":1,"msg":{"op":"launch_missiles"}}"#, br#"{"v":1}"#, br#"[]"#] {
            let err = decode_header::<Request>(header).unwrap_err();
            assert!(matches!(err, FrameError::BadHeader(_) | FrameError::Malformed(_)), "{err}");
        }
    }

    #[test]
    fn other_protocol_version_is_named_in_the_error() {
        let err = decode_header::<Request>(br#"{"v":99,"id":5,"msg":{"op":"ping"}}"#).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("99") && text.contains(&format!("supported version {PROTOCOL_VERSION}")), "{text}");
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = decode_header::<Request>(br#"{"v":1,"id":5,"msg":{"op":"ping"},"extra":1}"#);
        assert!(err.is_err());
    }
}

/// The network channel: a second virtio-serial port that carries the guest's proxy
/// connections to farm on the host, which allows or refuses each by its allowlist. The guest
/// has no network device; this port is its only way out.
pub mod net {
    /// The port's name.
    pub const PORT_NAME: &str = "org.farm.net.0";
    /// Where the agent listens for proxy clients in the guest (`HTTP(S)_PROXY`).
    pub const PROXY_ADDR: &str = "127.0.0.1:3128";
    /// The proxy's URL, as guests are told it.
    pub const PROXY_URL: &str = "http://127.0.0.1:3128";
    /// Bytes of payload in one frame at most.
    pub const MAX_PAYLOAD: usize = 64 << 10;
    /// Frame header: connection id (u32), kind (u8), payload length (u32), big-endian.
    pub const HEADER_BYTES: usize = 9;

    /// What a frame says about its connection.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Kind {
        /// The guest accepted a new proxy client.
        Open = 1,
        /// Bytes, either way.
        Data = 2,
        /// That side closed the connection.
        Close = 3,
    }

    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Frame {
        pub conn: u32,
        pub kind: Kind,
        pub payload: Vec<u8>,
    }

    impl Frame {
        pub fn encode(&self) -> Vec<u8> {
            let mut out = Vec::with_capacity(HEADER_BYTES + self.payload.len());
            out.extend_from_slice(&self.conn.to_be_bytes());
            out.push(self.kind as u8);
            out.extend_from_slice(&(self.payload.len() as u32).to_be_bytes());
            out.extend_from_slice(&self.payload);
            out
        }

        /// A frame from the front of `buf` and the bytes it took; `Ok(None)` when more bytes
        /// are needed; `Err` for a frame no peer of farm's sends.
        pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, String> {
            if buf.len() < HEADER_BYTES {
                return Ok(None);
            }
            let conn = u32::from_be_bytes(buf[0..4].try_into().expect("4 bytes"));
            let kind = match buf[4] {
                1 => Kind::Open,
                2 => Kind::Data,
                3 => Kind::Close,
                other => return Err(format!("unknown frame kind {other}")),
            };
            let len = u32::from_be_bytes(buf[5..9].try_into().expect("4 bytes")) as usize;
            if len > MAX_PAYLOAD {
                return Err(format!("a frame of {len} bytes (at most {MAX_PAYLOAD})"));
            }
            if buf.len() < HEADER_BYTES + len {
                return Ok(None);
            }
            Ok(Some((Frame { conn, kind, payload: buf[HEADER_BYTES..HEADER_BYTES + len].to_vec() }, HEADER_BYTES + len)))
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn frames_round_trip_and_bad_ones_are_refused() {
            let f = Frame { conn: 7, kind: Kind::Data, payload: b"GET".to_vec() };
            let mut bytes = f.encode();
            assert_eq!(Frame::decode(&bytes[..5]).unwrap(), None);
            bytes.extend_from_slice(b"rest");
            assert_eq!(Frame::decode(&bytes).unwrap(), Some((f, HEADER_BYTES + 3)));
            assert!(Frame::decode(&[0, 0, 0, 1, 9, 0, 0, 0, 0]).is_err());
            assert!(Frame::decode(&[0, 0, 0, 1, 2, 0xff, 0, 0, 0]).is_err());
        }
    }
}
