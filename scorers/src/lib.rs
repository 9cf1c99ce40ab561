//! Protected scoring. Everything a rollout leaves behind is untrusted data: the artifacts
//! (files changed under the workspace, read out with size limits and sanitised paths) and
//! the final answer. Scoring happens where the agent cannot reach: answers are matched on
//! the host ([`answer`]); tests run in a fresh fork of the pristine task snapshot that
//! receives the artifacts first and the hidden tests only after ([`hidden`]); the host reads
//! the exit code, a JUnit report and a reward file at a random path handed to the tests (a
//! harness should take it out of the environment before it runs the agent's code, as the
//! shipped ones do);
//! an external program on the host may decide instead ([`external`]).
#![forbid(unsafe_code)]

pub mod answer;
pub mod artifacts;
pub mod external;
pub mod hidden;
pub mod orchestrate;
pub mod zygote;

pub use artifacts::{collect_artifacts, Artifacts, ArtifactLimits};
pub use hidden::{run_tests, ScoringError, TestOutcome};
pub use orchestrate::{agent_failure, ScoringMode};

/// The decision about one rollout.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Verdict {
    /// In [0, 1].
    pub reward: f64,
    pub passed: bool,
    pub timed_out: bool,
    /// What the decision rests on (exit code, test counts, reward file, answer comparison).
    pub details: serde_json::Value,
}
