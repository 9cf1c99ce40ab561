//! Commands in a sandbox: checked before any VM is touched, then run by the sandbox's guest
//! ([`engine::guest::Guest`]) without the sandbox's lock held.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use engine::guest::Command;
use engine::guest::{CommandEnd, CommandOutput, Output};
use farm_protocol::Program;
use serde::Deserialize;

use super::{SandboxId, Sandboxes};
use crate::bounds;
use crate::error::ErrorKind;
use crate::error::{ApiError, ApiResult};

/// Default and largest output cap of a command.
const DEFAULT_OUTPUT: u64 = 1 << 20;

const MAX_OUTPUT: u64 = 16 << 20;

const DEFAULT_STREAM_OUTPUT: u64 = 16 << 20;

const DEFAULT_TIMEOUT_SECS: u64 = 600;

const MAX_TIMEOUT_SECS: u64 = 86_400;

/// `POST /v1/sandboxes/{id}/exec` (and `/exec/stream`).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = SandboxExecRequest)]
pub struct ExecRequest {
    pub command: Option<String>,
    pub argv: Option<Vec<String>>,
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub user: Option<String>,
    pub timeout_secs: Option<f64>,
    pub stdin: Option<String>,
    pub max_output_bytes: Option<u64>,
}

impl ExecRequest {
    /// Each field within its bound ([`bounds`]).
    fn check_bounds(&self) -> ApiResult<()> {
        if let Some(command) = &self.command {
            bounds::text("command", command, bounds::COMMAND_BYTES)?;
        }
        if let Some(argv) = &self.argv {
            bounds::argv("argv", argv)?;
        }
        if let Some(cwd) = &self.cwd {
            bounds::text("cwd", cwd, bounds::PATH_BYTES)?;
        }
        bounds::variables("env", &self.env)?;
        if let Some(user) = &self.user {
            bounds::text("user", user, bounds::USER_BYTES)?;
        }
        if let Some(stdin) = &self.stdin {
            bounds::text("stdin", stdin, bounds::STDIN_BYTES)?;
        }
        Ok(())
    }
}

/// What a streamed command sends.
#[derive(Debug)]
pub enum StreamEvent {
    Stdout(String),
    Stderr(String),
    Exit(CommandEnd),
    Error(String),
}

impl Sandboxes {
    /// What a command's request asks, checked: the program and its settings.
    pub(super) fn command_of(request: ExecRequest, stream: bool) -> ApiResult<(Program, Command)> {
        request.check_bounds()?;
        let program = match (request.command, request.argv) {
            (Some(c), None) if !c.is_empty() => Program::Shell(c),
            (None, Some(argv)) if !argv.is_empty() && !argv[0].is_empty() => Program::Argv(argv),
            (Some(_), Some(_)) => {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    "argv",
                    "give command or argv, not both",
                ))
            }
            (None, Some(_)) => return Err(ApiError::field(ErrorKind::Invalid, "argv", "must name a program")),
            _ => {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    "command",
                    "missing: give command (a shell string) or argv",
                ))
            }
        };
        let timeout = match request.timeout_secs {
            None => DEFAULT_TIMEOUT_SECS as f64,
            Some(t) if t > 0.0 && t <= MAX_TIMEOUT_SECS as f64 => t,
            Some(_) => {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    "timeout_secs",
                    format!("must be more than 0 and at most {MAX_TIMEOUT_SECS}"),
                ))
            }
        };
        let cap = match request.max_output_bytes {
            None if stream => DEFAULT_STREAM_OUTPUT,
            None => DEFAULT_OUTPUT,
            Some(c) if (1..=MAX_OUTPUT).contains(&c) => c,
            Some(_) => {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    "max_output_bytes",
                    format!("must be 1 to {MAX_OUTPUT}"),
                ))
            }
        };
        if let Some(cwd) = &request.cwd {
            if !cwd.starts_with('/') {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    "cwd",
                    "must be an absolute guest path",
                ));
            }
        }
        for k in request.env.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    format!("env.{k}"),
                    "not a variable name",
                ));
            }
        }
        Ok((
            program,
            Command {
                cwd: request.cwd,
                env: request.env.into_iter().collect(),
                user: request.user,
                stdin: request.stdin.map(String::into_bytes).unwrap_or_default(),
                timeout: Some(Duration::from_secs_f64(timeout)),
                output_cap: cap,
            },
        ))
    }

    /// `POST /v1/sandboxes/{id}/exec`.
    pub async fn exec(&self, id: &SandboxId, request: ExecRequest) -> ApiResult<CommandOutput> {
        let (program, command) = Self::command_of(request, false)?;
        self.room_to_run()?;
        let _in_use = self.begin(id);
        let guest = self.guest(id).await?;
        match guest.exec(program, command).await {
            Ok(out) => Ok(out),
            Err(e) => Err(self.guest_error(id, &guest, e, None).await),
        }
    }

    /// `POST /v1/sandboxes/{id}/exec/stream`: output events as the command writes, then its
    /// end.
    pub async fn exec_stream(
        self: &Arc<Self>,
        id: &SandboxId,
        request: ExecRequest,
    ) -> ApiResult<tokio::sync::mpsc::Receiver<StreamEvent>> {
        let (program, command) = Self::command_of(request, true)?;
        self.room_to_run()?;
        let in_use = self.begin(id);
        let guest = self.guest(id).await?;
        // One event waits at most in each queue: nothing is read from the guest ahead of the
        // client.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let this = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let _in_use = in_use;
            let (out_tx, mut out_rx) = tokio::sync::mpsc::channel(1);
            let events = tx.clone();
            let forward = tokio::spawn(async move {
                while let Some(output) = out_rx.recv().await {
                    let event = match output {
                        Output::Stdout(text) => StreamEvent::Stdout(text),
                        Output::Stderr(text) => StreamEvent::Stderr(text),
                    };
                    if events.send(event).await.is_err() {
                        return;
                    }
                }
            });
            let end = guest.exec_streamed(program, command, &out_tx).await;
            drop(out_tx);
            let _ = forward.await;
            let event = match end {
                Ok(end) => StreamEvent::Exit(end),
                Err(e) => StreamEvent::Error(this.guest_error(&id, &guest, e, None).await.message),
            };
            let _ = tx.send(event).await;
        });
        Ok(rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn commands_are_checked_before_any_vm_is_touched() {
        let req = |v: serde_json::Value| serde_json::from_value::<ExecRequest>(v).unwrap();
        let (p, c) = Sandboxes::command_of(req(json!({"command": "ls"})), false).unwrap();
        assert_eq!(p, Program::Shell("ls".into()));
        assert_eq!(
            (c.output_cap, c.timeout),
            (DEFAULT_OUTPUT, Some(Duration::from_secs(600)))
        );
        let (_, c) = Sandboxes::command_of(req(json!({"argv": ["ls"]})), true).unwrap();
        assert_eq!(c.output_cap, DEFAULT_STREAM_OUTPUT);
        for (body, field) in [
            (json!({}), "command"),
            (json!({"command": "a", "argv": ["b"]}), "argv"),
            (json!({"argv": []}), "argv"),
            (json!({"command": "a", "timeout_secs": 0}), "timeout_secs"),
            (json!({"command": "a", "timeout_secs": 1e9}), "timeout_secs"),
            (json!({"command": "a", "max_output_bytes": 0}), "max_output_bytes"),
            (json!({"command": "a", "cwd": "rel"}), "cwd"),
            (json!({"command": "a", "env": {"A=B": "c"}}), "env.A=B"),
        ] {
            let e = Sandboxes::command_of(req(body.clone()), false).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(field), "{body}");
        }
        assert!(serde_json::from_value::<ExecRequest>(json!({"command": "a", "shell": true})).is_err());
    }
}
