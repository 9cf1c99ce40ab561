//! How a rollout ended, and whose doing it was: [`End`], and the one place that turns an
//! ending into a row's status, reward and error ([`End::settle`]).

use crate::row::{Row, Status};

/// Whether a rollout's environment error is worth another attempt. Not when the policy has
/// no actions for it (it will not have them on a retry either), and not once any action of
/// the agent ran: a retry would then give a live policy a fresh sample, and an agent that
/// could turn its own failures into environment errors would get extra tries that no row
/// records. Such a row stays an `env_error`, visible in the counts.
pub(crate) fn worth_retrying(end: &End, steps: usize) -> bool {
    end.retryable() && steps == 0
}

/// How a rollout ended, and whose doing it was. [`End::settle`] is the one place that turns
/// an ending into the row's status, reward and error.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// The tests (or the answer check) gave a verdict, already in the row.
    Scored,
    // The farm's failures: `env_error`, no reward.
    /// The task's snapshot could not be prepared (a retry would not make it).
    NoSnapshot(String),
    /// The policy has no actions for this rollout (nor will it on a retry).
    NoActions(String),
    /// The VM could not be forked.
    Fork(String),
    /// The forked VM could not be set up for the rollout.
    Setup(String),
    /// The policy's endpoint failed (not the model's answer).
    PolicyEndpoint(String),
    /// Scoring failed for reasons of the farm's.
    Scoring(String),
    /// farm itself failed (a panic in the rollout's task).
    Internal(String),
    /// Cancelled before it finished (by a caller, or a shutdown); the reason says which.
    Cancelled(String),
    /// Queued or running when the service died; found on restart.
    LostInRestart,
    // The agent's doing: `timeout` or `failed`, reward 0.
    /// The agent's actions ran past `rollouts.timeout_secs`.
    Timeout(u64),
    /// The endpoint refused the conversation itself (e.g. past the model's context).
    PolicyRefused(String),
    /// An action of the agent's took its VM down.
    AgentBrokeVm(String),
    /// The rollout VM did not hand over its artifacts after the agent's actions.
    NoArtifacts(String),
}

impl End {
    /// The status this ending gives (None: the verdict decided).
    fn status(&self) -> Option<Status> {
        match self {
            End::Scored => None,
            End::NoSnapshot(_)
            | End::NoActions(_)
            | End::Fork(_)
            | End::Setup(_)
            | End::PolicyEndpoint(_)
            | End::Scoring(_)
            | End::Internal(_)
            | End::Cancelled(_)
            | End::LostInRestart => Some(Status::EnvError),
            End::Timeout(_) => Some(Status::Timeout),
            End::PolicyRefused(_) | End::AgentBrokeVm(_) | End::NoArtifacts(_) => Some(Status::Failed),
        }
    }

    /// The error text of the row.
    pub fn error(&self) -> Option<String> {
        Some(match self {
            End::Scored => return None,
            End::NoSnapshot(e) | End::Setup(e) | End::AgentBrokeVm(e) => e.clone(),
            End::NoActions(e) | End::PolicyRefused(e) => format!("policy: {e}"),
            End::Fork(e) => format!("fork: {e}"),
            End::PolicyEndpoint(e) => format!("policy endpoint: {e}"),
            End::Scoring(e) => format!("scoring: {e}"),
            End::Internal(e) => format!("the rollout failed inside farm: {e}"),
            End::Cancelled(why) => format!("cancelled: {why}"),
            End::LostInRestart => "lost in restart".into(),
            End::Timeout(secs) => format!("the rollout ran past its {secs} s limit"),
            End::NoArtifacts(e) => {
                format!("the rollout VM did not hand over its artifacts after the agent's actions: {e}")
            }
        })
    }

    /// Whether another attempt could end differently: a failure of the farm's that a fresh
    /// fork may not meet again (not a missing snapshot or missing replay data, never the
    /// agent's doing).
    fn retryable(&self) -> bool {
        matches!(
            self,
            End::Fork(_) | End::Setup(_) | End::PolicyEndpoint(_) | End::Scoring(_)
        )
    }

    /// Puts the ending into the row: status, reward (none for the farm's failures, 0 for the
    /// agent's) and error.
    pub fn settle(&self, row: &mut Row) {
        if let Some(status) = self.status() {
            row.status = status;
            row.reward = (status != Status::EnvError).then_some(0.0);
            // The agent's failure without a verdict is farm's own observation, on the host.
            if status != Status::EnvError {
                row.trust = Some(scorers::Trust::Sound);
                row.trust_reason = Some(AGENT_ENDED_IT.into());
            }
        }
        if let Some(error) = self.error() {
            row.error = Some(error);
        }
    }
}

/// Why a row that the agent's doing ended before any verdict is `sound`.
pub(crate) const AGENT_ENDED_IT: &str =
    "no verdict was needed: farm saw on the host that the agent's doing ended the rollout \
     (a timeout, a VM it broke, artifacts it did not hand over, a conversation the endpoint refused), and no code of \
     the agent's can turn that 0 into a pass";

/// What ended a rollout's actions before scoring.
pub(crate) enum Ending {
    /// Actions done (or the answer submitted).
    Done,
    /// The wall-clock limit passed.
    Timeout,
    /// The VM died or stopped answering during an action of the agent.
    AgentBrokeVm(String),
    /// The policy could not produce an action (its endpoint failed).
    PolicyFailed(String),
    /// The endpoint refused the conversation itself (e.g. past the model's context length):
    /// the model's failure.
    PolicyRefused(String),
}

impl From<crate::policy::openai::ChatError> for Ending {
    fn from(error: crate::policy::openai::ChatError) -> Ending {
        match error {
            crate::policy::openai::ChatError::Refused(refused) => Ending::PolicyRefused(refused.0),
            crate::policy::openai::ChatError::Endpoint(reason) => Ending::PolicyFailed(reason),
        }
    }
}

/// Puts a verdict into the row; or says why scoring failed.
pub(crate) fn record_verdict(
    row: &mut Row,
    verdict: Result<scorers::Verdict, scorers::orchestrate::ScoreError>,
    artifacts: &scorers::Artifacts,
) -> End {
    match verdict {
        Ok(v) => {
            row.error = v.error();
            row.reward = Some(v.reward);
            row.status = if v.timed_out {
                Status::Timeout
            } else if v.passed {
                Status::Passed
            } else {
                Status::Failed
            };
            row.trust = Some(v.trust.level);
            row.trust_reason = Some(v.trust.reason.to_string());
            #[derive(serde::Serialize)]
            struct Recorded<'a> {
                #[serde(flatten)]
                details: &'a scorers::Details,
                artifacts: &'a scorers::Artifacts,
            }
            row.score_details = serde_json::to_string(&Recorded {
                details: &v.details,
                artifacts,
            })
            .unwrap_or_else(|_| "{}".into());
            End::Scored
        }
        Err(e) => End::Scoring(crate::engine::describe(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::{Step, StepKind};

    fn row(status: &str, error: Option<&str>, steps: usize) -> Row {
        let step = Step {
            exit_code: Some(0),
            ..Step::new(0, StepKind::Exec, "true")
        };
        Row {
            run_id: "r".into(),
            suite_name: "s".into(),
            policy_name: "replay".into(),
            steps: vec![step; steps],
            status: status.parse().unwrap(),
            error: error.map(String::from),
            farm_version: "0".into(),
            ..Row::blank("t", 0, 0)
        }
    }

    #[test]
    fn only_environment_errors_before_any_action_are_retried() {
        assert!(worth_retrying(&End::Fork("QEMU exited".into()), 0));
        assert!(worth_retrying(&End::PolicyEndpoint("503".into()), 0));
        // Once the agent acted, a retry would be a fresh sample for a live policy.
        assert!(!worth_retrying(&End::Scoring("the scoring VM failed".into()), 2));
        assert!(!worth_retrying(
            &End::NoActions("no completion for this task".into()),
            0
        ));
        assert!(!worth_retrying(
            &End::NoSnapshot("preparing the task snapshot failed".into()),
            0
        ));
        assert!(!worth_retrying(&End::Internal("panicked".into()), 0));
        for agents in [
            End::Scored,
            End::Timeout(600),
            End::PolicyRefused("too long".into()),
            End::AgentBrokeVm("x".into()),
            End::NoArtifacts("x".into()),
        ] {
            assert!(!worth_retrying(&agents, 0), "{agents:?}");
        }
    }

    #[test]
    fn an_ending_decides_status_reward_and_error_in_one_place() {
        let settled = |end: End| {
            let mut r = row("env_error", None, 0);
            r.reward = None;
            end.settle(&mut r);
            (r.status, r.reward, r.error)
        };
        // The farm's failures: no reward, never a zero a trainer could take for a failure.
        assert_eq!(
            settled(End::Fork("QEMU exited".into())),
            (Status::EnvError, None, Some("fork: QEMU exited".into()))
        );
        assert_eq!(
            settled(End::NoActions("no completion".into())),
            (Status::EnvError, None, Some("policy: no completion".into()))
        );
        assert_eq!(settled(End::Scoring("boom".into())).1, None);
        // The agent's: a zero.
        assert_eq!(
            settled(End::Timeout(600)),
            (
                Status::Timeout,
                Some(0.0),
                Some("the rollout ran past its 600 s limit".into())
            )
        );
        assert_eq!(
            settled(End::PolicyRefused("too long".into())),
            (Status::Failed, Some(0.0), Some("policy: too long".into()))
        );
        assert_eq!(settled(End::AgentBrokeVm("the VM died".into())).0, Status::Failed);
        // Every row with a reward has a trust level; an environment error has neither.
        for (end, trust) in [
            (End::AgentBrokeVm("x".into()), Some(scorers::Trust::Sound)),
            (End::Timeout(1), Some(scorers::Trust::Sound)),
            (End::NoArtifacts("x".into()), Some(scorers::Trust::Sound)),
            (End::Scoring("x".into()), None),
        ] {
            let mut r = row("env_error", None, 0);
            end.settle(&mut r);
            assert_eq!(r.trust, trust, "{end:?}");
        }
        // A verdict stays as scoring put it.
        let mut r = row("passed", None, 1);
        r.reward = Some(1.0);
        End::Scored.settle(&mut r);
        assert_eq!((r.status, r.reward, r.error), (Status::Passed, Some(1.0), None));
    }
}
