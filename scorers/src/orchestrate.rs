//! Scoring one rollout, start to end: which VM the tests run in, the tests or the answer
//! check, then the external scorer. `farm run` and `farm serve` both score through
//! [`score`], so a rollout is graded the same way whichever front-end ran it.

use std::future::Future;
use std::time::Duration;

use datasets::Task;
use serde::{Deserialize, Serialize};
use snapshotter::Fork;

use crate::{Artifacts, ScoringError, Verdict};

/// Where a rollout's tests run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ScoringMode {
    /// Tests run in a fresh fork of the pristine task snapshot that receives the artifacts.
    #[default]
    FreshFork,
    /// Tests run in the rollout's own VM after every process the agent left is killed.
    FinalState,
}

/// How to score: the suite's `[scoring]` settings.
#[derive(Debug, Clone)]
pub struct Plan {
    pub mode: ScoringMode,
    pub timeout: Duration,
    pub call_timeout: Duration,
    pub pass_threshold: f64,
    /// An external scorer's argv (empty: none).
    pub external: Vec<String>,
}

/// Scores a rollout where the agent cannot reach. `Err` is an environment error (the
/// farm's failure, never the agent's), as text.
///
/// `rollout_fork` is the rollout's VM (None for a replay that needed none); final-state
/// scoring requires it. `fresh_fork` makes a fork of the task's pristine state, for
/// fresh-fork scoring.
pub async fn score<F, Fut>(plan: &Plan, task: &Task, rollout_fork: Option<Fork>, artifacts: &Artifacts, fresh_fork: F) -> Result<Verdict, String>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<Fork, String>>,
{
    let mut outcome = None;
    let mut verdict = if task.has_tests() {
        let scoring_fork = match plan.mode {
            ScoringMode::FreshFork => {
                drop(rollout_fork);
                fresh_fork().await.map_err(|e| format!("forking the scoring VM: {e}"))?
            }
            ScoringMode::FinalState => {
                let Some(rollout_fork) = rollout_fork else { return Err("final-state scoring needs the rollout's VM".into()) };
                // Every process the agent left is killed by the guest agent itself (no shell
                // or binary of the rollout's takes part), then the tests folder it may have
                // planted files in is removed, then the tests go into the same VM. The agent
                // had this VM (as root, by default): whatever keeps it from taking the tests
                // is the agent's doing, never an environment error it could hide behind.
                let agent = rollout_fork.agent();
                let cleared = match agent.sweep(Vec::new()).await {
                    Ok((_, true)) => agent.remove_tree(datasets::TESTS_DIR).await.map(|_| ()).map_err(|e| format!("clearing the tests folder: {e}")),
                    Ok((_, false)) => Err("processes the rollout left survived every attempt to kill them".to_string()),
                    Err(e) => Err(format!("killing the rollout's processes: {e}")),
                };
                if let Err(reason) = cleared {
                    return Ok(agent_failure(format!("the rollout's VM could not be made ready for its tests: {reason}")));
                }
                rollout_fork
            }
        };
        let scored_artifacts = if plan.mode == ScoringMode::FinalState { Artifacts::default() } else { artifacts.clone() };
        let options = crate::hidden::TestRunOptions { timeout: plan.timeout, call_timeout: plan.call_timeout, final_state: plan.mode == ScoringMode::FinalState };
        match crate::run_tests(scoring_fork.agent(), task, &scored_artifacts, &options).await {
            Ok(result) => {
                let v = crate::hidden::decide(&result, plan.pass_threshold, task.require_reward_file);
                outcome = Some(result);
                v
            }
            Err(ScoringError::Environment(e)) => return Err(scoring_fork.explain(&e)),
            Err(ScoringError::Agent(reason)) => {
                let reason = match scoring_fork.machine.limit_violation() {
                    Some(limit) => format!("{reason} ({limit})"),
                    None => reason,
                };
                agent_failure(reason)
            }
        }
    } else if let Some(expected) = &task.expected_answer {
        drop(rollout_fork);
        crate::answer::score_answer(expected, artifacts.answer.as_deref(), &task.answer_match)
    } else {
        drop(rollout_fork);
        Verdict { reward: 0.0, passed: false, timed_out: false, details: serde_json::json!({}) }
    };
    // A rollout whose work broke scoring has its verdict (reward 0); there is nothing for an
    // external scorer to grade, and its failing on the missing outcome must not turn the
    // agent's doing into an environment error.
    let broke_scoring = verdict.details.get("agent_failure").is_some();
    if !plan.external.is_empty() && !broke_scoring {
        let input = serde_json::json!({
            "task_id": task.id,
            "metadata": task.metadata,
            "expected_answer": task.expected_answer,
            "answer": artifacts.answer,
            "artifacts": artifacts,
            "tests": outcome,
            "verdict": verdict,
        });
        let timed_out = verdict.timed_out;
        verdict = crate::external::run(&plan.external, &input, plan.timeout, plan.pass_threshold).await.map_err(|e| e.to_string())?;
        if timed_out {
            // The tests ran out of time: the external scorer may grade, but cannot pass it.
            verdict.timed_out = true;
            verdict.passed = false;
        }
    }
    Ok(verdict)
}

/// The verdict of a rollout whose own work broke scoring: reward 0, with the reason.
pub fn agent_failure(reason: String) -> Verdict {
    Verdict {
        reward: 0.0,
        passed: false,
        timed_out: false,
        details: serde_json::json!({ "basis": "the agent's work broke scoring", "agent_failure": reason }),
    }
}
