//! What callers send `farm serve` (request bodies, parsed strictly) and what the service
//! journals about them (`requests.jsonl`, read back on restart).

use std::collections::BTreeMap;

use engine::config::{Action, PolicyConfig, RolloutsSection};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::bounds;
use super::error::{ApiError, ApiResult};
use crate::error::ErrorKind;

/// `POST /v1/rollouts` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    pub items: Vec<ItemRequest>,
}

/// One item of `POST /v1/rollouts` (`n` samples of a task, one group), or the body of
/// `POST /v1/sessions` (one live environment, no policy: the caller acts).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ItemRequest {
    /// Which served suite (optional when one is served).
    pub suite: Option<String>,
    /// A served task's id; or:
    pub task_id: Option<String>,
    /// An inline task, as a row of a JSONL task table.
    #[schema(value_type = Option<Object>)]
    pub task: Option<serde_json::Value>,
    /// Samples: one group (rollouts only; default 1).
    pub n: Option<u32>,
    #[serde(default)]
    pub seed: u64,
    /// Keys over the suite's `[policy]` (rollouts only).
    #[schema(value_type = Option<Object>)]
    pub policy: Option<PolicyConfig>,
    pub policy_version: Option<u64>,
    #[serde(default)]
    pub limits: LimitsRequest,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<serde_json::Value>,
    /// Workspaces a session starts from (sessions only, each `read_only`: a copy of its last
    /// sync, written into the session's guest at its path before it answers).
    #[serde(default)]
    pub workspaces: Vec<crate::workspaces::MountRequest>,
}

impl ItemRequest {
    /// Each field within its bound ([`bounds`]); `at` names a field.
    pub fn check_bounds(&self, at: &dyn Fn(&str) -> String) -> ApiResult<()> {
        if let Some(suite) = &self.suite {
            bounds::text(at("suite"), suite, bounds::ID_BYTES)?;
        }
        if let Some(task_id) = &self.task_id {
            bounds::text(at("task_id"), task_id, bounds::ID_BYTES)?;
        }
        if let Some(task) = &self.task {
            let bytes = task.to_string().len();
            if bytes > bounds::TASK_BYTES {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    at("task"),
                    format!(
                        "{} must be at most {} bytes of JSON; got {bytes} bytes",
                        at("task"),
                        bounds::TASK_BYTES
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A session's request: it takes no policy and no `n`.
    pub fn check_session(&self) -> Result<(), ApiError> {
        crate::workspaces::check_mounts(&self.workspaces)?;
        if let Some(i) = self.workspaces.iter().position(|m| !m.read_only) {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                format!("workspaces[{i}].read_only"),
                "a session mounts workspaces read_only: a scored rollout writes no state that outlives it",
            ));
        }
        if self.policy.is_some() {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                "policy",
                "a session takes no policy: the caller acts in it",
            ));
        }
        if self.n.is_some() {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                "n",
                "a session is one environment (branch it for more)",
            ));
        }
        Ok(())
    }
}

/// Limits a request may lower (never raise) below the suite's `[rollouts]`.
#[derive(Debug, Default, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsRequest {
    pub max_steps: Option<usize>,
    pub timeout_secs: Option<u64>,
    pub step_timeout_secs: Option<u64>,
}

impl LimitsRequest {
    /// The suite's limits, lowered where the request asks; `at` names a field.
    pub fn apply(&self, suite: &RolloutsSection, at: &dyn Fn(&str) -> String) -> Result<RolloutsSection, ApiError> {
        let mut out = suite.clone();
        let lower = |name: &str, asked: Option<u64>, max: u64| -> Result<u64, ApiError> {
            match asked {
                None => Ok(max),
                Some(0) => Err(ApiError::field(
                    ErrorKind::Invalid,
                    at(&format!("limits.{name}")),
                    "must be at least 1",
                )),
                Some(v) if v > max => Err(ApiError::field(
                    ErrorKind::Invalid,
                    at(&format!("limits.{name}")),
                    format!("{v} is above the suite's limit of {max}"),
                )),
                Some(v) => Ok(v),
            }
        };
        out.max_steps = lower("max_steps", self.max_steps.map(|v| v as u64), suite.max_steps as u64)? as usize;
        out.timeout_secs = lower("timeout_secs", self.timeout_secs, suite.timeout_secs)?;
        out.step_timeout_secs = lower("step_timeout_secs", self.step_timeout_secs, suite.step_timeout_secs)?;
        Ok(out)
    }
}

/// One step a caller takes in a session, in the shapes every front-end shares: the bodies of
/// `POST /v1/sessions/{id}/exec`, `/write_file` and `/submit`, OpenEnv's `step` actions and
/// MCP's tools. Values are checked once, where the step is taken (`Service::act`).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = SessionExecRequest)]
pub struct ExecRequest {
    pub command: String,
    /// At most the session's step timeout.
    pub timeout_secs: Option<u64>,
}

/// A session's action within its bounds ([`bounds`]), checked where every front-end's step
/// is taken (`Service::act`, `Service::submit_session`).
pub fn check_action(action: &Action) -> ApiResult<()> {
    match action {
        Action::Exec { command } => bounds::text("command", command, bounds::COMMAND_BYTES),
        Action::WriteFile { path, content, mode } => {
            bounds::text("path", path, bounds::PATH_BYTES)?;
            bounds::text("content", content, bounds::CONTENT_BYTES)?;
            bounds::range("mode", (*mode).into(), (0, 0o7777), "(a file mode, 0o7777 at most)")
        }
        Action::Submit { answer } => match answer {
            Some(answer) => bounds::text("answer", answer, bounds::ANSWER_BYTES),
            None => Ok(()),
        },
    }
}

impl ExecRequest {
    /// The engine's action and the step's own timeout.
    pub fn into_action(self) -> (Action, Option<u64>) {
        (Action::Exec { command: self.command }, self.timeout_secs)
    }
}

/// See [`ExecRequest`].
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileRequest {
    pub path: String,
    pub content: String,
    #[serde(default = "default_mode")]
    pub mode: u32,
}

fn default_mode() -> u32 {
    0o644
}

impl WriteFileRequest {
    pub fn into_action(self) -> Action {
        Action::WriteFile {
            path: self.path,
            content: self.content,
            mode: self.mode,
        }
    }
}

/// `POST /v1/cancel`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBelow {
    pub policy_version_below: u64,
}

/// See [`ExecRequest`]; an empty body is no answer.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitSessionRequest {
    pub answer: Option<String>,
}

/// A line of `requests.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// Rollouts admitted by one submit.
    Submit {
        #[serde(default)]
        idempotency_key: Option<String>,
        #[serde(default)]
        body_digest: String,
        response: serde_json::Value,
        rollouts: Vec<Admitted>,
    },
    /// A session opened (a branch is a session too).
    Session { session_id: String, rollout: Admitted },
    /// A session ended without a row (deleted, expired, shut down).
    SessionEnd { session_id: String, reason: String },
    /// A session was saved to `out/paused/<dir>` and its VM stopped.
    SessionPaused { session_id: String, dir: String },
    /// A paused session runs again.
    SessionResumed { session_id: String },
}

/// What a restart needs to record a rollout that was lost.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Admitted {
    pub rollout_id: String,
    pub group_id: String,
    pub suite: String,
    pub task_id: String,
    pub sample: u32,
    pub seed: u64,
    pub policy_version: Option<u64>,
    #[serde(default)]
    pub policy_name: String,
    pub metadata: Option<String>,
}

/// Whether a line of `requests.jsonl` is a record (`farm repair` keeps only those).
pub fn is_record(line: &[u8]) -> bool {
    serde_json::from_slice::<Record>(line).is_ok()
}

/// The records of `requests.jsonl` and where its complete lines end. A torn last line is
/// left for the recorder to cut; any other bad line stops the start with its number.
pub fn read_records(path: &std::path::Path) -> Result<(Vec<Record>, u64), engine::recorder::journal::JournalError> {
    let mut records = Vec::new();
    let extent = engine::recorder::journal::for_each_line(path, |_, line| -> Result<(), serde_json::Error> {
        records.push(serde_json::from_slice(line)?);
        Ok(())
    })?;
    Ok((records, extent.good_len))
}

/// A request's metadata as JSON text, within its bounds ([`bounds::metadata`]).
pub fn metadata_text(metadata: Option<&serde_json::Value>, field: &str) -> ApiResult<Option<String>> {
    let Some(m) = metadata else { return Ok(None) };
    let text = m.to_string();
    let keys = m.as_object().map_or(0, |o| o.len());
    bounds::metadata(field, keys, text.len())?;
    Ok(Some(text))
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxRequest {
    pub environment: String,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    pub network: Option<String>,
    pub disk_mib: Option<u64>,
    pub idle_timeout_secs: Option<u64>,
    pub lifetime_secs: Option<u64>,
    pub cpus: Option<u64>,
    pub memory_mib: Option<u64>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// What a resume must find before it hands the sandbox back (else it stays paused, in
    /// `resume_failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<Keep>,
    /// At its idle timeout or lifetime: `end` (the default) or `pause` (kept paused for
    /// `serve.paused_retention_secs`; any call on it resumes it, with a new lifetime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<OnTimeout>,
    /// Workspaces to mount (at most 8): writable (one holder at a time) or `read_only`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workspaces: Vec<crate::workspaces::MountRequest>,
}

/// What a sandbox's timeout does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    End,
    Pause,
}

impl SandboxRequest {
    /// Whether its timeout pauses it.
    pub fn pauses_on_timeout(&self) -> bool {
        self.on_timeout == Some(OnTimeout::Pause)
    }

    /// The fields that need nothing of the service: their bounds, variable names, paths,
    /// the user, sizes.
    pub fn check(&self) -> ApiResult<()> {
        let request = self;
        bounds::text("environment", &request.environment, bounds::ID_BYTES)?;
        bounds::variables("env", &request.env)?;
        for k in request.env.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    format!("env.{k}"),
                    "not a variable name",
                ));
            }
        }
        if let Some(dir) = &request.workdir {
            bounds::text("workdir", dir, bounds::PATH_BYTES)?;
            if !dir.starts_with('/') {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    "workdir",
                    "must be an absolute guest path",
                ));
            }
        }
        if let Some(user) = &request.user {
            bounds::text("user", user, bounds::USER_BYTES)?;
            if user.is_empty() || user.contains(|c: char| c.is_whitespace() || c == '\0') {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    "user",
                    "must be a user name, UID or UID:GID",
                ));
            }
        }
        if let Some(network) = &request.network {
            bounds::text("network", network, bounds::ID_BYTES)?;
        }
        if let Some(keep) = &request.keep {
            keep.check("keep")?;
        }
        crate::workspaces::check_mounts(&request.workspaces)?;
        if let Some(disk) = request.disk_mib {
            bounds::range("disk_mib", disk, bounds::SANDBOX_DISK_MIB, "MiB")?;
        }
        if let Some(cpus) = request.cpus {
            bounds::range("cpus", cpus, bounds::CPUS, "vCPUs")?;
        }
        if let Some(memory) = request.memory_mib {
            bounds::range("memory_mib", memory, bounds::MEMORY_MIB, "MiB")?;
        }
        bounds::string_metadata("metadata", &request.metadata)?;
        Ok(())
    }
}

/// What a resume must find before it hands a sandbox or session back ([`crate::sandbox::sandboxes::kept`]).
/// The most entries of each list in a [`Keep`].
pub const MAX_KEPT: usize = 64;

/// What a resume must find before it hands a sandbox back.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Keep {
    /// Files that must be there (a regular file), with this size when one is given.
    #[serde(default)]
    pub files: Vec<KeptFile>,
    /// Processes (farm's pids) that must be running.
    #[serde(default)]
    pub processes: Vec<u32>,
    /// Guest TCP ports something must be listening on.
    #[serde(default)]
    pub ports: Vec<u16>,
}

/// `POST /v1/sandboxes/{id}/resume` (an empty body: the checks its create request named).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeRequest {
    /// What this resume must find, instead of what the sandbox was created with.
    pub keep: Option<Keep>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KeptFile {
    pub path: String,
    pub size: Option<u64>,
}

impl Keep {
    pub fn check(&self, field: &str) -> ApiResult<()> {
        let lists = [
            ("files", self.files.len()),
            ("processes", self.processes.len()),
            ("ports", self.ports.len()),
        ];
        for (name, len) in lists {
            bounds::range(format!("{field}.{name}"), len as u64, (0, MAX_KEPT as u64), "entries")?;
        }
        for (i, file) in self.files.iter().enumerate() {
            let name = format!("{field}.files[{i}].path");
            bounds::text(&name, &file.path, bounds::PATH_BYTES)?;
            if !file.path.starts_with('/') {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    name,
                    "must be an absolute guest path",
                ));
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.processes.is_empty() && self.ports.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(json: serde_json::Value) -> ItemRequest {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn limits_only_go_down_and_name_the_field() {
        let suite: RolloutsSection = toml::from_str("max_steps = 10\ntimeout_secs = 60").unwrap();
        let at = |f: &str| format!("items[0].{f}");
        let lowered = LimitsRequest {
            max_steps: Some(3),
            ..Default::default()
        }
        .apply(&suite, &at)
        .unwrap();
        assert_eq!((lowered.max_steps, lowered.timeout_secs), (3, 60));
        let above = LimitsRequest {
            timeout_secs: Some(61),
            ..Default::default()
        }
        .apply(&suite, &at)
        .unwrap_err();
        assert_eq!(
            (above.kind, above.field.as_deref()),
            (ErrorKind::Invalid, Some("items[0].limits.timeout_secs"))
        );
        let zero = LimitsRequest {
            step_timeout_secs: Some(0),
            ..Default::default()
        }
        .apply(&suite, &at)
        .unwrap_err();
        assert!(zero.message.contains("at least 1"));
    }

    #[test]
    fn a_session_is_an_item_without_policy_or_samples() {
        assert!(item(serde_json::json!({"task_id": "t"})).check_session().is_ok());
        let with_policy = item(serde_json::json!({"task_id": "t", "policy": {"kind": "replay", "actions": []}}))
            .check_session()
            .unwrap_err();
        assert_eq!(with_policy.field.as_deref(), Some("policy"));
        assert_eq!(
            item(serde_json::json!({"task_id": "t", "n": 2}))
                .check_session()
                .unwrap_err()
                .field
                .as_deref(),
            Some("n")
        );
        assert!(serde_json::from_value::<ItemRequest>(serde_json::json!({"task_id": "t", "colour": 1})).is_err());
    }

    #[test]
    fn request_journal_lines_are_records_or_an_error_with_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("requests.jsonl");
        let end = serde_json::json!({"kind": "session_end", "session_id": "s-1", "reason": "deleted"});
        std::fs::write(&path, format!("{end}\n{end}\n{{\"kind\"")).unwrap();
        let (records, good) = read_records(&path).unwrap();
        assert_eq!((records.len(), good as usize), (2, 2 * (end.to_string().len() + 1)));
        std::fs::write(&path, format!("{end}\nnot json\n{end}\n")).unwrap();
        assert!(read_records(&path)
            .unwrap_err()
            .to_string()
            .contains("requests.jsonl:2"));
        assert!(is_record(end.to_string().as_bytes()) && !is_record(b"{}"));
    }
}
