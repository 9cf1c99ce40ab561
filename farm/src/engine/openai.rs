//! The `openai` policy: an OpenAI-compatible chat-completions endpoint that acts through
//! tool calls (run a shell command, write a file, submit an answer).
//!
//! Requests are capped by a semaphore shared by all rollouts, retried with exponential
//! backoff on 429, 5xx and connection errors (honouring `Retry-After`), and bounded by a
//! timeout. Every message, the token usage and, when the endpoint returns them, token
//! logprobs are recorded in the trajectory.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use datasets::Task;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use super::output::Usage;
use super::policy::Action;

/// `[policy]` keys of `kind = "openai"`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiConfig {
    /// e.g. `http://127.0.0.1:8000/v1` (the `/chat/completions` path is appended).
    pub base_url: String,
    pub model: String,
    /// Environment variable holding the API key (sent as a bearer token); none if unset.
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default = "max_tokens")]
    pub max_tokens: u32,
    /// Ask for token logprobs (recorded when the endpoint returns them).
    #[serde(default)]
    pub logprobs: bool,
    #[serde(default = "request_timeout")]
    pub request_timeout_secs: u64,
    /// Retries of one request on 429, 5xx or a connection error.
    #[serde(default = "max_retries")]
    pub max_retries: u32,
    /// Requests in flight at once, across all rollouts.
    #[serde(default = "concurrency")]
    pub concurrency: usize,
    /// Replaces the default system prompt.
    #[serde(default)]
    pub system_prompt: Option<String>,
}

fn max_tokens() -> u32 {
    1024
}
fn request_timeout() -> u64 {
    120
}
fn max_retries() -> u32 {
    5
}
fn concurrency() -> usize {
    4
}

const DEFAULT_SYSTEM_PROMPT: &str = "You are an agent working in a Linux sandbox. Your working directory is /workspace. \
Use the tools to inspect files, run commands and write files. When the task is done, call `submit` \
(with the final answer if the task asks for one).";

fn tools() -> Value {
    json!([
        { "type": "function", "function": {
            "name": "run_shell",
            "description": "Run a shell command in /workspace and return its exit code, stdout and stderr.",
            "parameters": { "type": "object", "properties": { "command": { "type": "string" } }, "required": ["command"] } } },
        { "type": "function", "function": {
            "name": "write_file",
            "description": "Write a file (relative paths are in /workspace).",
            "parameters": { "type": "object", "properties": { "path": { "type": "string" }, "content": { "type": "string" } }, "required": ["path", "content"] } } },
        { "type": "function", "function": {
            "name": "submit",
            "description": "Finish the task, with the final answer if one is asked for.",
            "parameters": { "type": "object", "properties": { "answer": { "type": "string" } } } } }
    ])
}

/// The endpoint refused the request as it stands (400, 413 or 422: typically a
/// conversation past the model's context length). Not retried; the rollout fails.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

pub struct OpenAiPolicy {
    config: OpenAiConfig,
    api_key: Option<String>,
    client: reqwest::Client,
    limiter: Arc<Semaphore>,
}

impl OpenAiPolicy {
    pub fn new(config: OpenAiConfig) -> Result<OpenAiPolicy> {
        let api_key = match &config.api_key_env {
            Some(var) => Some(std::env::var(var).with_context(|| format!("policy.api_key_env names {var}, which is not set"))?),
            None => None,
        };
        OpenAiPolicy::with_key(config, api_key)
    }

    /// A policy with the API key given (`farm serve` requests carry theirs; `api_key_env`
    /// is ignored).
    pub fn with_key(config: OpenAiConfig, api_key: Option<String>) -> Result<OpenAiPolicy> {
        if !(config.base_url.starts_with("http://") || config.base_url.starts_with("https://")) {
            bail!("policy.base_url {:?} must start with http:// or https://", config.base_url);
        }
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(config.request_timeout_secs))
            .build()
            .context("building the HTTP client")?;
        let limiter = Arc::new(Semaphore::new(config.concurrency.max(1)));
        Ok(OpenAiPolicy { config, api_key, client, limiter })
    }

    pub fn params(&self) -> Value {
        json!({
            "base_url": self.config.base_url,
            "model": self.config.model,
            "temperature": self.config.temperature,
            "top_p": self.config.top_p,
            "max_tokens": self.config.max_tokens,
            "logprobs": self.config.logprobs,
        })
    }

    pub fn session(&self, task: &Task, seed: u64) -> ChatSession<'_> {
        let system = self.config.system_prompt.clone().unwrap_or_else(|| DEFAULT_SYSTEM_PROMPT.to_string());
        let opening = vec![json!({ "role": "system", "content": system }), json!({ "role": "user", "content": task.instruction })];
        ChatSession {
            policy: self,
            transcript: opening.clone(),
            messages: opening,
            pending: VecDeque::new(),
            awaiting: None,
            usage: Usage::default(),
            seed,
            finished: false,
        }
    }

    /// One chat-completions request, with retries.
    async fn complete(&self, messages: &[Value], seed: u64) -> Result<Value> {
        let mut body = json!({
            "model": self.config.model,
            "messages": messages,
            "tools": tools(),
            "tool_choice": "auto",
            "max_tokens": self.config.max_tokens,
            "seed": seed,
        });
        if let Some(t) = self.config.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(p) = self.config.top_p {
            body["top_p"] = json!(p);
        }
        if self.config.logprobs {
            body["logprobs"] = json!(true);
        }
        let url = format!("{}/chat/completions", self.config.base_url.trim_end_matches('/'));
        let _permit = self.limiter.acquire().await.expect("limiter open");
        let mut attempt = 0;
        loop {
            let mut request = self.client.post(&url).json(&body);
            if let Some(key) = &self.api_key {
                request = request.bearer_auth(key);
            }
            let (retryable, error, wait) = match request.send().await {
                Ok(response) => {
                    let status = response.status();
                    crate::metrics::get().policy_requests.with_label_values(&[status.as_str()]).inc();
                    let retry_after = response
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<f64>().ok())
                        .filter(|s| s.is_finite())
                        .map(|s| Duration::from_secs_f64(s.clamp(0.0, 60.0)));
                    if status.is_success() {
                        return response.json::<Value>().await.with_context(|| format!("{url} answered {status} with a body that is not JSON"));
                    }
                    let text = response.text().await.unwrap_or_default();
                    if matches!(status.as_u16(), 400 | 413 | 422) {
                        return Err(Refused(format!("{url} refused the conversation ({status}): {}", text.chars().take(500).collect::<String>())).into());
                    }
                    let retryable = status.as_u16() == 429 || status.is_server_error();
                    (retryable, anyhow!("{url} answered {status}: {}", text.chars().take(500).collect::<String>()), retry_after)
                }
                Err(e) => {
                    crate::metrics::get().policy_requests.with_label_values(&["error"]).inc();
                    (e.is_timeout() || e.is_connect() || e.is_request(), anyhow!("request to {url} failed: {e}"), None)
                }
            };
            if !retryable || attempt >= self.config.max_retries {
                return Err(error.context(format!("after {} attempt(s)", attempt + 1)));
            }
            let backoff = Duration::from_millis(500u64.saturating_mul(1 << attempt.min(6))).min(Duration::from_secs(30));
            tokio::time::sleep(wait.unwrap_or(backoff)).await;
            attempt += 1;
        }
    }
}

/// One rollout's conversation.
pub struct ChatSession<'a> {
    policy: &'a OpenAiPolicy,
    /// What is sent to the endpoint.
    messages: Vec<Value>,
    /// What the trajectory records: the same messages, assistant ones with their logprobs and
    /// finish reason.
    transcript: Vec<Value>,
    /// Tool calls of the last assistant message not yet run: (call id, action).
    pending: VecDeque<(String, Action)>,
    /// The call whose result the next observation answers.
    awaiting: Option<String>,
    usage: Usage,
    seed: u64,
    finished: bool,
}

impl ChatSession<'_> {
    /// The next action, given what the previous one produced.
    pub async fn next(&mut self, observation: Option<String>) -> Result<Option<Action>> {
        if let (Some(id), Some(text)) = (self.awaiting.take(), observation) {
            let message = json!({ "role": "tool", "tool_call_id": id, "content": text });
            self.transcript.push(message.clone());
            self.messages.push(message);
        }
        if self.finished {
            return Ok(None);
        }
        if self.pending.is_empty() {
            self.ask().await?;
        }
        match self.pending.pop_front() {
            Some((id, action)) => {
                if matches!(action, Action::Submit { .. }) {
                    self.finished = true;
                }
                self.awaiting = Some(id);
                Ok(Some(action))
            }
            None => Ok(None),
        }
    }

    async fn ask(&mut self) -> Result<()> {
        let response = self.policy.complete(&self.messages, self.seed).await?;
        if let Some(u) = response.get("usage") {
            let add = |acc: &mut Option<u64>, v: Option<u64>| {
                if let Some(v) = v {
                    *acc = Some(acc.unwrap_or(0).saturating_add(v));
                }
            };
            add(&mut self.usage.prompt_tokens, u.get("prompt_tokens").and_then(Value::as_u64));
            add(&mut self.usage.completion_tokens, u.get("completion_tokens").and_then(Value::as_u64));
            add(&mut self.usage.total_tokens, u.get("total_tokens").and_then(Value::as_u64));
        }
        let choice = response.get("choices").and_then(|c| c.get(0)).ok_or_else(|| anyhow!("the endpoint's answer has no choices: {response}"))?;
        let message = choice.get("message").cloned().ok_or_else(|| anyhow!("the endpoint's choice has no message: {choice}"))?;
        // What the trajectory keeps beyond the message itself.
        let logprobs = choice.get("logprobs").cloned().filter(|l| !l.is_null());
        let finish_reason = choice.get("finish_reason").cloned();
        // Token ids, where the server returns them (vLLM-style `token_ids` on the choice,
        // `prompt_token_ids` on the response).
        let token_ids = choice.get("token_ids").cloned().filter(|t| !t.is_null());
        let prompt_token_ids = response.get("prompt_token_ids").cloned().filter(|t| !t.is_null());
        let calls = message.get("tool_calls").and_then(Value::as_array).cloned().unwrap_or_default();
        for call in &calls {
            let id = call.get("id").and_then(Value::as_str).unwrap_or("").to_string();
            let name = call.pointer("/function/name").and_then(Value::as_str).unwrap_or("");
            let raw = call.pointer("/function/arguments").and_then(Value::as_str).unwrap_or("{}");
            let args: Value = serde_json::from_str(raw).unwrap_or(Value::Null);
            let text = |key: &str| args.get(key).and_then(Value::as_str).map(str::to_string);
            let action = match (name, text("command"), text("path"), text("content")) {
                ("run_shell", Some(command), _, _) => Action::Exec { command },
                ("write_file", _, Some(path), Some(content)) => Action::WriteFile { path, content, mode: 0o644 },
                ("submit", ..) => Action::Submit { answer: text("answer").unwrap_or_default() },
                // A malformed call is answered with an error, as a real tool would.
                _ => Action::Exec { command: format!("echo 'farm: unknown tool call {name} with arguments {}' >&2; exit 2", raw.replace('\'', "")) },
            };
            self.pending.push_back((id, action));
        }
        if calls.is_empty() {
            // No tool call: the message is the final answer.
            let answer = message.get("content").and_then(Value::as_str).unwrap_or("").to_string();
            self.pending.push_back((String::new(), Action::Submit { answer }));
        }
        let mut recorded = message.clone();
        if let Some(obj) = recorded.as_object_mut() {
            if let Some(l) = logprobs {
                obj.insert("logprobs".into(), l);
            }
            if let Some(f) = finish_reason {
                obj.insert("finish_reason".into(), f);
            }
            if let Some(t) = token_ids {
                obj.insert("token_ids".into(), t);
            }
            if let Some(t) = prompt_token_ids {
                obj.insert("prompt_token_ids".into(), t);
            }
        }
        self.transcript.push(recorded);
        self.messages.push(message);
        Ok(())
    }

    /// Messages with the recorded extras, as JSON text.
    pub fn messages_json(&self) -> String {
        Value::Array(self.transcript.clone()).to_string()
    }

    pub fn usage(&self) -> Usage {
        self.usage.clone()
    }
}
