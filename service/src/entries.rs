//! What the service keeps of each rollout it admitted ([`Entry`], in its [`Phase`]) and of
//! each live fork, session or sandbox ([`Open`]); the service's state holds them, the
//! request handlers change them.

use serde::Serialize;

use engine::session::TaskRun;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use engine::pause::PausedFork;
use engine::sandbox::SandboxSpec;

use super::requests::{Admitted, SandboxRequest};
use super::sandbox::environments::{Environment, Ready};

/// A rollout in the queue: when it was admitted, and for which tenant.
pub struct Queued {
    pub item: engine::Planned,
    pub since: std::time::Instant,
    pub tenant_name: String,
}

/// Where a rollout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Queued,
    Running,
    /// A live session (its row comes when it is submitted).
    Session,
    Done,
}

#[derive(Debug, Clone)]
pub struct Entry {
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

/// What the service keeps of a fork beside it in the book, read without waiting on the
/// fork's lock: whose it is and what it takes of that tenant's quotas. Set when the fork
/// enters the book (made, branched or taken up after a restart), and gone with it; the
/// tenants database keeps the owner for restarts and for forks that went.
#[derive(Debug, Clone)]
pub struct Card {
    pub owner: tenants::TenantId,
    /// Its guest memory as made, MiB.
    pub memory_mib: u64,
    /// A sandbox's environment.
    pub environment: Option<String>,
    /// A sandbox's open ports, each with the token that opens it (the port listener finds
    /// a token among the cards); they go with the entry.
    pub ports: BTreeMap<u16, String>,
}

/// A live fork as the service holds it in its one book (`Service::forks`): the engine's
/// [`engine::session::Session`] and what only the service knows of it, by front-end.
pub struct Open {
    pub id: String,
    pub run: engine::session::Session,
    pub facts: Facts,
}

/// What a front-end keeps of its forks.
pub enum Facts {
    /// A session: its suite, and the inline task it was opened with (to take it up again
    /// after a restart).
    Session {
        suite: String,
        task_row: Option<serde_json::Value>,
    },
    /// A sandbox: its settings and lineage.
    Sandbox(Box<SandboxFacts>),
}

impl Open {
    /// A session's suite. The book keeps kinds apart: a session's handlers only ever hold
    /// sessions.
    pub fn suite(&self) -> &str {
        match &self.facts {
            Facts::Session { suite, .. } => suite,
            Facts::Sandbox(_) => unreachable!("the book keeps sandboxes from the session handlers"),
        }
    }

    /// A session's task and progress (see [`Open::suite`]).
    pub fn task(&self) -> &TaskRun {
        self.run
            .task_run()
            .expect("the book keeps sandboxes from the session handlers")
    }

    /// A sandbox's facts (the book keeps sessions from the sandbox handlers).
    pub fn sandbox(&self) -> &SandboxFacts {
        match &self.facts {
            Facts::Sandbox(facts) => facts,
            Facts::Session { .. } => unreachable!("the book keeps sessions from the sandbox handlers"),
        }
    }

    pub fn sandbox_mut(&mut self) -> &mut SandboxFacts {
        match &mut self.facts {
            Facts::Sandbox(facts) => facts,
            Facts::Session { .. } => unreachable!("the book keeps sessions from the sandbox handlers"),
        }
    }

    /// What a restart needs to know of a session.
    pub fn admitted(&self) -> Admitted {
        let run = self.task();
        let served = run.served();
        Admitted {
            rollout_id: served.rollout_id.clone(),
            group_id: served.group_id.clone(),
            suite: self.suite().to_string(),
            task_id: run.task().id.clone(),
            sample: 0,
            seed: run.seed(),
            policy_version: served.policy_version,
            policy_name: "session".into(),
            metadata: served.metadata.clone(),
        }
    }
}

/// What the sandbox API keeps of a sandbox, beside its fork.
pub struct SandboxFacts {
    pub settings: Settings,
    pub created_ms: u64,
    /// The sandbox it was branched from.
    pub parent: Option<String>,
    /// Its last checkpoint (a pause is one), for a restart of the service.
    pub checkpoint: Option<Checkpoint>,
    /// What its VMs have used so far.
    pub spent: crate::sandbox::sandboxes::usage::Spent,
    /// Why its last resume's checks failed (it is paused, in `resume_failed`, until a resume
    /// passes them).
    pub resume_failed: Option<String>,
    /// Paused by its timeout (`on_timeout = "pause"`), at this time (Unix ms).
    pub auto_paused_ms: Option<u64>,
    /// The workspaces mounted in it.
    pub mounts: Vec<crate::workspaces::Mounted>,
    /// Taken up by a restart from a state older than a workspace's last sync (or from its
    /// environment again): its next resume writes these again as last synced.
    pub remount: Vec<crate::workspaces::Mounted>,
    /// When its current lifetime began (its creation, or its last resume from a timeout's
    /// pause), Unix ms.
    pub life_from_ms: u64,
}

impl SandboxFacts {
    pub fn new(settings: Settings, parent: Option<String>) -> SandboxFacts {
        settings
            .environment
            .sandboxes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        SandboxFacts {
            settings,
            created_ms: engine::row::now_ms() as u64,
            parent,
            checkpoint: None,
            spent: Default::default(),
            resume_failed: None,
            auto_paused_ms: None,
            mounts: Vec::new(),
            remount: Vec::new(),
            life_from_ms: engine::row::now_ms() as u64,
        }
    }
}

impl Drop for SandboxFacts {
    fn drop(&mut self) {
        self.settings
            .environment
            .sandboxes
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A sandbox's settings, which its branches share.
#[derive(Clone)]
pub struct Settings {
    pub environment: Arc<Environment>,
    pub ready: Ready,
    pub spec: SandboxSpec,
    pub network_name: Option<String>,
    pub idle: Duration,
    pub lifetime: Duration,
    pub metadata: BTreeMap<String, String>,
    /// The request it was made with (a restart makes the settings again from it).
    pub request: SandboxRequest,
}

/// A sandbox's last checkpoint, held so its folder stays (it is removed when a newer one
/// replaces it, or when the sandbox goes).
pub struct Checkpoint {
    pub fork: Arc<PausedFork>,
    pub at_ms: u64,
}
