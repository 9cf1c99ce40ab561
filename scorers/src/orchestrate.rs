//! Scoring one rollout, start to end: which VM the tests run in, the tests or the answer
//! check, then the external scorer. `farm run` and `farm serve` both score through
//! [`score`], so a rollout is graded the same way whichever front-end ran it.

use std::future::Future;
use std::time::Duration;

use datasets::Task;
use serde::{Deserialize, Serialize};
use snapshotter::Fork;

use crate::external::{self, Blame};
use crate::{Artifacts, Details, ScoringError, TrustLevel, Verdict};

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

/// How far apart checks in fresh forks are kept (`[scoring] isolation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ScoringIsolation {
    /// Every rollout's check in a fresh fork of the pristine snapshot, alone.
    #[default]
    Vm,
    /// Checks through farm's harness (function-call and unit-test tasks) share scoring VMs:
    /// a VM serves up to `checks_per_vm` checks one after another, each with a fresh
    /// candidate process in a private view of the file system, and between two checks the
    /// guest agent removes every process, file, IPC object and message queue the last one
    /// could leave. Under TCG this skips most of a check's cost (a new QEMU process
    /// translates every guest code path anew); the verdicts are trusted as `shared` from a
    /// VM's second check on. Other tasks keep fresh forks.
    Sandbox,
}

/// Text that is not a scoring isolation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a scoring isolation (vm, sandbox)")]
pub struct NotAnIsolation(pub String);

impl std::str::FromStr for ScoringIsolation {
    type Err = NotAnIsolation;
    fn from_str(s: &str) -> Result<ScoringIsolation, NotAnIsolation> {
        match s {
            "vm" => Ok(ScoringIsolation::Vm),
            "sandbox" => Ok(ScoringIsolation::Sandbox),
            other => Err(NotAnIsolation(other.to_string())),
        }
    }
}

/// How to score: the suite's `[scoring]` settings.
#[derive(Debug, Clone)]
pub struct Plan {
    pub mode: ScoringMode,
    pub isolation: ScoringIsolation,
    /// Checks one scoring VM serves at most (sandbox isolation).
    pub checks_per_vm: u32,
    pub timeout: Duration,
    pub call_timeout: Duration,
    pub pass_threshold: f64,
    /// An external scorer's argv (empty: none).
    pub external: Vec<String>,
}

impl Plan {
    /// Whether this task's checks may share scoring VMs.
    pub fn shares_vms(&self, task: &Task) -> bool {
        self.isolation == ScoringIsolation::Sandbox
            && self.mode == ScoringMode::FreshFork
            && self.checks_per_vm > 1
            && task.harness.is_some()
    }
}

/// The VM a rollout's tests run in, as the caller of [`score`] provides it.
pub struct ScoringVm {
    pub fork: Fork,
    /// For a VM that serves more checks: how many it ran before this one.
    pub shared: Option<u32>,
}

/// A scoring VM after its check (a fresh-fork check's, or the rollout's own VM after a
/// final-state check), for the caller to keep, reset or drop.
pub struct UsedVm {
    pub fork: Fork,
    /// It serves more checks (sandbox isolation): [`ScoringVm::shared`] was set.
    pub shared: bool,
    /// Checks it has run, this one included.
    pub checks: u32,
    /// A shared VM is ready for another check (the guest agent reset it).
    pub ready: bool,
}

/// A verdict, and the scoring VM it came from (for the caller to keep, reset or drop).
pub struct Scored {
    pub verdict: Verdict,
    pub vm: Option<UsedVm>,
}

/// Why a rollout could not be scored: the farm's failure (an `env_error`), never the
/// agent's.
#[derive(Debug, thiserror::Error)]
pub enum ScoreError {
    #[error("forking the scoring VM: {0}")]
    Fork(String),
    #[error("final-state scoring needs the rollout's VM")]
    NoRolloutVm,
    /// The scoring VM failed before any of the agent's bytes reached it.
    #[error("{0}")]
    ScoringVm(String),
    /// The external scorer failed in a way that is its own (it said so, it could not start,
    /// or it ran out of time on a small input).
    #[error("external scorer")]
    External(#[source] external::ExternalError),
}

/// A seed for the checkers of one scoring run: drawn afresh from the host's entropy, so
/// nothing the rollout saw (its own `FARM_SEED`, farm's source) predicts it.
pub fn scoring_seed() -> u64 {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    let _ = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    u64::from_le_bytes(bytes)
}

/// Scores a rollout where the agent cannot reach.
///
/// `rollout_fork` is the rollout's VM (None for a replay that needed none); final-state
/// scoring requires it. `scoring_vm` gives a VM with the task's pristine state and the given
/// seed, for fresh-fork scoring: a fresh fork, or (sandbox isolation) one that serves more
/// checks, handed back in [`Scored::vm`].
pub async fn score<F, Fut, E>(
    plan: &Plan,
    task: &Task,
    rollout_fork: Option<Fork>,
    artifacts: &Artifacts,
    scoring_vm: F,
) -> Result<Scored, ScoreError>
where
    F: FnOnce(u64) -> Fut,
    Fut: Future<Output = Result<ScoringVm, E>>,
    E: std::fmt::Display,
{
    let seed = scoring_seed();
    let mut used = None;
    let mut verdict = if task.has_tests() {
        let vm = match plan.mode {
            ScoringMode::FreshFork => {
                drop(rollout_fork);
                scoring_vm(seed).await.map_err(|e| ScoreError::Fork(e.to_string()))?
            }
            ScoringMode::FinalState => match clear_for_tests(plan, task, rollout_fork).await? {
                Ok(fork) => ScoringVm { fork, shared: None },
                Err(failed) => {
                    return Ok(Scored {
                        verdict: failed,
                        vm: None,
                    })
                }
            },
        };
        let (verdict, ready) = tests_verdict(plan, task, &vm, artifacts, seed).await?;
        used = Some(UsedVm {
            fork: vm.fork,
            shared: vm.shared.is_some(),
            checks: vm.shared.map_or(1, |before| before + 1),
            ready,
        });
        verdict
    } else if let Some(expected) = &task.expected_answer {
        drop(rollout_fork);
        crate::answer::score_answer(expected, artifacts.answer.as_deref(), &task.answer_match)
    } else {
        drop(rollout_fork);
        Verdict {
            reward: 0.0,
            passed: false,
            timed_out: false,
            trust: TrustLevel::ANSWER,
            details: Details::basis("the task has neither tests nor an expected answer"),
        }
    };
    verdict.details.scoring_seed = Some(seed);
    verdict.details.scoring_vm_check = used.as_ref().filter(|u| u.shared).map(|u| u.checks);
    // A rollout whose work broke scoring has its verdict (reward 0); there is nothing for an
    // external scorer to grade, and its failing on the missing outcome must not turn the
    // agent's doing into an environment error.
    if !plan.external.is_empty() && verdict.details.agent_failure.is_none() {
        verdict = external_verdict(plan, task, artifacts, verdict).await?;
    }
    Ok(Scored { verdict, vm: used })
}

/// The rollout's own VM made ready for its tests (final-state scoring), or the agent's
/// failure when it could not be.
///
/// Every process the agent left is killed by the guest agent itself (no shell or binary of
/// the rollout's takes part), then the tests folder it may have planted files in is removed,
/// then the tests go into the same VM. The agent had this VM (as root, by default): whatever
/// keeps it from taking the tests is the agent's doing, never an environment error it could
/// hide behind.
async fn clear_for_tests(
    plan: &Plan,
    task: &Task,
    rollout_fork: Option<Fork>,
) -> Result<Result<Fork, Verdict>, ScoreError> {
    let Some(rollout_fork) = rollout_fork else {
        return Err(ScoreError::NoRolloutVm);
    };
    let agent = rollout_fork.agent();
    let cleared = match agent.sweep(Vec::new()).await {
        Ok((_, true)) => agent
            .remove_tree(datasets::TESTS_DIR)
            .await
            .map(|_| ())
            .map_err(|e| format!("clearing the tests folder: {e}")),
        Ok((_, false)) => Err("processes the rollout left survived every attempt to kill them".to_string()),
        Err(e) => Err(format!("killing the rollout's processes: {e}")),
    };
    match cleared {
        Ok(()) => Ok(Ok(rollout_fork)),
        Err(reason) => Ok(Err(agent_failure(
            format!("the rollout's VM could not be made ready for its tests: {reason}"),
            TrustLevel::of_tests(task, plan.mode),
        ))),
    }
}

/// The verdict of the task's tests run in the scoring VM, and whether a shared VM is ready
/// for its next check.
async fn tests_verdict(
    plan: &Plan,
    task: &Task,
    vm: &ScoringVm,
    artifacts: &Artifacts,
    seed: u64,
) -> Result<(Verdict, bool), ScoreError> {
    let scored_artifacts = if plan.mode == ScoringMode::FinalState {
        Artifacts::default()
    } else {
        artifacts.clone()
    };
    let options = crate::hidden::TestRunOptions {
        timeout: plan.timeout,
        call_timeout: plan.call_timeout,
        final_state: plan.mode == ScoringMode::FinalState,
        seed,
        shared: vm.shared.is_some(),
    };
    let trust = match vm.shared {
        // Other rollouts' checks ran in this VM before.
        Some(before) if before > 0 => TrustLevel::shared(TrustLevel::of_tests(task, plan.mode)),
        _ => TrustLevel::of_tests(task, plan.mode),
    };
    let fork = &vm.fork;
    Ok(
        match crate::run_tests(fork.agent(), task, &scored_artifacts, &options).await {
            Ok(result) => {
                let ready = result.reset.as_ref().is_some_and(|r| r.ready);
                let verdict = crate::hidden::decide(result, plan.pass_threshold, task.require_reward_file, trust);
                (verdict, ready)
            }
            Err(ScoringError::Environment(e)) => return Err(ScoreError::ScoringVm(fork.explain(&e))),
            Err(ScoringError::Sandbox(reason)) => return Err(ScoreError::ScoringVm(reason)),
            Err(ScoringError::Agent(reason)) => {
                let reason = match fork.machine.limit_violation() {
                    Some(limit) => format!("{reason} ({limit})"),
                    None => reason,
                };
                (agent_failure(reason, trust), false)
            }
        },
    )
}

/// The external scorer's verdict over the rollout and the tests' outcome. Its failures on
/// the agent's output are a 0 with the error (see [`crate::external`]).
async fn external_verdict(
    plan: &Plan,
    task: &Task,
    artifacts: &Artifacts,
    inner: Verdict,
) -> Result<Verdict, ScoreError> {
    let input = serde_json::json!({
        "task_id": task.id,
        "metadata": task.metadata,
        "expected_answer": task.expected_answer,
        "answer": artifacts.answer,
        "artifacts": artifacts,
        "tests": inner.details.tests,
        "verdict": { "reward": inner.reward, "passed": inner.passed, "timed_out": inner.timed_out, "details": inner.details },
    });
    let agent_bytes = artifacts.answer.as_ref().map_or(0, |a| a.len() as u64)
        + artifacts
            .files
            .iter()
            .map(|(_, bytes, _)| bytes.len() as u64)
            .sum::<u64>();
    let trust = TrustLevel::of_external(inner.trust);
    let details = Details {
        tests: inner.details.tests.clone(),
        harness: inner.details.harness.clone(),
        scoring_seed: inner.details.scoring_seed,
        ..Details::default()
    };
    let timed_out = inner.timed_out;
    match external::run(&plan.external, &input, plan.timeout).await {
        Ok(out) => Ok(Verdict {
            reward: out.reward,
            // The tests ran out of time: the external scorer may grade, but cannot pass it.
            passed: !timed_out && out.reward >= plan.pass_threshold,
            timed_out,
            trust,
            details: Details {
                basis: "external scorer".into(),
                scorer: Some(out.printed),
                ..details
            },
        }),
        Err(e) => match e.blame(agent_bytes) {
            Blame::Environment => Err(ScoreError::External(e)),
            Blame::Agent => Ok(Verdict {
                reward: 0.0,
                passed: false,
                timed_out,
                trust,
                details: Details {
                    basis: "the external scorer failed on the agent's output".into(),
                    scorer_error: Some(e.to_string()),
                    ..details
                },
            }),
        },
    }
}

/// The verdict of a rollout whose own work broke scoring: reward 0, with the reason.
pub fn agent_failure(reason: String, trust: TrustLevel) -> Verdict {
    Verdict {
        reward: 0.0,
        passed: false,
        timed_out: false,
        trust,
        details: Details {
            agent_failure: Some(reason),
            ..Details::basis("the agent's work broke scoring")
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer_task(expected: &str) -> Task {
        let row = serde_json::json!({ "id": "capital", "instruction": "the capital?", "expected_answer": expected });
        datasets::task_from_json(row).unwrap()
    }

    fn plan(external: &[&str]) -> Plan {
        Plan {
            mode: ScoringMode::FreshFork,
            isolation: ScoringIsolation::Vm,
            checks_per_vm: 1,
            timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(5),
            pass_threshold: 1.0,
            external: external.iter().map(|s| s.to_string()).collect(),
        }
    }

    async fn scored(plan: &Plan, answer: Option<&str>) -> Result<Verdict, ScoreError> {
        let artifacts = Artifacts {
            answer: answer.map(String::from),
            ..Artifacts::default()
        };
        // An answer task never needs a scoring VM.
        let no_vm = |_seed: u64| async { Err::<ScoringVm, _>("no scoring VM for an answer") };
        score(plan, &answer_task("Paris"), None, &artifacts, no_vm)
            .await
            .map(|scored| scored.verdict)
    }

    #[tokio::test]
    async fn answers_are_scored_on_the_host_with_a_fresh_seed_and_a_sound_verdict() {
        let right = scored(&plan(&[]), Some(" Paris\n")).await.unwrap();
        assert!(right.passed && right.trust == TrustLevel::ANSWER);
        let wrong = scored(&plan(&[]), Some("Lyon")).await.unwrap();
        assert!(!wrong.passed && wrong.reward == 0.0);
        let (a, b) = (right.details.scoring_seed.unwrap(), wrong.details.scoring_seed.unwrap());
        assert_ne!(a, b, "every scoring run draws its own seed");
        let none = scored(&plan(&[]), None).await.unwrap();
        assert_eq!(none.details.answer.unwrap().rule, "no answer submitted");
    }

    #[tokio::test]
    async fn the_external_scorer_decides_and_its_failures_on_the_agents_output_are_a_zero() {
        let script = "import json, sys\nrun = json.load(sys.stdin)\nif run['answer'] == 'own':\n    sys.exit(75)\nprint(json.dumps({'reward': 0.5 if json.loads(run['answer']) == 1 else 0.0}))\n";
        let external = plan(&["python3", "-c", script]);
        let graded = scored(&external, Some("1")).await.unwrap();
        assert_eq!((graded.reward, graded.details.basis.as_str()), (0.5, "external scorer"));
        assert_eq!(
            graded.trust.level,
            crate::Trust::Sound,
            "over an answer compared on the host"
        );
        let crashed = scored(&external, Some("maybe 41?")).await.unwrap();
        assert_eq!(crashed.reward, 0.0);
        assert!(crashed.error().unwrap().starts_with("external scorer:"), "{crashed:?}");
        assert!(
            matches!(scored(&external, Some("own")).await, Err(ScoreError::External(_))),
            "exit 75: the scorer's own failure"
        );
    }
}
