//! Policies: where a rollout's actions come from. `replay` replays the task's reference
//! solution, completions from a samples file, actions from a trajectory file, or a
//! request's actions ([`replay`]); `openai` asks an OpenAI-compatible endpoint ([`openai`]).

pub mod openai;
pub mod replay;

use std::collections::VecDeque;
use std::sync::Arc;

use datasets::Task;

use crate::config::{Action, PolicyConfig, PolicyKind, PolicyOrigin, Suite};
use crate::row::Usage;

pub use openai::{OpenAiPolicy, Refused};
pub use replay::ReplayPolicy;

/// Why a policy could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PolicyBuildError {
    #[error(transparent)]
    Config(#[from] crate::config::PolicyError),
    #[error("{}:{line}: {message}", path.display())]
    File {
        path: std::path::PathBuf,
        line: usize,
        message: String,
    },
    #[error("reading {}", path.display())]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("policy.api_key_env names {0}, which is not set")]
    MissingKey(String),
    #[error("building the HTTP client")]
    Client(#[source] reqwest::Error),
}

/// Where actions come from.
pub enum Policy {
    Replay(ReplayPolicy),
    OpenAi(Box<OpenAiPolicy>),
    /// The same actions for every sample (a `farm serve` request's replay).
    Actions(Vec<Action>),
    /// No actions (`kind = "nop"`).
    Nop,
}

impl Policy {
    /// The policy `config` describes: the suite's `[policy]`, or a request's merged over it
    /// (`origin` says which keys it may hold).
    pub fn build(suite: &Suite, config: &PolicyConfig, origin: PolicyOrigin) -> Result<Policy, PolicyBuildError> {
        Ok(match (config.check(origin)?, &config.actions) {
            (PolicyKind::Replay, Some(actions)) => Policy::Actions(actions.clone()),
            (PolicyKind::Replay, None) => Policy::Replay(ReplayPolicy::load(suite, config)?),
            (PolicyKind::Openai, _) => Policy::OpenAi(Box::new(OpenAiPolicy::new(config.clone())?)),
            (PolicyKind::Nop, _) => Policy::Nop,
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Policy::Replay(_) | Policy::Actions(_) => "replay",
            Policy::OpenAi(_) => "openai",
            Policy::Nop => "nop",
        }
    }

    pub fn params(&self) -> serde_json::Value {
        match self {
            Policy::Replay(p) => p.params(),
            Policy::OpenAi(p) => p.params(),
            Policy::Actions(_) => serde_json::json!({ "source": "request" }),
            Policy::Nop => serde_json::json!({}),
        }
    }

    pub fn samples_for(&self, task: &Task, samples: u32) -> u32 {
        match self {
            Policy::Replay(p) => p.samples_for(task),
            Policy::OpenAi(_) | Policy::Actions(_) | Policy::Nop => samples,
        }
    }

    /// Whether rollouts mostly wait for an endpoint (a live policy), and how many requests
    /// it sends at once.
    pub fn live_requests(&self) -> Option<usize> {
        match self {
            Policy::OpenAi(p) => Some(p.concurrency()),
            Policy::Replay(_) | Policy::Actions(_) | Policy::Nop => None,
        }
    }

    pub(crate) fn driver(
        self: &Arc<Self>,
        task: &Task,
        sample: u32,
        seed: u64,
    ) -> Result<Driver<'_>, replay::NoActions> {
        match &**self {
            Policy::Replay(p) => p.actions(task, sample).map(|a| Driver::Replay(a.into())),
            Policy::OpenAi(p) => Ok(Driver::Chat(p.session(task, seed))),
            Policy::Actions(actions) => Ok(Driver::Replay(actions.clone().into())),
            Policy::Nop => Ok(Driver::Replay(VecDeque::new())),
        }
    }
}

/// One rollout's source of actions.
pub(crate) enum Driver<'a> {
    Replay(VecDeque<Action>),
    Chat(openai::ChatSession<'a>),
}

impl Driver<'_> {
    /// The next action, given what the last one produced; None when the policy is done.
    pub(crate) async fn next(&mut self, observation: Option<String>) -> Result<Option<Action>, openai::ChatError> {
        match self {
            Driver::Replay(actions) => Ok(actions.pop_front()),
            Driver::Chat(session) => session.next(observation).await,
        }
    }

    /// The replayed actions, when they are known in advance.
    pub(crate) fn replayed(&self) -> Option<&VecDeque<Action>> {
        match self {
            Driver::Replay(actions) => Some(actions),
            Driver::Chat(_) => None,
        }
    }

    pub(crate) fn messages_json(&self) -> String {
        match self {
            Driver::Replay(_) => "[]".into(),
            Driver::Chat(session) => session.messages_json(),
        }
    }

    pub(crate) fn usage(&self) -> Usage {
        match self {
            Driver::Replay(_) => Usage::default(),
            Driver::Chat(session) => session.usage(),
        }
    }
}
