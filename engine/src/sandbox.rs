//! Sandboxes: live forks of an environment's snapshot that a client drives itself (the
//! sandbox API of `farm serve`): no task, no verdict. An environment is any template
//! snapshot (an image, or a Dockerfile's build, or a sandbox snapshotted again); its image
//! config gives the working folder, user and variables, and the client's settings come on
//! top. A sandbox is a [`Session`] without a task ([`Host::open_sandbox`]): its branches,
//! pauses and resumes are a session's.

use std::sync::Arc;

use snapshotter::{ForkIdentity, Snapshot};

use crate::errors::describe;
use crate::harbor::Place;
use crate::host::Host;
use crate::live::{ca_env, install_ca, LiveFork};
use crate::metrics::{Role, VmGauge};
use crate::session::Session;

/// What a client asks of a sandbox's fork.
#[derive(Clone, Default)]
pub struct SandboxSpec {
    /// Variables every command gets, over the image's.
    pub env: Vec<(String, String)>,
    /// Where commands start (default: the image's `WORKDIR`, else `/`).
    pub workdir: Option<String>,
    /// Who commands run as (default: the image's `USER`, else root).
    pub user: Option<String>,
    /// Its egress (None: no network), one of the service's named policies.
    pub network: Option<egress::Policy>,
    /// How far its disk may grow past the environment's.
    pub max_disk_bytes: Option<u64>,
}

/// Why a sandbox could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("forking the environment's snapshot")]
    Fork(#[from] snapshotter::ForkError),
    #[error(transparent)]
    Ca(#[from] crate::live::CaInstallError),
}

impl Host {
    /// A sandbox: a live fork of `snapshot` (an environment) as `spec` says, with `image`'s
    /// config under it. `pool`: a warm pool of that snapshot to take the fork from, when
    /// there is one, and the sandbox's owner (it takes only its own VMs given back).
    pub async fn open_sandbox(
        self: &Arc<Self>,
        snapshot: &Arc<Snapshot>,
        image: &images::ImageConfig,
        spec: &SandboxSpec,
        seed: u64,
        pool: Option<(&snapshotter::WarmPool, u64)>,
    ) -> Result<Session, SandboxError> {
        let env = image.env_with(spec.env.iter().map(|(k, v)| (k, v)));
        let place = Place {
            workdir: spec
                .workdir
                .clone()
                .or_else(|| (!image.working_dir.is_empty()).then(|| image.working_dir.clone()))
                .unwrap_or_else(|| "/".into()),
            user: spec
                .user
                .clone()
                .or_else(|| Some(image.user.clone()))
                .filter(|u| !u.is_empty() && u != "root" && u != "0"),
            env: env.clone(),
        };
        let mut identity_env = env;
        if let Some(network) = &spec.network {
            identity_env.extend(snapshotter::template::proxy_env());
            identity_env.extend(ca_env(network));
        }
        let identity = ForkIdentity {
            env: identity_env,
            ..ForkIdentity::new(seed)
        };
        let forker = self.sandbox_forker(spec.max_disk_bytes);
        let mut fork = match pool {
            Some((pool, owner)) => pool.fork_for(identity, owner).await?,
            None => forker.fork(snapshot, identity).await?,
        };
        if let Some(limit) = spec.max_disk_bytes {
            fork.machine.limit_disk_growth(limit);
        }
        let network = spec.network.clone().unwrap_or_default();
        install_ca(&fork, &network).await?;
        fork.machine.set_network(network.clone());
        let live = LiveFork::new(fork, Arc::new(Vec::new()), place, VmGauge::new(Role::Sandbox));
        Ok(Session::sandbox(self.clone(), forker, network, snapshot.clone(), live))
    }
}

impl Host {
    /// The forker of sandboxes: resettable forks ([`Session::reset`]), with their disk limit.
    pub fn sandbox_forker(&self, max_disk_bytes: Option<u64>) -> snapshotter::Forker {
        snapshotter::Forker {
            resettable: true,
            ..self.forker_limited(max_disk_bytes)
        }
    }

    /// A sandbox of an earlier process, paused, from its saved state (a fork of the
    /// environment `snapshot` that `spec` described).
    pub fn paused_sandbox(
        self: &Arc<Self>,
        snapshot: &Arc<Snapshot>,
        spec: &SandboxSpec,
        paused: crate::pause::PausedFork,
    ) -> Session {
        let forker = self.sandbox_forker(spec.max_disk_bytes);
        let network = spec.network.clone().unwrap_or_default();
        Session::paused_sandbox(self.clone(), forker, network, snapshot.clone(), paused)
    }
}

impl SandboxError {
    /// The error and its causes, on one line.
    pub fn describe(&self) -> String {
        describe(self)
    }
}

/// Why a sandbox could not be snapshotted into an environment.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotSandboxError {
    #[error("a sandbox resumed from a pause cannot be snapshotted (its state lives in its pause folder, which goes with it): snapshot it before pausing, or branch it from an environment snapshotted before")]
    Resumed,
    #[error("snapshotting the sandbox")]
    Snapshot(#[from] snapshotter::BuildError),
    #[error(transparent)]
    NotLive(#[from] crate::session::SessionCallError),
}

impl Session {
    /// A new template snapshot of this sandbox in the host's store: a child of the snapshot
    /// its fork came from. The sandbox goes on.
    pub async fn snapshot_into_environment(&self) -> Result<Snapshot, SnapshotSandboxError> {
        let live = self.live()?;
        let parent = match live.origin() {
            Some(branch) if branch.is_paused_state() => return Err(SnapshotSandboxError::Resumed),
            Some(branch) => branch.snapshot.clone(),
            None => (**self.snapshot()).clone(),
        };
        let host = self.host();
        self.changes.note(crate::session::Change::Snapshot);
        Ok(snapshotter::snapshot_fork(&host.store, &host.forker, &parent, &live.fork, "sandbox", None, true).await?)
    }
}

impl SnapshotSandboxError {
    /// The error and its causes, on one line.
    pub fn describe(&self) -> String {
        describe(self)
    }
}

/// What a sandbox environment is built from: the third kind of environment, beside a suite's
/// template and a Harbor task's, made on demand by the sandbox API.
#[derive(Debug, Clone, PartialEq)]
pub enum EnvironmentSource {
    /// A built-in image (`minimal`, `python`) or a registry reference (`registry:REF`).
    Image(String),
    /// A Dockerfile at `path` in the build context `context` (a folder on the host, the
    /// client's upload unpacked as data), built step by step and confined to its context
    /// (no host paths in `FROM` or `COPY --from`).
    Dockerfile {
        context: std::path::PathBuf,
        path: String,
        build_args: std::collections::BTreeMap<String, String>,
        target: Option<String>,
    },
}

/// A sandbox environment's recipe.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvironmentRecipe {
    pub source: EnvironmentSource,
    pub cpus: u32,
    pub memory_mib: u32,
    pub disk_mib: Option<u64>,
    /// Shell commands run once, before the snapshot.
    pub setup: Vec<String>,
    /// Egress of the build's commands (a Dockerfile's `RUN`s, `setup`).
    pub network: snapshotter::Network,
}

/// A ready environment: its snapshot, and what its commands run with.
#[derive(Clone)]
pub struct Ready {
    pub snapshot: Arc<Snapshot>,
    pub image: images::ImageConfig,
}

/// Where a build failed, for the client: the message, and for a Dockerfile its line,
/// instruction and the end of the step's output.
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct BuildFailure {
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dockerfile_line: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instruction: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tail: Option<String>,
}

impl BuildFailure {
    /// A failure that is only a message.
    pub fn plain(message: String) -> BuildFailure {
        BuildFailure {
            message,
            dockerfile_line: None,
            instruction: None,
            output_tail: None,
        }
    }

    fn of(e: snapshotter::TemplateError) -> BuildFailure {
        let message = describe(&e);
        match &e {
            snapshotter::TemplateError::Dockerfile(d) => BuildFailure {
                message,
                dockerfile_line: Some(d.line),
                instruction: Some(d.instruction.clone()),
                output_tail: match d.kind.as_ref() {
                    snapshotter::dockerfile::StepError::Failed { stderr, .. } if !stderr.is_empty() => {
                        Some(stderr.clone())
                    }
                    _ => None,
                },
            },
            _ => BuildFailure::plain(message),
        }
    }
}

impl Host {
    /// Builds a sandbox environment's template (or finds the one with the same content),
    /// labelled `label` in the store; `scratch` is a folder to build an image's template in.
    pub async fn build_environment(
        &self,
        recipe: &EnvironmentRecipe,
        label: &str,
        scratch: &std::path::Path,
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<Ready, BuildFailure> {
        let mut template = snapshotter::TemplateConfig::of_image("");
        let base_dir = match &recipe.source {
            EnvironmentSource::Image(image) => {
                template.image = image.clone();
                scratch.to_path_buf()
            }
            EnvironmentSource::Dockerfile {
                context,
                path,
                build_args,
                target,
            } => {
                template.dockerfile = Some(path.into());
                template.context = Some(".".into());
                template.build_args = build_args.clone();
                template.target = target.clone();
                template.confined = true;
                context.clone()
            }
        };
        template.cpus = recipe.cpus;
        template.memory_mib = recipe.memory_mib;
        template.image_size_mib = recipe.disk_mib;
        template.setup = recipe.setup.clone();
        template.setup_timeout_secs = 3600;
        template.network = recipe.network.clone();
        let built = self
            .build_template(&template, &base_dir, label, &Default::default(), progress)
            .await
            .map_err(BuildFailure::of)?;
        let image = built
            .image_config
            .clone()
            .unwrap_or_else(|| images::config_of(&built.snapshot.manifest.image).unwrap_or_default());
        Ok(Ready {
            snapshot: Arc::new(built.snapshot),
            image,
        })
    }

    /// Warm forks of a ready environment, as many as `size` says (None when the pool could
    /// not start: said in the log, and sandboxes fork without it).
    pub fn environment_pool(
        &self,
        id: &str,
        ready: &Ready,
        size: snapshotter::PoolSize,
    ) -> Option<snapshotter::WarmPool> {
        // Sandboxes' clients send shell commands and argv ones.
        let warm_up = snapshotter::WarmUp {
            argv: true,
            ..snapshotter::WarmUp::shell("true")
        };
        match self.start_pool(self.sandbox_forker(None), &ready.snapshot, size, warm_up) {
            Ok(pool) => Some(pool),
            Err(e) => {
                tracing::warn!("environment {id}: no warm pool: {e}");
                None
            }
        }
    }
}
