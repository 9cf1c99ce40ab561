//! Templates built from Dockerfiles, step by step, each step a content-addressed child
//! snapshot of the one before (as Docker caches layers).
//!
//! `FROM` boots the base image (a registry reference, an archive or a built-in image) into a
//! template snapshot. Each `RUN`, `COPY` and `ADD` forks the snapshot before it, does its
//! work in the fork and snapshots the result under a key over the step before, the
//! instruction with its variables expanded, the environment, user, working folder and shell
//! in force, and the bytes of every file it copies: an unchanged step is found in the store
//! and not run again, and changing one step re-runs it and the steps after it only. `ENV`,
//! `ARG`, `WORKDIR`, `USER` and `SHELL` change the state the next steps run with (and so
//! their keys); `CMD`, `ENTRYPOINT`, `EXPOSE`, `VOLUME`, `LABEL`, `HEALTHCHECK`,
//! `STOPSIGNAL` and `MAINTAINER` are noted and ignored (the agent is the guest's init).
//! `RUN` runs as the current `USER` with the template's egress allowlist; the result's
//! `Env`, `WorkingDir` and `User` are what a converted image's config gives.

mod context;
mod parse;
mod steps;
mod words;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use images::ImageConfig;

use crate::build::BuildError;
use crate::fork::Forker;
use crate::store::{Snapshot, SnapshotStore};
use crate::template::TemplateConfig;

pub use context::ContextError;
use parse::{Args, Raw};

/// What to build.
pub struct DockerfileBuild<'a> {
    /// The Dockerfile (absolute, or relative to the current folder).
    pub dockerfile: &'a Path,
    /// The build context folder.
    pub context: &'a Path,
    /// `--build-arg` values.
    pub build_args: &'a BTreeMap<String, String>,
    /// The stage to build (default: the last).
    pub target: Option<&'a str>,
    /// The build VMs' memory, vCPUs, image size, step time limit and egress.
    pub template: &'a TemplateConfig,
    /// The label step snapshots get in the store.
    pub label: &'a str,
}

/// A built image: the last step's snapshot and the config its commands run with.
pub struct Image {
    pub snapshot: Snapshot,
    pub config: ImageConfig,
    /// Images pulled from registries for `FROM` (and `COPY --from=IMAGE`).
    pub pulled: Vec<images::registry::Pulled>,
}

/// Why a Dockerfile build failed: where, and the step's error.
#[derive(Debug, thiserror::Error)]
#[error("{}, line {line}{}", path.display(), if instruction.is_empty() { String::new() } else { format!(": {instruction}") })]
pub struct DockerfileError {
    pub path: PathBuf,
    pub line: usize,
    /// The instruction as written (its first line, cut at 200 characters).
    pub instruction: String,
    #[source]
    pub kind: Box<StepError>,
}

/// What went wrong in a step.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("reading the Dockerfile failed")]
    Read(#[source] std::io::Error),
    #[error("{0}")]
    Syntax(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Context(#[from] ContextError),
    #[error("building the base image failed")]
    Base(#[source] Box<BuildError>),
    #[error("forking the step before failed")]
    Fork(#[from] crate::fork::ForkError),
    #[error("the build VM's agent failed")]
    Agent(#[from] vmm::AgentError),
    #[error("{what} exited with {status}{}", if stderr.is_empty() { String::new() } else { format!(": {stderr}") })]
    Failed {
        what: String,
        status: String,
        stderr: String,
    },
    #[error("snapshotting the step failed")]
    Snapshot(#[source] Box<BuildError>),
}

/// A stage's state between steps.
#[derive(Clone)]
struct State {
    snapshot: Snapshot,
    env: Vec<(String, String)>,
    /// `ARG`s declared in this stage, with the values in force.
    args: BTreeMap<String, String>,
    workdir: String,
    user: String,
    shell: Vec<String>,
}

impl State {
    /// A variable as the builder expands it: `ENV` over `ARG`.
    fn lookup(&self, name: &str) -> Option<String> {
        self.env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| self.args.get(name).cloned())
    }

    fn set_env(&mut self, key: String, value: String) {
        self.env.retain(|(k, _)| *k != key);
        self.env.push((key, value));
    }

    fn config(&self) -> ImageConfig {
        ImageConfig {
            env: self.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            working_dir: self.workdir.clone(),
            user: self.user.clone(),
        }
    }
}

/// One stage: its name, its `FROM` and its instructions.
#[derive(Debug)]
struct Stage {
    name: Option<String>,
    from: Raw,
    body: Vec<Raw>,
}

/// Builds `spec` (or finds every step in the store), reporting each step to `progress`.
pub async fn build(
    store: &SnapshotStore,
    forker: &Forker,
    spec: &DockerfileBuild<'_>,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Image, DockerfileError> {
    let at = |line: usize, instruction: &str| error_at(spec.dockerfile, line, instruction);
    let text = std::fs::read_to_string(spec.dockerfile).map_err(|e| at(0, "")(StepError::Read(e)))?;
    let raws = parse::parse(&text).map_err(|e| at(e.line, "")(StepError::Syntax(e.message)))?;
    let (global_args, stages) = split_stages(raws).map_err(|(line, e)| at(line, "")(StepError::Syntax(e)))?;
    let globals = global_values(spec, &global_args)?;
    let target = target_stage(&stages, spec.target).map_err(|e| at(0, "")(e))?;
    let needed = needed_stages(&stages, target);
    let context = context::Context::open(spec.context).map_err(|e| at(0, "")(e.into()))?;
    let builder = steps::Builder {
        store,
        forker,
        spec,
        context,
        progress,
        globals,
    };
    let mut built: Vec<Option<State>> = vec![None; stages.len()];
    let mut pulled = Vec::new();
    let total: usize = needed.iter().map(|&i| stages[i].body.len() + 1).sum();
    let mut done = 0;
    for &index in &needed {
        let stage = &stages[index];
        done += 1;
        let from_text = raw_text(&stage.from);
        progress(&format!("[{done}/{total}] {from_text}"));
        let mut state = builder
            .from(&stage.from, &stages, &built, &mut pulled)
            .await
            .map_err(|e| at(stage.from.line, &from_text)(e))?;
        for raw in &stage.body {
            done += 1;
            let text = raw_text(raw);
            progress(&format!("[{done}/{total}] {text}"));
            builder
                .step(&mut state, raw, &stages, &built, &mut pulled)
                .await
                .map_err(|e| at(raw.line, &text)(e))?;
        }
        built[index] = Some(state);
    }
    let last = built[target].take().expect("the target stage was built");
    Ok(Image {
        config: last.config(),
        snapshot: last.snapshot,
        pulled,
    })
}

/// Wraps a step's error with where it happened: the Dockerfile, the line and the instruction
/// (its first line, cut at 200 characters).
fn error_at(dockerfile: &Path, line: usize, instruction: &str) -> impl FnOnce(StepError) -> DockerfileError {
    let path = dockerfile.to_path_buf();
    let instruction: String = instruction
        .lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(200)
        .collect();
    move |kind: StepError| DockerfileError {
        path,
        line,
        instruction,
        kind: Box::new(kind),
    }
}

/// Global ARGs: the values FROM lines see (a build arg over the default).
fn global_values(spec: &DockerfileBuild<'_>, global_args: &[Raw]) -> Result<BTreeMap<String, String>, DockerfileError> {
    let mut globals = BTreeMap::new();
    for raw in global_args {
        for (name, default) in arg_decls(raw).map_err(|e| error_at(spec.dockerfile, raw.line, &raw_text(raw))(e))? {
            if let Some(value) = spec.build_args.get(&name).cloned().or(default) {
                globals.insert(name, value);
            }
        }
    }
    Ok(globals)
}

/// The index of the stage to build: the one named `target`, or the last.
fn target_stage(stages: &[Stage], target: Option<&str>) -> Result<usize, StepError> {
    Ok(match target {
        None => stages.len() - 1,
        Some(name) => stages
            .iter()
            .position(|s| s.name.as_deref().is_some_and(|n| n.eq_ignore_ascii_case(name)))
            .ok_or_else(|| {
                StepError::Invalid(format!(
                    "target {name:?} is not a stage (named stages: {})",
                    stages
                        .iter()
                        .filter_map(|s| s.name.clone())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?,
    })
}

/// The instruction as written (flags and arguments), for messages and keys.
fn raw_text(raw: &Raw) -> String {
    let mut text = raw.keyword.clone();
    for (name, value) in &raw.flags {
        text.push_str(&format!(" --{name}"));
        if let Some(value) = value {
            text.push_str(&format!("={value}"));
        }
    }
    match &raw.args {
        Args::Json(list) => text.push_str(&format!(" {}", serde_json::to_string(list).unwrap_or_default())),
        Args::Text(t) if !t.is_empty() => text.push_str(&format!(" {t}")),
        Args::Text(_) => {}
    }
    text
}

/// The ARGs before the first FROM, and the stages.
fn split_stages(raws: Vec<Raw>) -> Result<(Vec<Raw>, Vec<Stage>), (usize, String)> {
    let mut globals = Vec::new();
    let mut stages: Vec<Stage> = Vec::new();
    for raw in raws {
        match (raw.keyword.as_str(), stages.last_mut()) {
            ("FROM", _) => {
                let words: Vec<&str> = match &raw.args {
                    Args::Text(t) => t.split_whitespace().collect(),
                    Args::Json(_) => Vec::new(),
                };
                let name = match words.as_slice() {
                    [_] => None,
                    [_, kw, name] if kw.eq_ignore_ascii_case("as") => Some(name.to_string()),
                    _ => return Err((raw.line, "FROM takes an image and an optional AS name".into())),
                };
                if name.as_ref().is_some_and(|n| {
                    stages
                        .iter()
                        .any(|s| s.name.as_deref().is_some_and(|m| m.eq_ignore_ascii_case(n)))
                }) {
                    return Err((
                        raw.line,
                        format!("a stage named {:?} comes earlier", name.unwrap_or_default()),
                    ));
                }
                stages.push(Stage {
                    name,
                    from: raw,
                    body: Vec::new(),
                });
            }
            ("ARG", None) => globals.push(raw),
            (keyword, None) => return Err((raw.line, format!("{keyword} comes before the first FROM"))),
            (_, Some(stage)) => stage.body.push(raw),
        }
    }
    if stages.is_empty() {
        return Err((1, "the Dockerfile has no FROM".into()));
    }
    Ok((globals, stages))
}

/// The stages `target` needs (through FROM and COPY --from), in order.
fn needed_stages(stages: &[Stage], target: usize) -> Vec<usize> {
    let by_name = |name: &str| {
        stages
            .iter()
            .position(|s| s.name.as_deref().is_some_and(|n| n.eq_ignore_ascii_case(name)))
            .or_else(|| name.parse::<usize>().ok().filter(|&i| i < stages.len()))
    };
    let mut needed = vec![false; stages.len()];
    let mut pending = vec![target];
    while let Some(i) = pending.pop() {
        if std::mem::replace(&mut needed[i], true) {
            continue;
        }
        let stage = &stages[i];
        let mut refs = Vec::new();
        if let Args::Text(t) = &stage.from.args {
            refs.extend(t.split_whitespace().next().map(str::to_string));
        }
        for raw in &stage.body {
            refs.extend(
                raw.flags
                    .iter()
                    .filter(|(n, _)| n == "from")
                    .filter_map(|(_, v)| v.clone()),
            );
        }
        pending.extend(refs.iter().filter_map(|r| by_name(r)).filter(|&j| j < i));
    }
    (0..stages.len()).filter(|&i| needed[i]).collect()
}

/// `ARG NAME[=default] ...`: names with their defaults.
fn arg_decls(raw: &Raw) -> Result<Vec<(String, Option<String>)>, StepError> {
    let Args::Text(text) = &raw.args else {
        return Err(StepError::Syntax("ARG takes NAME[=default]".into()));
    };
    let items = words::words(text, &|_| None).map_err(|e| StepError::Syntax(e.0))?;
    Ok(items
        .into_iter()
        .map(|item| match item.split_once('=') {
            Some((name, value)) => (name.to_string(), Some(value.to_string())),
            None => (item, None),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_and_what_a_target_needs() {
        let raws = parse::parse("ARG V=1\nFROM a AS base\nRUN x\nFROM b AS unused\nFROM base AS app\nCOPY --from=tools /t /t\nFROM c AS tools\n").unwrap();
        let (globals, stages) = split_stages(raws).unwrap();
        assert_eq!(globals.len(), 1);
        assert_eq!(
            stages.iter().map(|s| s.name.clone().unwrap()).collect::<Vec<_>>(),
            ["base", "unused", "app", "tools"]
        );
        // A stage may only use earlier ones: `tools` comes after `app`, so it is an image name there.
        assert_eq!(needed_stages(&stages, 2), [0, 2]);
        assert_eq!(needed_stages(&stages, 3), [3]);
        let err = split_stages(parse::parse("RUN x\nFROM a\n").unwrap()).unwrap_err();
        assert_eq!(err, (1, "RUN comes before the first FROM".to_string()));
        let err = split_stages(parse::parse("FROM a AS x\nFROM b AS X\n").unwrap()).unwrap_err();
        assert_eq!(err.0, 2);
    }
}
