//! Commands in a sandbox: checked before any VM is touched, run without the sandbox's lock
//! held, the guest pinged while they run, and streamed commands' output read from a folder of
//! their own in the guest's `/tmp` as it grows.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use engine::sandbox::Command;
use farm_protocol::Program;
use serde::Deserialize;
use serde_json::json;

use super::{Sandboxes, MAX_REMEMBERED_DEATHS};
use crate::serve::bounds;
use crate::serve::error::{ApiError, ApiResult};

/// Default and largest output cap of a command.
const DEFAULT_OUTPUT: u64 = 1 << 20;

const MAX_OUTPUT: u64 = 16 << 20;

const DEFAULT_STREAM_OUTPUT: u64 = 16 << 20;

const DEFAULT_TIMEOUT_SECS: u64 = 600;

const MAX_TIMEOUT_SECS: u64 = 86_400;

/// While a command runs, its sandbox's guest is pinged this often; this many pings in a row
/// unanswered within [`PING_TIMEOUT`] mean the guest is gone (halted, hung), and the sandbox
/// is removed with the reason.
const LIVENESS_EVERY: Duration = Duration::from_secs(10);

const PING_TIMEOUT: Duration = Duration::from_secs(20);

const MISSED_PINGS: u32 = 3;

/// `POST /v1/sandboxes/{id}/exec` (and `/exec/stream`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub timeout_secs: Option<f64>,
    #[serde(default)]
    pub stdin: Option<String>,
    #[serde(default)]
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
    Exit(serde_json::Value),
    Error(String),
}

/// `program` with its output sent to `dir/out` and `dir/err` (the folder is made by the
/// wrapper, as whoever the command runs as).
fn wrap_for_stream(program: &Program, dir: &str) -> Program {
    let redirect = format!("mkdir -m 700 {dir} && exec \"$@\" >{dir}/out 2>{dir}/err");
    let mut argv = vec!["/bin/sh".to_string(), "-c".into(), redirect, "sh".into()];
    match program {
        Program::Shell(script) => argv.extend(["/bin/sh".to_string(), "-c".into(), script.clone()]),
        Program::Argv(args) => argv.extend(args.iter().cloned()),
    }
    Program::Argv(argv)
}

/// Runs a wrapped command and sends its output as it grows; returns its end.
async fn stream_command(
    agent: &vmm::AgentClient,
    options: vmm::ExecOptions,
    dir: &str,
    cap: u64,
    tx: &tokio::sync::mpsc::Sender<StreamEvent>,
) -> Result<StreamEvent, vmm::AgentError> {
    let run = agent.exec(options);
    tokio::pin!(run);
    let (out, err) = (format!("{dir}/out"), format!("{dir}/err"));
    let mut offsets = [0u64; 2];
    let mut truncated = [false; 2];
    let mut wait = Duration::from_millis(20);
    let result = loop {
        tokio::select! {
            result = &mut run => break result?,
            _ = tokio::time::sleep(wait) => {
                let got = forward(agent, [&out, &err], &mut offsets, &mut truncated, cap, tx).await;
                wait = if got { Duration::from_millis(20) } else { (wait * 2).min(Duration::from_millis(250)) };
            }
        }
    };
    forward(agent, [&out, &err], &mut offsets, &mut truncated, cap, tx).await;
    let r = &result.result;
    if r.exit_code == Some(126) || r.exit_code == Some(127) || offsets == [0, 0] {
        // The wrapper's own complaint (the folder could not be made, or no such program).
        let own = String::from_utf8_lossy(&result.stderr).into_owned();
        if !own.is_empty() {
            let _ = tx.send(StreamEvent::Stderr(own)).await;
        }
    }
    Ok(StreamEvent::Exit(json!({
        "exit_code": r.exit_code,
        "signal": r.signal,
        "timed_out": r.timed_out,
        "stdout_truncated": truncated[0],
        "stderr_truncated": truncated[1],
        "output_cap_bytes": cap,
        "duration_ms": r.duration_us / 1000,
    })))
}

/// Sends what the two files gained since `offsets`; whether anything came.
async fn forward(
    agent: &vmm::AgentClient,
    paths: [&str; 2],
    offsets: &mut [u64; 2],
    truncated: &mut [bool; 2],
    cap: u64,
    tx: &tokio::sync::mpsc::Sender<StreamEvent>,
) -> bool {
    const CHUNK: u64 = 256 << 10;
    let mut any = false;
    for i in 0..2 {
        loop {
            if offsets[i] >= cap {
                break;
            }
            let want = CHUNK.min(cap - offsets[i]);
            let Ok((bytes, size)) = agent.read_file_at(paths[i], offsets[i], want, None).await else {
                break;
            };
            if size > cap {
                truncated[i] = true;
            }
            if bytes.is_empty() {
                break;
            }
            // Whole characters only: a cut at a chunk's end waits for the rest.
            let text_len = utf8_prefix(&bytes, offsets[i] + (bytes.len() as u64) < size.min(cap));
            if text_len == 0 {
                break;
            }
            offsets[i] += text_len as u64;
            any = true;
            let text = String::from_utf8_lossy(&bytes[..text_len]).into_owned();
            let event = if i == 0 {
                StreamEvent::Stdout(text)
            } else {
                StreamEvent::Stderr(text)
            };
            let _ = tx.send(event).await;
            if (bytes.len() as u64) < want {
                break;
            }
        }
    }
    any
}

/// How much of `bytes` to send now: all, unless `more` is coming and it ends inside a
/// UTF-8 character (then up to that character).
fn utf8_prefix(bytes: &[u8], more: bool) -> usize {
    if !more {
        return bytes.len();
    }
    match std::str::from_utf8(bytes) {
        Ok(_) => bytes.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => bytes.len(),
    }
}

impl Sandboxes {
    /// What a command's request asks, checked: the program and its settings.
    pub(super) fn command_of(request: ExecRequest, stream: bool) -> ApiResult<(Program, Command)> {
        request.check_bounds()?;
        let program = match (request.command, request.argv) {
            (Some(c), None) if !c.is_empty() => Program::Shell(c),
            (None, Some(argv)) if !argv.is_empty() && !argv[0].is_empty() => Program::Argv(argv),
            (Some(_), Some(_)) => return Err(ApiError::field(400, "argv", "give command or argv, not both")),
            (None, Some(_)) => return Err(ApiError::field(400, "argv", "must name a program")),
            _ => {
                return Err(ApiError::field(
                    400,
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
                    400,
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
                    400,
                    "max_output_bytes",
                    format!("must be 1 to {MAX_OUTPUT}"),
                ))
            }
        };
        if let Some(cwd) = &request.cwd {
            if !cwd.starts_with('/') {
                return Err(ApiError::field(400, "cwd", "must be an absolute guest path"));
            }
        }
        for k in request.env.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(ApiError::field(400, format!("env.{k}"), "not a variable name"));
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
    pub async fn exec(&self, id: &str, request: ExecRequest) -> ApiResult<serde_json::Value> {
        let (program, command) = Self::command_of(request, false)?;
        let cap = command.output_cap;
        let _in_use = self.begin(id);
        let (agent, options, _) = self.agent(id, |live| Ok(live.exec_options(program, command))).await?;
        let out = self.watched(id, &agent, agent.exec(options)).await?;
        let r = &out.result;
        Ok(json!({
            "exit_code": r.exit_code,
            "signal": r.signal,
            "timed_out": r.timed_out,
            "stdout": String::from_utf8_lossy(&out.stdout),
            "stderr": String::from_utf8_lossy(&out.stderr),
            "stdout_truncated": r.stdout_truncated,
            "stderr_truncated": r.stderr_truncated,
            "output_cap_bytes": cap,
            "duration_ms": r.duration_us / 1000,
        }))
    }

    /// `work` (a request to the sandbox's agent), while the guest is checked to answer: a
    /// guest that stops answering, or whose VM is gone, has its sandbox removed, and the
    /// client is told why (502; later requests for the sandbox get 410 with the reason).
    pub(super) async fn watched<T>(
        &self,
        id: &str,
        agent: &vmm::AgentClient,
        work: impl std::future::Future<Output = Result<T, vmm::AgentError>>,
    ) -> ApiResult<T> {
        tokio::pin!(work);
        let mut missed = 0;
        let dead = loop {
            tokio::select! {
                result = &mut work => match result {
                    Ok(value) => return Ok(value),
                    Err(e @ (vmm::AgentError::ChannelClosed(_) | vmm::AgentError::Timeout { .. })) => break e.to_string(),
                    Err(e) => return Err(self.vm_error(id, &e)),
                },
                _ = tokio::time::sleep(LIVENESS_EVERY) => match agent.ping_within(PING_TIMEOUT).await {
                    Ok(_) => missed = 0,
                    Err(vmm::AgentError::Timeout { .. }) => {
                        missed += 1;
                        if missed >= MISSED_PINGS {
                            break format!(
                                "its guest stopped answering ({MISSED_PINGS} pings in a row unanswered within {} s): it halted, hung or is starved",
                                PING_TIMEOUT.as_secs()
                            );
                        }
                    }
                    Err(e) => break e.to_string(),
                },
            }
        };
        if !self.all.lock().unwrap_or_else(|p| p.into_inner()).contains_key(id) {
            return Err(ApiError::new(
                410,
                format!("sandbox {id} was removed while the request ran"),
            ));
        }
        let why = format!("its VM died: {dead}");
        {
            let mut deaths = self.deaths.lock().unwrap_or_else(|p| p.into_inner());
            if deaths.len() >= MAX_REMEMBERED_DEATHS {
                deaths.clear();
            }
            deaths.insert(id.to_string(), why.clone());
        }
        let _ = self.delete(id, &why).await;
        Err(ApiError::new(502, format!("sandbox {id} {why}; it is removed")))
    }

    /// An agent failure as the client sees it: the sandbox's VM died (or was deleted).
    pub(super) fn vm_error(&self, id: &str, e: &vmm::AgentError) -> ApiError {
        let gone = !self.all.lock().unwrap_or_else(|p| p.into_inner()).contains_key(id);
        if gone {
            ApiError::new(410, format!("sandbox {id} was removed while the request ran"))
        } else {
            match e {
                vmm::AgentError::Refused { .. } | vmm::AgentError::InvalidRequest { .. } => {
                    ApiError::new(400, format!("the guest refused it: {e}"))
                }
                _ => ApiError::new(502, format!("sandbox {id}'s VM failed: {e}")),
            }
        }
    }

    /// `POST /v1/sandboxes/{id}/exec/stream`: output events as the command writes, then its
    /// end. The command's output goes to files of its own in the guest, read as they grow.
    pub async fn exec_stream(
        self: &Arc<Self>,
        id: &str,
        request: ExecRequest,
    ) -> ApiResult<tokio::sync::mpsc::Receiver<StreamEvent>> {
        let (program, command) = Self::command_of(request, true)?;
        let cap = command.output_cap;
        let in_use = self.begin(id);
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let dir = format!("/tmp/.farm-stream-{}-{n}", std::process::id());
        let (agent, options, _) = self
            .agent(id, |live| {
                let wrapped = wrap_for_stream(&program, &dir);
                let mut options = live.exec_options(wrapped, command);
                // The real output goes to the files; the wrapper's own is small.
                options.stdout_cap = 64 << 10;
                options.stderr_cap = 64 << 10;
                Ok(options)
            })
            .await?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let this = self.clone();
        let id = id.to_string();
        drop(in_use);
        tokio::spawn(async move {
            let _in_use = this.begin(&id);
            let event = this
                .watched(&id, &agent, stream_command(&agent, options, &dir, cap, &tx))
                .await;
            let event = match event {
                Ok(end) => end,
                Err(e) => StreamEvent::Error(e.message),
            };
            // The folder goes before the last event: a client that runs its next command on
            // the end event finds the guest as the command left it, without farm's files.
            let _ = agent.remove_tree(&dir).await;
            let _ = tx.send(event).await;
        });
        Ok(rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_streamed_command_writes_to_its_own_folder() {
        let wrapped = wrap_for_stream(&Program::Argv(vec!["echo".into(), "a b".into()]), "/tmp/d");
        let Program::Argv(argv) = wrapped else { panic!() };
        assert_eq!(argv[..2], ["/bin/sh", "-c"]);
        assert_eq!(argv[4..], ["echo", "a b"]);
        assert!(argv[2].contains(">/tmp/d/out 2>/tmp/d/err"));
        let Program::Argv(argv) = wrap_for_stream(&Program::Shell("x | y".into()), "/tmp/d") else {
            panic!()
        };
        assert_eq!(argv[4..], ["/bin/sh", "-c", "x | y"]);
    }

    #[test]
    fn output_is_cut_between_characters() {
        let text = "héllo".as_bytes();
        assert_eq!(utf8_prefix(&text[..2], true), 1);
        assert_eq!(utf8_prefix(&text[..2], false), 2);
        assert_eq!(utf8_prefix(text, true), text.len());
    }
}
