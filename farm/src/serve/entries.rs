//! What the service keeps of each rollout it admitted ([`Entry`], in its [`Phase`]) and of
//! each live session ([`Session`]); the service's state holds them, the request handlers
//! change them.

use serde::Serialize;

use super::requests::Admitted;

/// Where a rollout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Queued,
    Running,
    /// A live session (its row comes when it is submitted).
    Session,
    Done,
}

#[derive(Debug, Clone)]
pub(super) struct Entry {
    /// The session, for a session's rollout.
    pub session: Option<String>,
    pub group_id: String,
    pub policy_version: Option<u64>,
    pub phase: Phase,
    /// The row's cursor once done.
    pub cursor: Option<usize>,
    /// Its row is being recorded: the first row wins (a cancelled rollout may finish).
    pub recording: bool,
}

impl Entry {
    pub fn new(admitted: &Admitted, session: Option<String>, phase: Phase) -> Entry {
        Entry {
            session,
            group_id: admitted.group_id.clone(),
            policy_version: admitted.policy_version,
            phase,
            cursor: None,
            recording: false,
        }
    }
}

/// A session as the service holds it: the engine's [`engine::session::Session`] and what
/// only the service knows of it (its id, its suite, the inline task it was opened with).
pub struct Session {
    pub(super) id: String,
    pub(super) suite: String,
    /// The inline task it was opened with (to take it up again after a restart).
    pub(super) task_row: Option<serde_json::Value>,
    pub(super) run: engine::session::Session,
}

impl Session {
    /// What a restart needs to know of it.
    pub(super) fn admitted(&self) -> Admitted {
        let served = self.run.served();
        Admitted {
            rollout_id: served.rollout_id.clone(),
            group_id: served.group_id.clone(),
            suite: self.suite.clone(),
            task_id: self.run.task().id.clone(),
            sample: 0,
            seed: self.run.seed(),
            policy_version: served.policy_version,
            policy_name: "session".into(),
            metadata: served.metadata.clone(),
        }
    }
}
