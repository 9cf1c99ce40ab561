//! Harbor tasks in the engine: each task's environment built into a template of its own
//! (its Dockerfile step by step, or its `docker_image` pulled), and where and as whom its
//! agent acts (the image's `WORKDIR` and `USER`, unless the task says otherwise).

use datasets::harbor::{Environment, AGENT_LOGS, VERIFIER_LOGS};
use datasets::{HarborTask, Task};
use images::ImageConfig;
use snapshotter::{BuildError, Snapshot, TemplateConfig, TemplateError, TemplateExtras};

use crate::config::SuiteConfig;
use crate::host::Host;

/// The disk a task's environment gets when its task.toml gives no `storage` (the image
/// file is sparse).
const DEFAULT_STORAGE_MIB: u64 = 4096;

/// What a task's environment was built from, as the run records it (`summary.json`'s
/// `provenance.environments`, shown by `farm report`): a Dockerfile or an image, every
/// image resolved from a registry on the way (with any override of the host's registry
/// settings), and the `docker_image` that gave way to the Dockerfile, with why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EnvironmentRecord {
    pub built_from: BuiltFrom,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<images::registry::Pulled>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Fallback>,
    /// The environment's template snapshot.
    pub snapshot: String,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BuiltFrom {
    /// `environment/Dockerfile`, step by step.
    Dockerfile,
    /// `[environment] docker_image`.
    Image { reference: String },
}

/// A `docker_image` that could not be had, so the Dockerfile was built instead.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fallback {
    pub image: String,
    pub reason: String,
}

/// Builds (or finds) the template snapshot of a Harbor task's environment; returns it, the
/// config its commands run with, and what it was built from.
pub(crate) async fn environment(
    host: &Host,
    config: &SuiteConfig,
    task: &Task,
    harbor: &HarborTask,
) -> Result<(Snapshot, ImageConfig, EnvironmentRecord), TemplateError> {
    let record = |built_from: BuiltFrom, built: &snapshotter::Built, fallback: Option<Fallback>| EnvironmentRecord {
        built_from,
        images: built.images.clone(),
        fallback,
        snapshot: built.snapshot.id().to_string(),
    };
    let from = |environment: &Environment| match environment {
        Environment::Dockerfile { .. } => BuiltFrom::Dockerfile,
        Environment::Image { reference, .. } => BuiltFrom::Image {
            reference: reference.clone(),
        },
    };
    match (
        &harbor.environment,
        build(host, config, task, harbor, &harbor.environment).await,
    ) {
        // As Harbor: a prebuilt image that cannot be had gives way to the task's Dockerfile.
        (
            Environment::Image {
                reference,
                dockerfile: Some(dockerfile),
            },
            Err(e @ TemplateError::Build(BuildError::Artifacts(_))),
        ) => {
            let reason = crate::errors::describe(&e);
            tracing::warn!(target: "farm::harbor", task = %task.id, "docker_image {reference} could not be pulled ({reason}); building environment/Dockerfile instead");
            let built = build(host, config, task, harbor, dockerfile).await?;
            let fallback = Fallback {
                image: reference.clone(),
                reason,
            };
            let record = record(from(dockerfile), &built, Some(fallback));
            Ok((built.snapshot.clone(), image_config(&built), record))
        }
        (environment, built) => {
            let built = built?;
            let record = record(from(environment), &built, None);
            Ok((built.snapshot.clone(), image_config(&built), record))
        }
    }
}

/// The config a built environment's commands run with.
fn image_config(built: &snapshotter::Built) -> ImageConfig {
    built
        .image_config
        .clone()
        .unwrap_or_else(|| images::config_of(&built.snapshot.manifest.image).unwrap_or_default())
}

async fn build(
    host: &Host,
    config: &SuiteConfig,
    task: &Task,
    harbor: &HarborTask,
    environment: &Environment,
) -> Result<snapshotter::Built, TemplateError> {
    let mut template = TemplateConfig::of_image("");
    let base_dir = match environment {
        Environment::Dockerfile { dir, .. } => {
            template.dockerfile = Some("Dockerfile".into());
            template.context = Some(".".into());
            dir.clone()
        }
        Environment::Image { reference, .. } => {
            template.image = format!("registry:{reference}");
            std::path::PathBuf::from(".")
        }
    };
    template.memory_mib = harbor.memory_mib.unwrap_or(config.template.memory_mib).clamp(64, 65536);
    template.cpus = harbor.cpus.unwrap_or(config.template.cpus).clamp(1, 64);
    template.image_size_mib = Some(harbor.storage_mib.unwrap_or(DEFAULT_STORAGE_MIB).clamp(64, 1 << 20));
    template.setup_timeout_secs = harbor.build_timeout_secs.ceil().max(1.0) as u64;
    template.network = config.harbor.build_network.clone();
    if matches!(environment, Environment::Dockerfile { .. }) {
        template.build_args = config.harbor.build_args.clone();
    }
    // Harbor's log folders, writable by whoever the agent and the verifier run as.
    template.setup = vec![format!("mkdir -p {AGENT_LOGS} {VERIFIER_LOGS} /logs/artifacts && chmod 777 {AGENT_LOGS} {VERIFIER_LOGS} /logs/artifacts")];
    let progress = |line: &str| tracing::info!(target: "farm::harbor", task = %task.id, "{line}");
    host.build_template(&template, &base_dir, &task.id, &TemplateExtras::default(), &progress)
        .await
}

/// Where and as whom a live fork's actions run, with what environment.
#[derive(Debug, Clone)]
pub struct Place {
    /// The folder commands start in and relative paths are taken from.
    pub workdir: String,
    /// The guest user (None: root).
    pub user: Option<String>,
    /// The environment every command gets (also the verifier's base).
    pub env: Vec<(String, String)>,
}

/// A Harbor task's place in its environment: `[environment] workdir` or the image's
/// `WORKDIR` (else `/`), `[agent] user` or the image's `USER`, and the image's `Env` under
/// `[environment.env]`.
pub(crate) fn place(harbor: &HarborTask, image: &ImageConfig) -> Place {
    let workdir = harbor.workdir.clone().filter(|w| !w.is_empty()).unwrap_or_else(|| {
        if image.working_dir.is_empty() {
            "/".into()
        } else {
            image.working_dir.clone()
        }
    });
    let user = harbor
        .agent_user
        .clone()
        .or_else(|| Some(image.user.clone()))
        .filter(|u| !u.is_empty() && u != "root" && u != "0");
    let env = image.env_with(&harbor.env);
    Place { workdir, user, env }
}
