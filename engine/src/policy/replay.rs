//! The `replay` policy: the task's reference solution, completions from a samples file, or
//! actions from a trajectory file.

use std::collections::HashMap;
use std::path::Path;

use datasets::Task;
use serde::Deserialize;

use super::PolicyBuildError;
use crate::config::{Action, PolicyConfig, ReplaySource, Suite};

/// The policy has no actions for this rollout (nor will it on a retry).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoActions {
    #[error("task {0:?} has no reference solution to replay")]
    NoSolution(String),
    #[error("no completion {sample} for task {task:?}")]
    NoCompletion { task: String, sample: u32 },
    #[error("no trajectory for task {task:?} sample {sample}")]
    NoTrajectory { task: String, sample: u32 },
}

pub struct ReplayPolicy {
    source: ReplaySource,
    /// task id -> completions (samples file)
    completions: HashMap<String, Vec<String>>,
    /// (task id, sample) -> actions (trajectory file)
    trajectories: HashMap<(String, u32), Vec<Action>>,
    samples: u32,
}

#[derive(Deserialize)]
struct SampleLine {
    task_id: String,
    completion: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TrajectoryLine {
    task_id: String,
    #[serde(default)]
    sample_index: u32,
    actions: Vec<Action>,
    /// Free text for people reading the file (what the trajectory is meant to show).
    #[serde(default)]
    #[allow(dead_code)]
    note: Option<String>,
}

fn jsonl<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Vec<(usize, T)>, PolicyBuildError> {
    let text = std::fs::read_to_string(path).map_err(|source| PolicyBuildError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value = serde_json::from_str(line).map_err(|e| PolicyBuildError::File {
            path: path.to_path_buf(),
            line: i + 1,
            message: e.to_string(),
        })?;
        out.push((i + 1, value));
    }
    Ok(out)
}

impl ReplayPolicy {
    pub fn load(suite: &Suite, config: &PolicyConfig) -> Result<ReplayPolicy, PolicyBuildError> {
        let source = config.source.unwrap_or_default();
        let mut policy = ReplayPolicy {
            source,
            completions: HashMap::new(),
            trajectories: HashMap::new(),
            samples: suite.config.rollouts.samples,
        };
        match source {
            ReplaySource::Reference => {}
            ReplaySource::Samples => {
                let path = suite.resolve(config.samples_file.as_deref().expect("checked"));
                for (_, line) in jsonl::<SampleLine>(&path)? {
                    policy
                        .completions
                        .entry(line.task_id)
                        .or_default()
                        .push(line.completion);
                }
            }
            ReplaySource::Trajectories => {
                let path = suite.resolve(config.trajectories_file.as_deref().expect("checked"));
                for (number, line) in jsonl::<TrajectoryLine>(&path)? {
                    if policy
                        .trajectories
                        .insert((line.task_id.clone(), line.sample_index), line.actions)
                        .is_some()
                    {
                        return Err(PolicyBuildError::File {
                            path,
                            line: number,
                            message: format!("task {:?} sample {} appears twice", line.task_id, line.sample_index),
                        });
                    }
                }
            }
        }
        Ok(policy)
    }

    pub fn params(&self) -> serde_json::Value {
        serde_json::json!({ "source": self.source })
    }

    /// How many samples a task gets.
    pub fn samples_for(&self, task: &Task) -> u32 {
        match self.source {
            ReplaySource::Samples => self.completions.get(&task.id).map(|c| c.len() as u32).unwrap_or(0),
            ReplaySource::Trajectories => self
                .trajectories
                .keys()
                .filter(|(id, _)| *id == task.id)
                .map(|(_, s)| s + 1)
                .max()
                .unwrap_or(0),
            ReplaySource::Reference => self.samples,
        }
    }

    /// The actions of one rollout.
    pub fn actions(&self, task: &Task, sample: u32) -> Result<Vec<Action>, NoActions> {
        match self.source {
            ReplaySource::Reference => {
                let Some(solution) = &task.solution else {
                    return Err(NoActions::NoSolution(task.id.clone()));
                };
                let mut actions: Vec<Action> = solution
                    .files
                    .iter()
                    .map(|f| Action::WriteFile {
                        path: f.path.clone(),
                        content: String::from_utf8_lossy(&f.contents).into_owned(),
                        mode: f.mode,
                    })
                    .collect();
                actions.extend(solution.commands.iter().map(|c| Action::Exec { command: c.clone() }));
                if let Some(answer) = &solution.answer {
                    actions.push(Action::Submit {
                        answer: Some(answer.clone()),
                    });
                }
                Ok(actions)
            }
            ReplaySource::Samples => {
                let completion = self
                    .completions
                    .get(&task.id)
                    .and_then(|c| c.get(sample as usize))
                    .ok_or_else(|| NoActions::NoCompletion {
                        task: task.id.clone(),
                        sample,
                    })?;
                match &task.completion_file {
                    Some(file) => Ok(vec![Action::WriteFile {
                        path: file.clone(),
                        content: format!("{}{completion}", task.completion_prefix),
                        mode: 0o644,
                    }]),
                    None => Ok(vec![Action::Submit {
                        answer: Some(completion.clone()),
                    }]),
                }
            }
            ReplaySource::Trajectories => self
                .trajectories
                .get(&(task.id.clone(), sample))
                .cloned()
                .ok_or_else(|| NoActions::NoTrajectory {
                    task: task.id.clone(),
                    sample,
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trajectory_actions_parse_and_reject_unknown_kinds() {
        let a: Action = serde_json::from_str(r#"{"kind":"exec","command":"ls"}"#).unwrap();
        assert_eq!(a, Action::Exec { command: "ls".into() });
        let w: Action = serde_json::from_str(r#"{"kind":"write_file","path":"a","content":"b"}"#).unwrap();
        assert!(matches!(w, Action::WriteFile { mode: 0o644, .. }));
        assert!(serde_json::from_str::<Action>(r#"{"kind":"launch"}"#).is_err());
    }
}
