//! Protected scoring. Everything a rollout leaves behind is untrusted data: the artifacts
//! (files changed under the workspace, read out with size limits and sanitised paths) and
//! the final answer. Scoring happens where the agent cannot reach: answers are matched on
//! the host ([`answer`]); tests run in a fresh fork of the pristine task snapshot that
//! receives the artifacts first and the hidden tests only after ([`hidden`]); the host reads
//! the exit code, a JUnit report and a reward file at a random path handed to the tests (a
//! harness should take it out of the environment before it runs the agent's code, as the
//! shipped ones do);
//! an external program on the host may decide instead ([`external`]).
//!
//! Every [`Verdict`] says how far it can be trusted ([`Trust`]): whether the agent's code
//! could reach it at all.
#![forbid(unsafe_code)]

// The checkout this crate is built in (`.cargo/config.toml`): its build is never another clone's.
const _: Option<&str> = option_env!("FARM_CHECKOUT");

pub mod answer;
pub mod artifacts;
pub mod external;
pub mod harbor;
pub mod hidden;
pub mod orchestrate;
pub mod trust;
pub mod zygote;

use serde::Serialize;

pub use artifacts::{collect_artifacts, ArtifactLimits, Artifacts, ListingError};
pub use hidden::{run_tests, HarnessKind, HarnessReport, ScoringError, TestOutcome};
pub use orchestrate::{agent_failure, ScoringIsolation, ScoringMode};
pub use trust::{Trust, TrustLevel};

/// The decision about one rollout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// In [0, 1].
    pub reward: f64,
    pub passed: bool,
    pub timed_out: bool,
    /// Whether the agent's code could have reached this verdict, and why.
    pub trust: TrustLevel,
    /// What the decision rests on.
    pub details: Details,
}

/// What a verdict rests on, as recorded in a row's `score_details` (JSON; see
/// `docs/output.md`). Fields that do not apply are left out.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Details {
    /// In words: the rule that decided (exit code, test counts, reward file, answer...).
    pub basis: String,
    /// What the hidden tests produced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tests: Option<TestOutcome>,
    /// What farm's harness reported (only the harness writes these; the candidate's own
    /// words are kept apart in each report's `candidate_text`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub harness: Vec<HarnessReport>,
    /// Why the agent's own work broke scoring (reward 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_failure: Option<String>,
    /// The final-answer comparison.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<answer::AnswerCheck>,
    /// What an external scorer printed (arbitrary JSON from the user's program).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scorer: Option<serde_json::Value>,
    /// Why an external scorer failed on the agent's output (reward 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scorer_error: Option<String>,
    /// The seed the scoring VM's checkers got (`FARM_SEED` there): drawn afresh for every
    /// scoring run, never seen by the rollout, and recorded here to reproduce the check.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scoring_seed: Option<u64>,
    /// In a scoring VM that serves many checks (`[scoring] isolation = "sandbox"`), which
    /// of its checks this was (1: the VM was fresh).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scoring_vm_check: Option<u32>,
    /// Every key of a Harbor verifier's `reward.json`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub harbor_rewards: Option<std::collections::BTreeMap<String, f64>>,
    /// Harbor's logs and artifacts, as collected: where they are in the run folder, each
    /// file's size and the bytes kept, and what was left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub harbor_logs: Option<harbor::LogsRecord>,
}

impl Details {
    pub fn basis(basis: impl Into<String>) -> Details {
        Details {
            basis: basis.into(),
            ..Details::default()
        }
    }
}

/// Why a rollout's verdict is what it is, when that is a failure the row should name: the
/// row's `error` text comes from here, and only from here.
impl Verdict {
    /// The row's error for this verdict: the agent's failure, or the harness's reports (its
    /// own words first; whatever the candidate said is quoted as the candidate's).
    pub fn error(&self) -> Option<String> {
        if let Some(reason) = &self.details.agent_failure {
            return Some(reason.clone());
        }
        if let Some(error) = &self.details.scorer_error {
            return Some(format!("external scorer: {error}"));
        }
        if let Some(unread) = self
            .details
            .tests
            .as_ref()
            .and_then(|t| t.junit_unread.as_ref())
            .filter(|_| self.reward == 0.0)
        {
            return Some(unread.clone());
        }
        let reports: Vec<String> = self
            .details
            .harness
            .iter()
            .filter(|r| r.kind != HarnessKind::Summary)
            .map(HarnessReport::describe)
            .collect();
        (!reports.is_empty()).then(|| reports.join("; "))
    }
}
