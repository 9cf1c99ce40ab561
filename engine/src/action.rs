//! One action in a guest ([`run_action`]), what the policy sees of it ([`observation`]),
//! and replays that need no VM at all ([`data_only_rollout`]).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use datasets::WORKSPACE;
use snapshotter::Fork;
use vmm::{AgentError, ExecOptions};

use crate::config::{Action, RolloutsSection};
use crate::row::{Step, StepKind};

/// Whether an action ended the rollout by submitting (with its answer, if any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitted {
    No,
    Yes(Option<String>),
}

/// What an action produced, as the policy sees it.
pub fn observation(step: &Step) -> String {
    match step.kind {
        StepKind::Exec => format!(
            "exit code: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            step.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "none".into()),
            step.stdout,
            step.stderr
        ),
        StepKind::WriteFile if step.stderr.is_empty() => format!("wrote {}", step.text),
        _ => step.stderr.clone(),
    }
}

/// The steps and artifacts of a replayed rollout that only writes workspace files and
/// submits an answer, or None when any action needs a VM (a command, a file outside the
/// workspace, a path that is not plain). The artifacts are what a VM would have handed over:
/// the written files (the last write of a path wins, modes without setuid bits, the same
/// limits), and the answer; actions after a submission or past `max_steps` are dropped.
pub(crate) fn data_only_rollout(
    actions: &VecDeque<Action>,
    max_steps: usize,
    limits: &scorers::ArtifactLimits,
) -> Option<(Vec<Step>, scorers::Artifacts)> {
    let mut steps = Vec::new();
    let mut files: std::collections::BTreeMap<String, (Vec<u8>, u32)> = std::collections::BTreeMap::new();
    let mut answer = None;
    for (index, action) in actions.iter().take(max_steps).enumerate() {
        match action {
            Action::Exec { .. } => return None,
            Action::WriteFile { path, content, mode } => {
                let relative = path.strip_prefix(&format!("{WORKSPACE}/")).unwrap_or(path);
                if !scorers::artifacts::safe_relative(relative) {
                    return None;
                }
                files.insert(relative.to_string(), (content.clone().into_bytes(), mode & 0o777));
                steps.push(Step::new(index as u32, StepKind::WriteFile, path.clone()));
            }
            Action::Submit { answer: text } => {
                steps.push(Step::new(
                    index as u32,
                    StepKind::Submit,
                    text.clone().unwrap_or_default(),
                ));
                answer = text.clone();
                break;
            }
        }
    }
    let entries: Vec<farm_protocol::FileEntry> = files
        .iter()
        .map(|(path, (bytes, mode))| farm_protocol::FileEntry {
            path: path.clone(),
            size: bytes.len() as u64,
            mtime_ns: 0,
            mode: *mode,
        })
        .collect();
    let (wanted, skipped) = scorers::artifacts::select(&[], &entries, limits);
    let mut artifacts = scorers::Artifacts {
        skipped,
        answer,
        ..Default::default()
    };
    let mut total = 0u64;
    for path in wanted {
        let (bytes, mode) = files.remove(&path).expect("selected from these files");
        if total + bytes.len() as u64 > limits.max_total_bytes {
            artifacts
                .skipped
                .push(format!("{path}: {} bytes, over the artifact limits", bytes.len()));
            continue;
        }
        total += bytes.len() as u64;
        artifacts.changed.push(path.clone());
        artifacts.files.push((path, bytes, mode));
    }
    Some((steps, artifacts))
}

/// Runs one action. Ok: the step and a submitted answer. Err: the VM died or stopped
/// answering during the action.
pub(crate) async fn run_action(
    fork: &Fork,
    action: &Action,
    index: u32,
    limits: &RolloutsSection,
    place: &crate::harbor::Place,
) -> Result<(Step, Submitted), (Step, String)> {
    let t = Instant::now();
    let (mut step, result) = match action {
        Action::Exec { command } => {
            let mut step = Step::new(index, StepKind::Exec, command.clone());
            let options = ExecOptions {
                cwd: Some(place.workdir.clone()),
                timeout: Some(Duration::from_secs(limits.step_timeout_secs)),
                stdout_cap: limits.output_cap_bytes,
                stderr_cap: limits.output_cap_bytes,
                user: place.user.clone(),
                ..ExecOptions::shell(command.clone())
            };
            match fork.agent().exec(options).await {
                Ok(out) => {
                    step.stdout = String::from_utf8_lossy(&out.stdout).into_owned();
                    step.stderr = String::from_utf8_lossy(&out.stderr).into_owned();
                    step.exit_code = Some(out.shell_exit_code());
                    if out.result.timed_out {
                        step.stderr.push_str(&format!(
                            "\n[farm: killed after the {} s step limit]",
                            limits.step_timeout_secs
                        ));
                    }
                    (step, Ok(Submitted::No))
                }
                Err(e) => (step, Err(e)),
            }
        }
        Action::WriteFile { path, content, mode } => {
            let step = Step::new(index, StepKind::WriteFile, path.clone());
            let full = if path.starts_with('/') {
                path.clone()
            } else {
                format!("{}/{path}", place.workdir.trim_end_matches('/'))
            };
            let placement = vmm::FilePlacement {
                beneath: None,
                owner: place.user.clone(),
            };
            (
                step,
                fork.agent()
                    .write_file_placed(&full, content.clone().into_bytes(), *mode, &placement)
                    .await
                    .map(|_| Submitted::No),
            )
        }
        Action::Submit { answer } => (
            Step::new(index, StepKind::Submit, answer.clone().unwrap_or_default()),
            Ok(Submitted::Yes(answer.clone())),
        ),
    };
    step.duration_ms = t.elapsed().as_secs_f64() * 1e3;
    match result {
        Ok(submitted) => Ok((step, submitted)),
        // The agent's command killed the guest agent; it restarts, the rollout goes on.
        Err(AgentError::AgentRestarted { .. }) => {
            step.stderr = "[farm: the guest agent was killed by this command and restarted]".into();
            let _ = fork.agent().wait_ready(Duration::from_secs(30)).await;
            Ok((step, Submitted::No))
        }
        Err(AgentError::Refused { message, .. }) => {
            step.stderr = format!("[farm: {message}]");
            step.exit_code = Some(if step.kind == StepKind::Exec { 127 } else { 1 });
            Ok((step, Submitted::No))
        }
        Err(e) => {
            let reason = format!("the VM stopped during the agent's action {index}: {}", fork.explain(&e));
            step.stderr = format!("[farm: {reason}]");
            Err((step, reason))
        }
    }
}
