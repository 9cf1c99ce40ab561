//! How far a verdict can be trusted.
//!
//! `sound`: the agent's code could not reach the verdict. Its code ran (if at all) in
//! processes of its own behind a boundary that passes only data, and the checker decided:
//! the function-call harness, unit tests through the boundary, a checker that runs the
//! agent's code only through `farm-sandbox` (`test_user = "checker"` or `"root"`), an answer
//! compared on the host. A scoring VM reset in place to the task's snapshot (`[rollouts]
//! reuse`: the rollout's own VM or an earlier check's, put back exactly from outside the
//! guest) is the snapshot again, as a new fork is: its checks stay `sound`.
//!
//! `shared`: as `sound`, in a scoring VM that had served other rollouts' checks before
//! (`[scoring] isolation = "sandbox"`): each check had a fresh candidate process in a private
//! view of the file system, and the VM was reset between checks; what could still reach the
//! verdict is state of an earlier rollout's that outlived every reset.
//!
//! `hardened`: the agent's code ran where it could touch the verdict, and farm only made that
//! place hard to abuse: a test command run as the candidate (pytest importing the agent's
//! module in its own process: an `os._exit(0)` on import passes), or final-state scoring in
//! the rollout's own VM (which the agent controlled, as root by default).

use datasets::{Harness, Task, TestUser};
use serde::{Deserialize, Serialize};

use crate::ScoringMode;

/// Whether the agent's code could reach the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    /// It could not: the verdict rests on data its code produced behind a boundary.
    Sound,
    /// As sound, in a scoring VM that had run other rollouts' checks before (each with a
    /// fresh candidate process in a private view, the VM reset between checks): only state
    /// that outlived every reset could reach the verdict.
    Shared,
    /// It could: its code ran where the verdict is made; farm hardened that place.
    Hardened,
}

impl Trust {
    /// Every level, most trusted first.
    pub const ALL: [Trust; 3] = [Trust::Sound, Trust::Shared, Trust::Hardened];

    pub fn as_str(self) -> &'static str {
        match self {
            Trust::Sound => "sound",
            Trust::Shared => "shared",
            Trust::Hardened => "hardened",
        }
    }
}

impl std::fmt::Display for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Text that is not a trust level.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a trust level (sound, shared, hardened)")]
pub struct NotATrustLevel(pub String);

impl std::str::FromStr for Trust {
    type Err = NotATrustLevel;
    fn from_str(s: &str) -> Result<Trust, NotATrustLevel> {
        match s {
            "sound" => Ok(Trust::Sound),
            "shared" => Ok(Trust::Shared),
            "hardened" => Ok(Trust::Hardened),
            other => Err(NotATrustLevel(other.to_string())),
        }
    }
}

/// A trust level with the reason for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TrustLevel {
    pub level: Trust,
    pub reason: &'static str,
}

impl TrustLevel {
    /// The answer alone was compared, on the host.
    pub const ANSWER: TrustLevel = TrustLevel {
        level: Trust::Sound,
        reason: "the answer was compared on the host",
    };

    /// How far a verdict of this task's tests, scored in this mode, can be trusted.
    pub fn of_tests(task: &Task, mode: ScoringMode) -> TrustLevel {
        let sound = |reason| TrustLevel {
            level: Trust::Sound,
            reason,
        };
        let hardened = |reason| TrustLevel {
            level: Trust::Hardened,
            reason,
        };
        if mode == ScoringMode::FinalState {
            return hardened("final-state scoring: the tests ran in the rollout's own VM, which the agent controlled");
        }
        match (&task.harness, task.test_user) {
            (Some(Harness::FunctionCall { .. }), _) => {
                sound("function-call harness: the agent's code ran in its own process and only plain data crossed")
            }
            (Some(Harness::UnitTests { .. }), _) => {
                sound("unit tests through the boundary: the tests ran in the checker and only plain data crossed")
            }
            (None, TestUser::Checker) => {
                sound("checker (uid 999): the agent's code ran only through farm-sandbox, as another user")
            }
            (None, TestUser::Root) => {
                sound("checker (root): the agent's code ran only through farm-sandbox, as another user")
            }
            (None, TestUser::Candidate) => {
                hardened("test_user = candidate: the agent's code ran in the test command's own process")
            }
        }
    }

    /// A sound check in a scoring VM that had run other rollouts' checks before; a hardened
    /// one stays hardened.
    pub fn shared(inner: TrustLevel) -> TrustLevel {
        match inner.level {
            Trust::Sound | Trust::Shared => TrustLevel {
                level: Trust::Shared,
                reason: "farm's harness in a shared scoring VM: the agent's code ran in its own process in a private \
                         view and only plain data crossed; other rollouts' checks ran in this VM before, each \
                         removed with everything it left",
            },
            Trust::Hardened => inner,
        }
    }

    /// An external scorer decides on data the rollout and the tests produced: it is as
    /// trustworthy as that data.
    pub fn of_external(inner: TrustLevel) -> TrustLevel {
        match inner.level {
            Trust::Sound => TrustLevel {
                level: Trust::Sound,
                reason: "external scorer on the host, over data from a sound check",
            },
            Trust::Shared => TrustLevel {
                level: Trust::Shared,
                reason: "external scorer on the host, over data from a check in a shared scoring VM",
            },
            Trust::Hardened => TrustLevel {
                level: Trust::Hardened,
                reason: "external scorer on the host, over the outcome of a hardened check",
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(harness: Option<Harness>, test_user: TestUser) -> Task {
        Task {
            id: "t".into(),
            instruction: String::new(),
            files: Vec::new(),
            setup: Vec::new(),
            tests: Vec::new(),
            test_command: harness.is_none().then(|| "true".into()),
            test_user,
            harness,
            solution: None,
            expected_answer: None,
            answer_match: Default::default(),
            completion_file: None,
            completion_prefix: String::new(),
            require_reward_file: true,
            metadata: serde_json::Value::Null,
            harbor: None,
        }
    }

    fn call_again() -> Option<Harness> {
        Some(Harness::FunctionCall {
            module: "solution".into(),
            entry_point: "f".into(),
        })
    }

    #[test]
    fn each_way_of_scoring_has_its_trust_level() {
        let call = Some(Harness::FunctionCall {
            module: "solution".into(),
            entry_point: "f".into(),
        });
        let units = Some(Harness::UnitTests {
            modules: vec!["solution".into()],
        });
        let fresh = ScoringMode::FreshFork;
        assert_eq!(
            TrustLevel::of_tests(&task(call.clone(), TestUser::Root), fresh).level,
            Trust::Sound
        );
        assert_eq!(
            TrustLevel::of_tests(&task(units, TestUser::Root), fresh).level,
            Trust::Sound
        );
        assert_eq!(
            TrustLevel::of_tests(&task(None, TestUser::Checker), fresh).level,
            Trust::Sound
        );
        assert_eq!(
            TrustLevel::of_tests(&task(None, TestUser::Root), fresh).level,
            Trust::Sound
        );
        assert_eq!(
            TrustLevel::of_tests(&task(None, TestUser::Candidate), fresh).level,
            Trust::Hardened
        );
        // The rollout's own VM is never sound, whatever runs the tests there.
        assert_eq!(
            TrustLevel::of_tests(&task(call, TestUser::Root), ScoringMode::FinalState).level,
            Trust::Hardened
        );
        assert_eq!(
            TrustLevel::of_tests(&task(None, TestUser::Checker), ScoringMode::FinalState).level,
            Trust::Hardened
        );
        assert_eq!(TrustLevel::ANSWER.level, Trust::Sound);
        let hardened = TrustLevel::of_tests(&task(None, TestUser::Candidate), fresh);
        assert_eq!(TrustLevel::of_external(hardened).level, Trust::Hardened);
        assert_eq!(TrustLevel::of_external(TrustLevel::ANSWER).level, Trust::Sound);
        assert_eq!("hardened".parse::<Trust>().unwrap(), Trust::Hardened);
        let shared = TrustLevel::shared(TrustLevel::of_tests(&task(call_again(), TestUser::Root), fresh));
        assert_eq!((shared.level, shared.level.as_str()), (Trust::Shared, "shared"));
        assert_eq!("shared".parse::<Trust>().unwrap(), Trust::Shared);
        assert_eq!(TrustLevel::of_external(shared).level, Trust::Shared);
        assert_eq!(
            TrustLevel::shared(hardened).level,
            Trust::Hardened,
            "a hardened check stays hardened"
        );
        assert!(Trust::Sound < Trust::Shared && Trust::Shared < Trust::Hardened);
        assert!("maybe".parse::<Trust>().is_err());
    }
}
