//! Environments of the sandbox API: template snapshots made on demand from an image
//! reference or an uploaded Dockerfile build context, or snapshotted from a sandbox.
//!
//! An environment's id is a digest of what it is made of (the request, and the context's
//! content), so the same content gives the same environment, and a second request for it
//! reuses the first (or waits for its build). Builds run in the background; their progress is
//! a list of lines a client reads while they run. A ready environment is recorded in
//! `environments/<id>.json`, which pins its snapshot through `farm snapshot gc` and makes it
//! known again after a restart. Failed builds are not recorded: asking again builds again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine::snapshots::{Network, Snapshot};
use images::ImageConfig;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

mod owned;
mod pools;
mod spec;

pub use spec::{EnvironmentRequest, Source, Spec};

use super::contexts::Contexts;
use crate::error::{ApiError, ApiResult};
use crate::wire::{EnvironmentView, LogPage};
use owned::Owned;

/// Lines of build progress kept per environment (the first and the last ones).
const MAX_LOG_LINES: usize = 5000;
/// Version of `environments/<id>.json`.
const RECORD_VERSION: u32 = 1;

use crate::error::ErrorKind;
pub use engine::sandbox::{BuildFailure, Ready};

#[derive(Clone)]
enum State {
    Building,
    Ready(Ready),
    Failed(BuildFailure),
}

/// `environments/<id>.json`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    format_version: u32,
    id: String,
    spec: Spec,
    created_at_ms: u64,
    snapshot: String,
    image: ImageConfig,
}

/// One environment: its spec, state and build log.
pub struct Environment {
    pub id: String,
    pub spec: Spec,
    pub created_at_ms: u64,
    state: Mutex<State>,
    log: Mutex<Vec<String>>,
    /// Bumped on every log line and state change (readers wait on it).
    changed: watch::Sender<u64>,
    /// Warm forks of its snapshot, and its sandboxes' VMs given back for a reset (made when
    /// it becomes ready in this process, or when its first sandbox is: [`pools`]).
    pool: tokio::sync::OnceCell<Option<engine::snapshots::WarmPool>>,
    /// Live sandboxes made from it.
    pub(crate) sandboxes: std::sync::atomic::AtomicUsize,
    /// Set for an environment made by snapshotting a sandbox, whose snapshot is its own.
    owned: Option<Owned>,
    /// How long its build took, once a build of this process ended.
    built_in_ms: std::sync::OnceLock<u64>,
}

impl Environment {
    fn new(id: String, spec: Spec, created_at_ms: u64, state: State) -> Environment {
        Environment {
            id,
            spec,
            created_at_ms,
            state: Mutex::new(state),
            log: Mutex::new(Vec::new()),
            changed: watch::channel(0).0,
            pool: tokio::sync::OnceCell::new(),
            sandboxes: Default::default(),
            owned: None,
            built_in_ms: std::sync::OnceLock::new(),
        }
    }

    /// How long its build took, if this process built it and the build ended (a tenant that
    /// asks for the same content waits as long).
    pub fn built_in_ms(&self) -> Option<u64> {
        self.built_in_ms.get().copied()
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    fn push_log(&self, line: &str) {
        {
            let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
            if log.len() < MAX_LOG_LINES {
                log.push(line.to_string());
            } else {
                let last = log.len() - 1;
                log[last] = format!("(lines past {MAX_LOG_LINES} left out) {line}");
            }
        }
        self.bump();
    }

    fn set_state(&self, state: State) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = state;
        self.bump();
    }

    /// Still building (a tenant's view waits for this, and for its own visibility).
    pub fn is_building(&self) -> bool {
        matches!(self.state(), State::Building)
    }

    /// The folder of its snapshot, once ready (the disk a tenant's quota counts).
    pub fn snapshot_dir(&self) -> Option<std::path::PathBuf> {
        match self.state() {
            State::Ready(r) => Some(r.snapshot.dir.clone()),
            _ => None,
        }
    }

    fn state(&self) -> State {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The snapshot to fork, or 409 while it builds or when it failed.
    pub fn ready(&self, field: &str) -> ApiResult<Ready> {
        match self.state() {
            State::Ready(ready) => Ok(ready),
            State::Building => Err(ApiError::field(
                ErrorKind::Conflict,
                field,
                format!(
                    "environment {} is still building (GET /v1/environments/{}/logs)",
                    self.id, self.id
                ),
            )),
            State::Failed(f) => Err(ApiError::field(
                ErrorKind::Conflict,
                field,
                format!("environment {} failed to build: {}", self.id, f.message),
            )),
        }
    }

    /// What a client sees.
    pub fn view(&self) -> EnvironmentView {
        let (state, snapshot, error) = match self.state() {
            State::Building => ("building", None, None),
            State::Ready(r) => ("ready", Some(r.snapshot.id().to_string()), None),
            State::Failed(f) => ("failed", None, Some(f)),
        };
        EnvironmentView {
            id: self.id.clone(),
            state: state.to_string(),
            spec: serde_json::to_value(&self.spec).expect("specs serialize"),
            cpus: self.spec.cpus,
            memory_mib: self.spec.memory_mib,
            created_at_ms: self.created_at_ms,
            log_lines: self.log.lock().unwrap_or_else(|p| p.into_inner()).len(),
            snapshot,
            error,
            sandboxes: self.sandboxes.load(std::sync::atomic::Ordering::SeqCst),
            warm: self.pool.get().and_then(Option::as_ref).map(|p| p.ready()).unwrap_or(0),
            pool: self.pool.get().and_then(Option::as_ref).map(|p| p.counts()),
        }
    }
}

/// The registry of environments.
pub struct Environments {
    host: Arc<engine::Host>,
    /// The snapshot store (the host's).
    store: engine::snapshots::SnapshotStore,
    /// `OUT/sandboxes/environments`: one record per ready environment (each pins its snapshot).
    dir: PathBuf,
    pub contexts: Contexts,
    build_network: Network,
    all: Mutex<HashMap<String, Arc<Environment>>>,
    /// How many warm forks each environment's pool keeps ([`pools`]).
    pool_size: engine::snapshots::PoolSize,
}

impl Environments {
    /// The registry in `root` (`root/environments`, `root/contexts`), with the environments
    /// a previous process recorded whose snapshots are still in the store.
    pub fn open(
        host: Arc<engine::Host>,
        settings: &super::SandboxSection,
        root: &Path,
        memory_reserve_percent: u64,
    ) -> anyhow::Result<Environments> {
        use anyhow::Context as _;
        let dir = root.join("environments");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let store = host.store.clone();
        let mut all = HashMap::new();
        for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let loaded = std::fs::read_to_string(&path)
                .map_err(anyhow::Error::from)
                .and_then(|t| Ok(serde_json::from_str::<Record>(&t)?));
            let record = match loaded {
                Ok(r) if r.format_version == RECORD_VERSION => r,
                Ok(r) => {
                    tracing::warn!(
                        "{}: format version {} (this farm reads {RECORD_VERSION}); left alone",
                        path.display(),
                        r.format_version
                    );
                    continue;
                }
                Err(e) => {
                    tracing::warn!("{}: not an environment record ({e}); left alone", path.display());
                    continue;
                }
            };
            match store.get(&record.snapshot) {
                Ok(snapshot) => {
                    // A sandbox's state is the environment's own, as when it was made; the
                    // branch it came from is a previous process's, left to `farm snapshot gc`.
                    let owned = matches!(record.spec.source, Source::Sandbox { .. }).then(|| Owned {
                        store: store.clone(),
                        snapshot: snapshot.id().to_string(),
                        deleted: Default::default(),
                        _origin: None,
                    });
                    let ready = Ready {
                        snapshot: Arc::new(snapshot),
                        image: record.image,
                    };
                    let env = Environment {
                        owned,
                        ..Environment::new(
                            record.id.clone(),
                            record.spec,
                            record.created_at_ms,
                            State::Ready(ready),
                        )
                    };
                    all.insert(record.id, Arc::new(env));
                }
                Err(e) => {
                    tracing::warn!("environment {}: its snapshot is gone ({e}); forgotten", record.id);
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        if !all.is_empty() {
            tracing::info!("sandboxes: {} environments kept from before", all.len());
        }
        Ok(Environments {
            contexts: Contexts::open(root, settings.max_context_mib << 20)?,
            store,
            host,
            dir,
            build_network: settings.build_network.clone(),
            all: Mutex::new(all),
            pool_size: pools::size(settings, memory_reserve_percent),
        })
    }

    fn record_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// An environment by id, or 404 naming `field`.
    pub fn get(&self, id: &str, field: &str) -> ApiResult<Arc<Environment>> {
        self.all
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
            .ok_or_else(|| ApiError::field(ErrorKind::NotFound, field, format!("no environment {id:?}")))
    }

    pub fn list(&self) -> Vec<EnvironmentView> {
        let mut all: Vec<Arc<Environment>> = self
            .all
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        all.sort_by_key(|e| (e.created_at_ms, e.id.clone()));
        all.iter().map(|e| e.view()).collect()
    }

    /// The id the environment `request` asks for would have (None: the request is bad; its
    /// create says why).
    pub fn id_of(&self, request: &EnvironmentRequest) -> Option<String> {
        self.spec_of(request).ok().map(|spec| spec.id())
    }

    /// `POST /v1/environments`: the environment (true when this request started its build).
    pub fn create(self: &Arc<Self>, request: EnvironmentRequest) -> ApiResult<(Arc<Environment>, bool)> {
        let spec = self.spec_of(&request)?;
        let id = spec.id();
        let env = {
            let mut all = self.all.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(existing) = all.get(&id) {
                let rebuild = match existing.state() {
                    State::Building => false,
                    State::Failed(_) => true,
                    State::Ready(_) => request.force,
                };
                if !rebuild {
                    self.warm(existing);
                    return Ok((existing.clone(), false));
                }
                if existing.sandboxes.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                    return Err(ApiError::field(
                        ErrorKind::Conflict,
                        "force",
                        format!("environment {id} has live sandboxes: delete them before building it again"),
                    ));
                }
            }
            let env = Arc::new(Environment::new(
                id.clone(),
                spec,
                engine::row::now_ms() as u64,
                State::Building,
            ));
            all.insert(id, env.clone());
            env
        };
        let this = self.clone();
        let building = env.clone();
        tokio::spawn(async move { this.build(building).await });
        Ok((env, true))
    }

    /// Builds `env` and records the outcome.
    async fn build(self: &Arc<Self>, env: Arc<Environment>) {
        let started = std::time::Instant::now();
        let progress = |line: &str| env.push_log(line);
        let outcome = self.build_snapshot(&env, &progress).await;
        let outcome = outcome.and_then(|ready| self.record(&env, &ready).map(|()| ready));
        let _ = env.built_in_ms.set(started.elapsed().as_millis() as u64);
        match outcome {
            Ok(ready) => {
                progress(&format!(
                    "ready in {:.1} s: snapshot {}",
                    started.elapsed().as_secs_f64(),
                    ready.snapshot.id()
                ));
                tracing::info!("sandboxes: environment {} ready", env.id);
                env.set_state(State::Ready(ready));
                self.warm(&env);
            }
            Err(failure) => {
                progress(&format!("failed: {}", failure.message));
                tracing::warn!("sandboxes: environment {} failed: {}", env.id, failure.message);
                env.set_state(State::Failed(failure));
            }
        }
    }

    async fn build_snapshot(&self, env: &Environment, progress: &(dyn Fn(&str) + Sync)) -> Result<Ready, BuildFailure> {
        let spec = &env.spec;
        let source = match &spec.source {
            Source::Image { image } => engine::sandbox::EnvironmentSource::Image(image.clone()),
            Source::Dockerfile {
                context,
                path,
                build_args,
                target,
            } => engine::sandbox::EnvironmentSource::Dockerfile {
                context: self
                    .contexts
                    .folder(context, "dockerfile.context")
                    .map_err(|e| BuildFailure::plain(e.message))?,
                path: path.clone(),
                build_args: build_args.clone(),
                target: target.clone(),
            },
            Source::Sandbox { .. } => unreachable!("sandbox environments are not built"),
        };
        let recipe = engine::sandbox::EnvironmentRecipe {
            source,
            cpus: spec.cpus,
            memory_mib: spec.memory_mib,
            disk_mib: spec.disk_mib,
            setup: spec.setup.clone(),
            network: self.build_network.clone(),
        };
        self.host.build_environment(&recipe, &env.id, &self.dir, progress).await
    }

    /// Writes `env`'s record (atomically) and pins its snapshot.
    fn record(&self, env: &Environment, ready: &Ready) -> Result<(), BuildFailure> {
        let record = Record {
            format_version: RECORD_VERSION,
            id: env.id.clone(),
            spec: env.spec.clone(),
            created_at_ms: env.created_at_ms,
            snapshot: ready.snapshot.id().to_string(),
            image: ready.image.clone(),
        };
        let path = self.record_path(&env.id);
        let tmp = path.with_extension("json.tmp");
        let written = std::fs::write(&tmp, serde_json::to_vec_pretty(&record).expect("records serialize"))
            .and_then(|()| std::fs::rename(&tmp, &path));
        written.map_err(|e| BuildFailure::plain(format!("recording the environment in {}: {e}", path.display())))?;
        self.store
            .pin(ready.snapshot.id(), &path)
            .map_err(|e| BuildFailure::plain(format!("pinning its snapshot: {e}")))
    }

    /// A new ready environment of a sandbox's state (`POST /v1/sandboxes/{id}/snapshot`).
    pub fn add_snapshot(
        &self,
        sandbox: &str,
        from: &Environment,
        snapshot: Snapshot,
        origin: Option<Arc<engine::Branch>>,
        image: ImageConfig,
    ) -> ApiResult<Arc<Environment>> {
        let spec = Spec {
            source: Source::Sandbox {
                sandbox: sandbox.to_string(),
                environment: from.id.clone(),
            },
            // Each snapshot is new content: its id is the snapshot's.
            setup: vec![snapshot.id().to_string()],
            ..from.spec.clone()
        };
        let env = Arc::new(Environment {
            owned: Some(Owned {
                store: self.store.clone(),
                snapshot: snapshot.id().to_string(),
                deleted: Default::default(),
                _origin: origin,
            }),
            ..Environment::new(spec.id(), spec, engine::row::now_ms() as u64, State::Building)
        });
        let ready = Ready {
            snapshot: Arc::new(snapshot),
            image,
        };
        self.record(&env, &ready)
            .map_err(|f| ApiError::new(ErrorKind::Internal, f.message))?;
        env.set_state(State::Ready(ready));
        self.all
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(env.id.clone(), env.clone());
        Ok(env)
    }

    /// `DELETE /v1/environments/{id}`: forgets it and unpins its snapshot. A snapshot made
    /// from a sandbox is removed from the store once nothing holds the environment.
    pub fn delete(&self, id: &str) -> ApiResult<()> {
        let mut all = self.all.lock().unwrap_or_else(|p| p.into_inner());
        let env = all
            .get(id)
            .ok_or_else(|| ApiError::new(ErrorKind::NotFound, format!("no environment {id:?}")))?;
        if matches!(env.state(), State::Building) {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!("environment {id} is still building"),
            ));
        }
        let live = env.sandboxes.load(std::sync::atomic::Ordering::SeqCst);
        if live > 0 {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!("environment {id} has {live} live sandboxes: delete them first"),
            ));
        }
        if let Some(owned) = &env.owned {
            owned.deleted.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        // The record before the pin: a crash in between must not leave a record whose
        // snapshot `farm snapshot gc` may remove.
        let path = self.record_path(id);
        let _ = std::fs::remove_file(&path);
        self.store.unpin(&path);
        let env = all.remove(id);
        // Dropped (its pool stopped, an owned snapshot removed) without holding the registry.
        drop(all);
        drop(env);
        Ok(())
    }

    /// `GET /v1/environments/{id}/logs`: lines from `offset`, waiting up to `wait` for one
    /// (or for the build to end).
    pub async fn logs(&self, id: &str, offset: usize, wait: Duration) -> ApiResult<LogPage> {
        let env = self.get(id, "id")?;
        let mut changed = env.changed.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let (lines, total) = {
                let log = env.log.lock().unwrap_or_else(|p| p.into_inner());
                (log.iter().skip(offset).cloned().collect::<Vec<_>>(), log.len())
            };
            let building = matches!(env.state(), State::Building);
            if !lines.is_empty() || !building || tokio::time::Instant::now() >= deadline {
                let view = env.view();
                return Ok(LogPage {
                    lines,
                    next: total.max(offset),
                    state: view.state,
                    error: view.error,
                });
            }
            let _ = tokio::time::timeout_at(deadline, changed.changed()).await;
        }
    }
}
