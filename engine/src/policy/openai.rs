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

use datasets::Task;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use super::PolicyBuildError;
use crate::config::{Action, PolicyConfig};
use crate::row::Usage;

const DEFAULT_SYSTEM_PROMPT: &str =
    "You are an agent working in a Linux sandbox. Your working directory is /workspace. \
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

/// Why the endpoint gave no action.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// It refused the request as it stands (400, 413 or 422: typically a conversation past
    /// the model's context length). Not retried; the rollout fails: the model's doing.
    #[error("{0}")]
    Refused(Refused),
    /// It failed (after the retries), or answered with something that is not a completion:
    /// an environment error.
    #[error("{0}")]
    Endpoint(String),
}

/// The endpoint refused the conversation itself.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

pub struct OpenAiPolicy {
    /// Checked (`PolicyConfig::check`): `base_url` and `model` are set.
    config: PolicyConfig,
    api_key: Option<String>,
    client: reqwest::Client,
    limiter: Arc<Semaphore>,
}

impl OpenAiPolicy {
    /// A policy for a checked configuration: the key is the request's own (`api_key`), or
    /// read from the variable a suite names (`api_key_env`).
    pub fn new(config: PolicyConfig) -> Result<OpenAiPolicy, PolicyBuildError> {
        let api_key = match (&config.api_key, &config.api_key_env) {
            (Some(key), _) => Some(key.clone()),
            (None, Some(var)) => Some(std::env::var(var).map_err(|_| PolicyBuildError::MissingKey(var.clone()))?),
            (None, None) => None,
        };
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(config.request_timeout_secs()))
            .build()
            .map_err(PolicyBuildError::Client)?;
        let limiter = Arc::new(Semaphore::new(config.concurrency()));
        Ok(OpenAiPolicy {
            config,
            api_key,
            client,
            limiter,
        })
    }

    /// Requests in flight at once, across all rollouts.
    pub fn concurrency(&self) -> usize {
        self.config.concurrency()
    }

    pub fn params(&self) -> Value {
        json!({
            "base_url": self.config.base_url,
            "model": self.config.model,
            "temperature": self.config.temperature,
            "top_p": self.config.top_p,
            "max_tokens": self.config.max_tokens(),
            "logprobs": self.config.logprobs(),
        })
    }

    pub fn session(&self, task: &Task, seed: u64) -> ChatSession<'_> {
        let system = self
            .config
            .system_prompt
            .clone()
            .unwrap_or_else(|| DEFAULT_SYSTEM_PROMPT.to_string());
        let opening = vec![
            json!({ "role": "system", "content": system }),
            json!({ "role": "user", "content": task.instruction }),
        ];
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

    /// The chat-completions request for `messages`: the model, the tools and the sampling
    /// settings the config gives.
    fn request_body(&self, messages: &[Value], seed: u64) -> Value {
        let mut body = json!({
            "model": self.config.model,
            "messages": messages,
            "tools": tools(),
            "tool_choice": "auto",
            "max_tokens": self.config.max_tokens(),
            "seed": seed,
        });
        if let Some(t) = self.config.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(p) = self.config.top_p {
            body["top_p"] = json!(p);
        }
        if self.config.logprobs() {
            body["logprobs"] = json!(true);
        }
        body
    }

    /// One chat-completions request, with retries.
    async fn complete(&self, messages: &[Value], seed: u64) -> Result<ChatReply, ChatError> {
        let body = self.request_body(messages, seed);
        let base_url = self.config.base_url.as_deref().unwrap_or_default();
        let url = format!("{}/chat/completions", base_url.trim_end_matches('/'));
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
                    crate::metrics::get()
                        .policy_requests
                        .with_label_values(&[status.as_str()])
                        .inc();
                    let retry_after = retry_after(response.headers());
                    if status.is_success() {
                        let text = response.text().await.map_err(|e| {
                            ChatError::Endpoint(format!("{url} answered {status}, then the body failed: {e}"))
                        })?;
                        return serde_json::from_str::<ChatReply>(&text).map_err(|e| {
                            ChatError::Endpoint(format!(
                                "{url} answered {status} with a body that is not a chat completion ({e}): {}",
                                text.chars().take(500).collect::<String>()
                            ))
                        });
                    }
                    let text = response.text().await.unwrap_or_default();
                    if matches!(status.as_u16(), 400 | 413 | 422) {
                        return Err(ChatError::Refused(Refused(format!(
                            "{url} refused the conversation ({status}): {}",
                            text.chars().take(500).collect::<String>()
                        ))));
                    }
                    let retryable = status.as_u16() == 429 || status.is_server_error();
                    (
                        retryable,
                        format!(
                            "{url} answered {status}: {}",
                            text.chars().take(500).collect::<String>()
                        ),
                        retry_after,
                    )
                }
                Err(e) => {
                    crate::metrics::get()
                        .policy_requests
                        .with_label_values(&["error"])
                        .inc();
                    (
                        e.is_timeout() || e.is_connect() || e.is_request(),
                        format!("request to {url} failed: {e}"),
                        None,
                    )
                }
            };
            if !retryable || attempt >= self.config.max_retries() {
                return Err(ChatError::Endpoint(format!(
                    "{error} (after {} attempt(s))",
                    attempt + 1
                )));
            }
            let backoff =
                Duration::from_millis(500u64.saturating_mul(1 << attempt.min(6))).min(Duration::from_secs(30));
            tokio::time::sleep(wait.unwrap_or(backoff)).await;
            attempt += 1;
        }
    }
}

/// The wait a `Retry-After` header of seconds asks for, at most a minute.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite())
        .map(|s| Duration::from_secs_f64(s.clamp(0.0, 60.0)))
}

/// A chat-completions answer: what farm reads of it. The message itself is kept whole (it
/// is sent back to the endpoint and recorded as it came).
#[derive(Debug, Deserialize)]
struct ChatReply {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<UsageReply>,
    /// vLLM-style token ids of the prompt.
    #[serde(default)]
    prompt_token_ids: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    message: Value,
    #[serde(default)]
    finish_reason: Option<Value>,
    #[serde(default)]
    logprobs: Option<Value>,
    /// vLLM-style token ids of the completion.
    #[serde(default)]
    token_ids: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct UsageReply {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    total_tokens: Option<u64>,
}

/// What the assistant's message asks for.
#[derive(Debug, Default, Deserialize)]
struct AssistantMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCall>,
}

#[derive(Debug, Deserialize)]
struct ToolCall {
    #[serde(default)]
    id: String,
    function: FunctionCall,
}

#[derive(Debug, Deserialize)]
struct FunctionCall {
    #[serde(default)]
    name: String,
    /// JSON text, as the API sends it.
    #[serde(default)]
    arguments: String,
}

/// A tool call's arguments.
#[derive(Debug, Default, Deserialize)]
struct Arguments {
    command: Option<String>,
    path: Option<String>,
    content: Option<String>,
    answer: Option<String>,
}

impl ToolCall {
    /// The action a call asks for; a malformed one is answered with an error, as a real tool
    /// would.
    fn action(&self) -> Action {
        let raw = if self.function.arguments.is_empty() {
            "{}"
        } else {
            self.function.arguments.as_str()
        };
        let args: Arguments = serde_json::from_str(raw).unwrap_or_default();
        match (self.function.name.as_str(), args) {
            (
                "run_shell",
                Arguments {
                    command: Some(command), ..
                },
            ) => Action::Exec { command },
            (
                "write_file",
                Arguments {
                    path: Some(path),
                    content: Some(content),
                    ..
                },
            ) => Action::WriteFile {
                path,
                content,
                mode: 0o644,
            },
            ("submit", Arguments { answer, .. }) => Action::Submit { answer },
            (name, _) => Action::Exec {
                command: format!(
                    "echo 'farm: unknown tool call {name} with arguments {}' >&2; exit 2",
                    raw.replace('\'', "")
                ),
            },
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
    pub async fn next(&mut self, observation: Option<String>) -> Result<Option<Action>, ChatError> {
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

    async fn ask(&mut self) -> Result<(), ChatError> {
        let reply = self.policy.complete(&self.messages, self.seed).await?;
        if let Some(u) = &reply.usage {
            let add = |acc: &mut Option<u64>, v: Option<u64>| {
                if let Some(v) = v {
                    *acc = Some(acc.unwrap_or(0).saturating_add(v));
                }
            };
            add(&mut self.usage.prompt_tokens, u.prompt_tokens);
            add(&mut self.usage.completion_tokens, u.completion_tokens);
            add(&mut self.usage.total_tokens, u.total_tokens);
        }
        let Some(choice) = reply.choices.into_iter().next() else {
            return Err(ChatError::Endpoint("the endpoint's answer has no choices".into()));
        };
        let message = choice.message;
        let asked: AssistantMessage = serde_json::from_value(message.clone()).map_err(|e| {
            ChatError::Endpoint(format!(
                "the endpoint's message is not an assistant message ({e}): {message}"
            ))
        })?;
        for call in &asked.tool_calls {
            self.pending.push_back((call.id.clone(), call.action()));
        }
        if asked.tool_calls.is_empty() {
            // No tool call: the message is the final answer.
            self.pending.push_back((
                String::new(),
                Action::Submit {
                    answer: Some(asked.content.unwrap_or_default()),
                },
            ));
        }
        // What the trajectory keeps beyond the message itself.
        let mut recorded = message.clone();
        if let Some(obj) = recorded.as_object_mut() {
            let extras = [
                ("logprobs", choice.logprobs),
                ("finish_reason", choice.finish_reason),
                ("token_ids", choice.token_ids),
                ("prompt_token_ids", reply.prompt_token_ids),
            ];
            for (key, value) in extras {
                if let Some(v) = value.filter(|v| !v.is_null()) {
                    obj.insert(key.into(), v);
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> Action {
        ToolCall {
            id: "c".into(),
            function: FunctionCall {
                name: name.into(),
                arguments: arguments.into(),
            },
        }
        .action()
    }

    #[test]
    fn tool_calls_become_actions_and_malformed_ones_an_error_to_the_model() {
        assert_eq!(
            call("run_shell", r#"{"command": "ls"}"#),
            Action::Exec { command: "ls".into() }
        );
        assert_eq!(
            call("write_file", r#"{"path": "a", "content": "b"}"#),
            Action::WriteFile {
                path: "a".into(),
                content: "b".into(),
                mode: 0o644
            }
        );
        assert_eq!(call("submit", "{}"), Action::Submit { answer: None });
        assert_eq!(
            call("submit", r#"{"answer": "42"}"#),
            Action::Submit {
                answer: Some("42".into())
            }
        );
        let Action::Exec { command } = call("launch", "{'x'}") else {
            panic!("an unknown call is answered with an error")
        };
        assert!(
            command.contains("unknown tool call launch") && command.contains("exit 2"),
            "{command}"
        );
        let reply: ChatReply = serde_json::from_str(r#"{"choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}], "usage": {"total_tokens": 3}}"#).unwrap();
        assert_eq!(reply.usage.unwrap().total_tokens, Some(3));
        assert!(
            serde_json::from_str::<ChatReply>(r#"{"error": "no"}"#).is_err(),
            "no choices: not a completion"
        );
    }
}
