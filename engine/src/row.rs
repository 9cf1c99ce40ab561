//! A rollout's row: what every reader of a run (Parquet, the journal, `farm serve`'s
//! results, `farm report`) sees, field by field as `docs/output.md` documents it.

use serde::{Deserialize, Serialize};

/// One rollout, one row. Field by field in `docs/output.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub run_id: String,
    pub suite_name: String,
    pub suite_digest: String,
    pub task_id: String,
    pub task_digest: String,
    pub sample_index: u32,
    pub seed: u64,
    pub snapshot_id: String,
    pub policy_name: String,
    /// JSON object.
    pub policy_params: String,
    pub steps: Vec<Step>,
    /// JSON array of chat messages (empty for replay).
    pub messages: String,
    pub usage: Usage,
    pub reward: Option<f64>,
    pub status: Status,
    pub error: Option<String>,
    /// JSON object: what the verdict rests on.
    pub score_details: String,
    /// How far the verdict can be trusted: `sound` (the agent's code could not reach it) or
    /// `hardened` (it ran where the verdict is made); null when there is no verdict.
    #[serde(default)]
    pub trust: Option<scorers::Trust>,
    /// Why the verdict has that trust level.
    #[serde(default)]
    pub trust_reason: Option<String>,
    pub attempts: u32,
    pub timings: Timings,
    /// Milliseconds since the UNIX epoch.
    pub started_at_ms: i64,
    pub farm_version: String,
    /// `farm serve` only (null in `farm run`): the rollout's id, its group (one submitted
    /// item's `n` samples), the trainer's policy version and the item's metadata (JSON text).
    #[serde(default)]
    pub rollout_id: Option<String>,
    #[serde(default)]
    pub group_id: Option<String>,
    #[serde(default)]
    pub policy_version: Option<u64>,
    #[serde(default)]
    pub metadata: Option<String>,
    /// How the rollout's VM came to be in its snapshot's state: `fork` (a new QEMU process),
    /// `reset` (a VM of the same snapshot that had run before, reset in place:
    /// `[rollouts] reuse`) or `reset_failed` (its reset failed: a new fork instead, why in
    /// `reset_error`). Null when the rollout had no VM.
    #[serde(default)]
    pub rollout_vm: Option<snapshotter::Start>,
    /// The same for the VM its tests ran in (null when they ran in the rollout's VM, or in a
    /// shared scoring VM, or there were none).
    #[serde(default)]
    pub scoring_vm: Option<snapshotter::Start>,
    /// Why a reset in place failed (`reset_failed` above).
    #[serde(default)]
    pub reset_error: Option<String>,
    /// The journal's hash chain at this row (see [`crate::recorder::chain`]): set by the
    /// recorder when the row is recorded, whatever the row held before. Always the last field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<String>,
    /// Files of the rollout that the recorder stores under the run folder's
    /// `artifacts/<folder>/` ([`Row::artifacts_folder`]) when it records the row (Harbor's
    /// logs and artifacts); not a column, and not in the journal.
    #[serde(skip)]
    pub attachments: Vec<Attachment>,
}

/// A file of a rollout's, kept beside its row: a plain relative path and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub path: String,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub index: u32,
    pub kind: StepKind,
    pub text: String,
    pub stdout: String,
    pub stderr: String,
    pub exit_code: Option<i32>,
    pub started_at_ms: i64,
    pub duration_ms: f64,
}

/// What a step did; written as `exec`, `write_file` or `submit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    Exec,
    WriteFile,
    Submit,
}

impl Step {
    /// A step that starts now: `text` is the command, the file's path or the answer.
    pub fn new(index: u32, kind: StepKind, text: impl Into<String>) -> Step {
        Step {
            index,
            kind,
            text: text.into(),
            stdout: String::new(),
            stderr: String::new(),
            exit_code: None,
            started_at_ms: now_ms(),
            duration_ms: 0.0,
        }
    }
}

/// Milliseconds since the UNIX epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub total_tokens: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    pub fork_ms: f64,
    pub rollout_ms: f64,
    pub score_ms: f64,
    pub total_ms: f64,
}

/// How a rollout ended; written as `passed`, `failed`, `timeout` or `env_error`.
/// (The Parquet column is a plain string: see [`schema`].)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Scored, and the reward reached the pass threshold.
    Passed,
    /// Scored below the threshold, or the agent's own doing ended it (reward 0).
    Failed,
    /// The rollout or its tests ran past their limit (reward 0).
    Timeout,
    /// The farm, not the agent, failed: no reward (never a zero a trainer could mistake for
    /// a failure), left out of pass@k.
    EnvError,
}

impl Status {
    pub const ALL: [Status; 4] = [Status::Passed, Status::Failed, Status::Timeout, Status::EnvError];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Passed => "passed",
            Status::Failed => "failed",
            Status::Timeout => "timeout",
            Status::EnvError => "env_error",
        }
    }
}

/// Text that is not a status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected passed, failed, timeout or env_error, got {0:?}")]
pub struct NotAStatus(pub String);

impl std::str::FromStr for Status {
    type Err = NotAStatus;

    fn from_str(text: &str) -> Result<Status, NotAStatus> {
        Status::ALL
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| NotAStatus(text.to_string()))
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Row {
    /// A row of task `task_id`, sample `sample_index`, before anything was recorded: status
    /// `env_error` with no reward, no steps, empty texts; callers fill in the rest.
    pub fn blank(task_id: &str, sample_index: u32, seed: u64) -> Row {
        Row {
            run_id: String::new(),
            suite_name: String::new(),
            suite_digest: String::new(),
            task_id: task_id.to_string(),
            task_digest: String::new(),
            sample_index,
            seed,
            snapshot_id: String::new(),
            policy_name: String::new(),
            policy_params: "{}".into(),
            steps: Vec::new(),
            messages: "[]".into(),
            usage: Usage::default(),
            reward: None,
            status: Status::EnvError,
            error: None,
            score_details: "{}".into(),
            trust: None,
            trust_reason: None,
            attempts: 1,
            timings: Timings::default(),
            started_at_ms: 0,
            farm_version: env!("CARGO_PKG_VERSION").to_string(),
            rollout_id: None,
            group_id: None,
            policy_version: None,
            metadata: None,
            rollout_vm: None,
            scoring_vm: None,
            reset_error: None,
            chain: None,
            attachments: Vec::new(),
        }
    }

    /// Notes how the rollout's VM (`scoring`: its scoring VM) started.
    pub(crate) fn note_vm(&mut self, fork: &snapshotter::Fork, scoring: bool) {
        self.note_start(fork.start, fork.reset_error.clone(), scoring);
    }

    pub(crate) fn note_start(&mut self, start: snapshotter::Start, reset_error: Option<String>, scoring: bool) {
        if scoring {
            self.scoring_vm = Some(start);
        } else {
            self.rollout_vm = Some(start);
        }
        if let Some(error) = reset_error {
            let which = if scoring { "scoring VM" } else { "rollout VM" };
            let line = format!("{which}: {error}");
            self.reset_error = Some(match self.reset_error.take() {
                Some(earlier) => format!("{earlier}; {line}"),
                None => line,
            });
        }
    }

    /// The folder under the run's `artifacts/` where the rollout's attachments go: the task id
    /// made safe for a file name, a short hash of it (two ids may look alike once made safe),
    /// and the sample (or the rollout id in `farm serve`).
    pub fn artifacts_folder(&self) -> String {
        use sha2::Digest;
        let safe = |text: &str| -> String {
            text.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                        c
                    } else {
                        '_'
                    }
                })
                .take(100)
                .collect()
        };
        let hash = format!("{:x}", sha2::Sha256::digest(self.task_id.as_bytes()));
        let which = match &self.rollout_id {
            Some(id) => safe(id),
            None => self.sample_index.to_string(),
        };
        format!("{}-{}-{which}", safe(&self.task_id), &hash[..8])
    }

    /// What makes a row unique in its output folder: the rollout id (`farm serve`), else the
    /// task and sample (`farm run`).
    pub fn key(&self) -> String {
        match &self.rollout_id {
            Some(id) => id.clone(),
            None => plan_key(&self.task_id, self.sample_index),
        }
    }
}

/// The key of `farm run`'s rollout of `task`, sample `sample`.
pub fn plan_key(task: &str, sample: u32) -> String {
    format!("{task}\u{0}{sample}")
}

/// What the summary needs of a row; the writer keeps only this for the whole run, so memory
/// does not grow with the rollouts' output.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// [`Row::key`].
    pub key: String,
    pub task_id: String,
    pub task_digest: String,
    pub sample_index: u32,
    pub status: Status,
    pub reward: Option<f64>,
    pub trust: Option<scorers::Trust>,
    pub timings: Timings,
}

impl From<&Row> for Outcome {
    fn from(r: &Row) -> Outcome {
        Outcome {
            key: r.key(),
            task_id: r.task_id.clone(),
            task_digest: r.task_digest.clone(),
            sample_index: r.sample_index,
            status: r.status,
            reward: r.reward,
            trust: r.trust,
            timings: r.timings.clone(),
        }
    }
}
