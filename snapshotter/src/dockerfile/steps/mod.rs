//! The steps of a Dockerfile build: each instruction against a stage's state, and the
//! forks and snapshots of the steps that change files. `COPY` and `ADD` are in `copy.rs`.

mod copy;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use vmm::ExecOptions;

use super::context::Context;
use super::parse::{Args, Raw};
use super::{arg_decls, words, DockerfileBuild, Stage, State, StepError};
use crate::build::{build_image_template, TemplateExtras};
use crate::build_fork::BuildFork;
use crate::child::child_id;
use crate::fork::{Fork, Forker};
use crate::store::SnapshotStore;
use crate::template::TemplateConfig;

/// The size a base image converted for a build gets unless the template says otherwise:
/// room for what `RUN` installs (the file is sparse).
const BUILD_IMAGE_MIB: u64 = 4096;
/// Docker's `PATH` for `RUN` when the image sets none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub(super) struct Builder<'a> {
    pub store: &'a SnapshotStore,
    pub forker: &'a Forker,
    pub spec: &'a DockerfileBuild<'a>,
    pub context: Context,
    pub progress: &'a (dyn Fn(&str) + Sync),
    pub globals: BTreeMap<String, String>,
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn join(dir: &str, rel: &str) -> String {
    if rel.starts_with('/') {
        return rel.to_string();
    }
    let dir = dir.trim_end_matches('/');
    if rel.is_empty() {
        return if dir.is_empty() { "/".into() } else { dir.to_string() };
    }
    format!("{dir}/{rel}")
}

impl Builder<'_> {
    /// The state a `FROM` starts: an earlier stage's end, or a base image booted.
    pub async fn from(
        &self,
        raw: &Raw,
        stages: &[Stage],
        built: &[Option<State>],
        pulled: &mut Vec<images::registry::Pulled>,
    ) -> Result<State, StepError> {
        for (name, value) in &raw.flags {
            match (name.as_str(), value.as_deref()) {
                (
                    "platform",
                    Some(
                        "linux/amd64" | "$BUILDPLATFORM" | "${BUILDPLATFORM}" | "$TARGETPLATFORM" | "${TARGETPLATFORM}",
                    ),
                ) => {}
                (name, value) => {
                    return Err(StepError::Unsupported(format!(
                        "FROM --{name}{}: farm builds linux/amd64 only",
                        value.map(|v| format!("={v}")).unwrap_or_default()
                    )))
                }
            }
        }
        let Args::Text(text) = &raw.args else {
            return Err(StepError::Syntax("FROM takes an image".into()));
        };
        let first = text.split_whitespace().next().unwrap_or_default();
        let image = words::word(first, &|n| self.globals.get(n).cloned()).map_err(|e| StepError::Invalid(e.0))?;
        if let Some(state) = earlier_stage(&image, stages, built) {
            return Ok(State {
                args: BTreeMap::new(),
                ..state
            });
        }
        self.base(&image, pulled).await
    }

    /// A base image's template snapshot, and the state its config gives.
    async fn base(&self, image: &str, pulled: &mut Vec<images::registry::Pulled>) -> Result<State, StepError> {
        let dir = self.spec.dockerfile.parent().unwrap_or(std::path::Path::new("."));
        let spec = image_spec(image, dir, self.spec.template.confined)?;
        let mut template = TemplateConfig::of_image(&spec);
        template.memory_mib = self.spec.template.memory_mib;
        template.cpus = self.spec.template.cpus;
        template.image_size_mib = Some(self.spec.template.image_size_mib.unwrap_or(BUILD_IMAGE_MIB));
        template
            .validate(dir)
            .map_err(|e| StepError::Base(Box::new(e.into())))?;
        let built = Box::pin(build_image_template(
            self.store,
            self.forker,
            &template,
            dir,
            self.spec.label,
            &TemplateExtras::default(),
            self.progress,
        ))
        .await
        .map_err(|e| StepError::Base(Box::new(e)))?;
        pulled.extend(built.pulled);
        let config = images::config_of(&built.snapshot.manifest.image).unwrap_or_default();
        Ok(State {
            snapshot: built.snapshot,
            env: config
                .env
                .iter()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            args: BTreeMap::new(),
            workdir: if config.working_dir.is_empty() {
                "/".into()
            } else {
                config.working_dir
            },
            user: config.user,
            shell: vec!["/bin/sh".into(), "-c".into()],
        })
    }

    /// One instruction after `FROM`.
    pub async fn step(
        &self,
        state: &mut State,
        raw: &Raw,
        stages: &[Stage],
        built: &[Option<State>],
        pulled: &mut Vec<images::registry::Pulled>,
    ) -> Result<(), StepError> {
        let text = match &raw.args {
            Args::Text(t) => t.clone(),
            Args::Json(_) => String::new(),
        };
        let lookup = |s: &State| {
            let s = s.clone();
            move |name: &str| s.lookup(name)
        };
        match raw.keyword.as_str() {
            "ENV" => {
                for (key, value) in words::pairs(&text, &lookup(state)).map_err(|e| StepError::Invalid(e.0))? {
                    state.set_env(key, value);
                }
            }
            "ARG" => {
                for (name, default) in arg_decls(raw)? {
                    let value = self
                        .spec
                        .build_args
                        .get(&name)
                        .cloned()
                        .or(default)
                        .or_else(|| self.globals.get(&name).cloned());
                    if let Some(value) = value {
                        state.args.insert(name, value);
                    }
                }
            }
            "WORKDIR" => {
                let dir = words::word(&text, &lookup(state)).map_err(|e| StepError::Invalid(e.0))?;
                state.workdir = join(&state.workdir, &dir);
            }
            "USER" => state.user = words::word(&text, &lookup(state)).map_err(|e| StepError::Invalid(e.0))?,
            "SHELL" => match &raw.args {
                Args::Json(list) if !list.is_empty() => state.shell = list.clone(),
                _ => return Err(StepError::Syntax("SHELL takes a JSON array of strings".into())),
            },
            "RUN" => self.run(state, raw).await?,
            "COPY" | "ADD" => self.copy(state, raw, stages, built, pulled).await?,
            "CMD" | "ENTRYPOINT" | "EXPOSE" | "VOLUME" | "LABEL" | "HEALTHCHECK" | "STOPSIGNAL" | "MAINTAINER" => {
                (self.progress)(&format!(
                    "  {} is not used: farm's agent is the guest's init",
                    raw.keyword
                ));
            }
            keyword => return Err(StepError::Unsupported(format!("{keyword} is not supported"))),
        }
        Ok(())
    }

    async fn run(&self, state: &mut State, raw: &Raw) -> Result<(), StepError> {
        if let Some((name, _)) = raw.flags.first() {
            return Err(StepError::Unsupported(format!("RUN --{name} is not supported")));
        }
        let program = match &raw.args {
            Args::Json(argv) => vm_program(argv.clone(), None),
            Args::Text(text) => {
                let only_heredoc = raw.heredocs.len() == 1
                    && text
                        .trim()
                        .trim_start_matches("<<")
                        .trim_start_matches('-')
                        .trim_matches(['\'', '"'])
                        == raw.heredocs[0].delimiter;
                let script = if only_heredoc {
                    raw.heredocs[0].body.clone()
                } else {
                    let mut script = text.clone();
                    for doc in &raw.heredocs {
                        script.push('\n');
                        script.push_str(&doc.body);
                        script.push_str(&doc.delimiter);
                    }
                    script
                };
                vm_program(state.shell.clone(), Some(script))
            }
        };
        let mut env = state.env.clone();
        for (name, value) in &state.args {
            if !env.iter().any(|(k, _)| k == name) {
                env.push((name.clone(), value.clone()));
            }
        }
        if !env.iter().any(|(k, _)| k == "PATH") {
            env.push(("PATH".into(), DEFAULT_PATH.into()));
        }
        let key = json!({ "op": "RUN", "argv": program, "env": env, "user": state.user, "workdir": state.workdir });
        let Some(step) = self.begin(state, &key).await? else {
            return Ok(());
        };
        let fork = &step.1;
        let attempts: Arc<Mutex<Vec<String>>> = Default::default();
        let network = &self.spec.template.network;
        if !network.is_empty() {
            let sink = attempts.clone();
            fork.machine.set_network(egress::Policy {
                allow: network.allow.clone(),
                log: Some(Arc::new(move |attempt: &egress::Attempt| {
                    sink.lock().unwrap_or_else(|e| e.into_inner()).push(attempt.to_string())
                })),
                rules: Default::default(),
            });
            env.extend(network.proxy_env());
        }
        let options = ExecOptions {
            env,
            cwd: Some(state.workdir.clone()),
            user: user_of(&state.user),
            timeout: Some(Duration::from_secs(self.spec.template.setup_timeout_secs)),
            stdout_cap: 1 << 20,
            stderr_cap: 1 << 20,
            ..ExecOptions::argv(&program)
        };
        let out = fork.agent().exec(options).await;
        for line in attempts.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            (self.progress)(&format!("  {line}"));
        }
        check("the command", out?, self.spec.template.setup_timeout_secs)?;
        fork.machine.set_network(egress::Policy::default());
        self.commit(state, step).await
    }

    /// The step's id, and a fork to do it in; None when the store holds the step already
    /// (the state then moves to it).
    async fn begin(
        &self,
        state: &mut State,
        key: &serde_json::Value,
    ) -> Result<Option<(String, BuildFork, Instant)>, StepError> {
        let id = child_id(&state.snapshot, &serde_json::to_vec(key).expect("keys serialize"));
        if let Ok(existing) = self.store.get(&id) {
            if existing.check_files().is_ok() {
                (self.progress)(&format!("  cached ({id})"));
                state.snapshot = existing;
                return Ok(None);
            }
        }
        let started = Instant::now();
        let fork = self
            .forker
            .build_fork(self.store, &state.snapshot, &self.build_label())
            .await?;
        self.sh(
            &fork,
            format!("mkdir -p {}", quote(&state.workdir)),
            "creating the WORKDIR",
        )
        .await?;
        Ok(Some((id, fork, started)))
    }

    /// Snapshots the step's fork as the stage's new state.
    async fn commit(
        &self,
        state: &mut State,
        (id, fork, started): (String, BuildFork, Instant),
    ) -> Result<(), StepError> {
        state.snapshot = fork
            .commit(self.store, self.forker, &state.snapshot, &self.build_label(), &id)
            .await
            .map_err(|e| StepError::Snapshot(Box::new(e)))?;
        (self.progress)(&format!("  done in {:.1} s ({id})", started.elapsed().as_secs_f64()));
        Ok(())
    }

    /// The label of the steps' snapshots.
    fn build_label(&self) -> String {
        format!("{}-build", self.spec.label)
    }

    async fn sh(&self, fork: &Fork, script: String, what: &str) -> Result<vmm::ExecOutput, StepError> {
        let options = ExecOptions {
            timeout: Some(Duration::from_secs(self.spec.template.setup_timeout_secs)),
            ..ExecOptions::shell(script)
        };
        check(
            what,
            fork.agent().exec(options).await?,
            self.spec.template.setup_timeout_secs,
        )
    }
}

/// An exit code 0, or the failure with the end of its standard error.
fn check(what: &str, out: vmm::ExecOutput, timeout_secs: u64) -> Result<vmm::ExecOutput, StepError> {
    if out.result.exit_code == Some(0) {
        return Ok(out);
    }
    let status = if out.result.timed_out {
        format!("a timeout after {timeout_secs} s")
    } else {
        format!("exit code {}", out.shell_exit_code())
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
    Err(StepError::Failed {
        what: what.to_string(),
        status,
        stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
    })
}

/// The argv of a RUN: exec form as given, shell form as SHELL + script.
fn vm_program(mut argv: Vec<String>, script: Option<String>) -> Vec<String> {
    argv.extend(script);
    argv
}

/// The user a step runs as (root when unset).
fn user_of(user: &str) -> Option<String> {
    (!user.is_empty() && user != "root" && user != "0").then(|| user.to_string())
}

/// A stage built earlier, by name or index.
fn earlier_stage(name: &str, stages: &[Stage], built: &[Option<State>]) -> Option<State> {
    let index = stages
        .iter()
        .position(|s| s.name.as_deref().is_some_and(|n| n.eq_ignore_ascii_case(name)))
        .or_else(|| name.parse::<usize>().ok());
    index.and_then(|i| built.get(i)).and_then(|s| s.clone())
}

/// The farm image spec of a `FROM`: `farm:minimal` and `farm:python` are the built-in
/// images, farm's own schemes (`oci-archive:` ...) pass as they are, and anything else is a
/// registry reference. `confined`: the Dockerfile is not the host's own, and may name no
/// host path (farm's schemes other than `registry:` are refused).
fn image_spec(from: &str, dir: &std::path::Path, confined: bool) -> Result<String, StepError> {
    if from == "scratch" {
        return Err(StepError::Unsupported(
            "FROM scratch: a farm image needs a base with a shell; start FROM an image".into(),
        ));
    }
    if let Some(name) = from.strip_prefix("farm:") {
        return Ok(name.to_string());
    }
    let farm_scheme = ["oci-archive:", "docker-archive:", "oci:", "rootfs:", "registry:"]
        .iter()
        .any(|p| from.starts_with(p));
    if confined && farm_scheme && !from.starts_with("registry:") {
        return Err(StepError::Unsupported(format!(
            "FROM {from}: this Dockerfile may name registry images and farm:minimal, farm:python or farm:code-interpreter only (no host paths)"
        )));
    }
    let spec = if farm_scheme {
        from.to_string()
    } else {
        format!("registry:{from}")
    };
    let source = images::ImageSource::parse(&spec, dir).map_err(|e| StepError::Invalid(e.to_string()))?;
    Ok(source.spec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_images() {
        assert_eq!(join("/app", "src"), "/app/src");
        assert_eq!(join("/app/", "/etc/x"), "/etc/x");
        assert_eq!(join("/", ""), "/");
        let dir = std::path::Path::new("/ctx");
        assert_eq!(
            image_spec("python:3.12-slim", dir, false).unwrap(),
            "registry:python:3.12-slim"
        );
        assert_eq!(image_spec("farm:python", dir, false).unwrap(), "python");
        assert_eq!(
            image_spec("oci-archive:base.tar", dir, false).unwrap(),
            "oci-archive:/ctx/base.tar"
        );
        assert!(image_spec("scratch", dir, false).is_err());
        // A client's Dockerfile names no host path.
        for host in ["oci-archive:/etc/x.tar", "docker-archive:d.tar", "oci:/srv", "rootfs:/"] {
            assert!(image_spec(host, dir, true).is_err(), "{host}");
        }
        assert_eq!(image_spec("farm:python", dir, true).unwrap(), "python");
        assert!(image_spec("registry:ghcr.io/o/i:1", dir, true).is_ok());
        assert_eq!(quote("it's"), "'it'\\''s'");
        assert_eq!(user_of("root"), None);
        assert_eq!(user_of("1000:1000").as_deref(), Some("1000:1000"));
    }
}
