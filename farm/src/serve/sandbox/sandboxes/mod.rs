//! Sandboxes: live forks of an environment a client drives itself. Each holds a VM slot of
//! the service (counted with sessions against `serve.max_sessions`) while it has a VM, and
//! goes when it is deleted, idle past its timeout, past its lifetime, or the service stops.
//!
//! A command runs without the sandbox's lock held, so a long command never blocks a file
//! read, a second command or a delete (a delete stops the VM, and the command ends with an
//! error). Streamed commands write their output to a folder of their own in the guest's
//! `/tmp`, read from the host as it grows.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::metrics::Role;
use engine::pause::PausedFork;
use engine::LiveFork;
use serde_json::json;

mod exec;
mod files;
mod settings;

pub use exec::{ExecRequest, StreamEvent};
pub use files::MAX_FILE_BYTES;
pub use settings::SandboxRequest;
use settings::Settings;

use super::environments::Environments;
use super::LazyEngine;
use crate::serve::error::{ApiError, ApiResult};

/// Sandboxes that died, remembered (this many at most) to say why when they are asked for.
const MAX_REMEMBERED_DEATHS: usize = 10_000;

/// A VM slot of the service, given back when dropped.
pub struct VmSlot(Option<Box<dyn FnOnce() + Send + Sync>>);

impl VmSlot {
    pub fn new(release: impl FnOnce() + Send + Sync + 'static) -> VmSlot {
        VmSlot(Some(Box::new(release)))
    }
}

impl Drop for VmSlot {
    fn drop(&mut self) {
        if let Some(release) = self.0.take() {
            release();
        }
    }
}

struct Sandbox {
    id: String,
    settings: Settings,
    created_ms: u64,
    created: Instant,
    /// The sandbox it was branched from.
    parent: Option<String>,
    /// None while paused.
    live: Option<LiveFork>,
    paused: Option<Arc<PausedFork>>,
    /// Its VM's slot (none while paused).
    slot: Option<VmSlot>,
}

impl Sandbox {
    fn new(id: String, settings: Settings, parent: Option<String>, live: LiveFork, slot: VmSlot) -> Sandbox {
        settings.environment.sandboxes.fetch_add(1, Ordering::SeqCst);
        Sandbox {
            id,
            settings,
            created_ms: engine::row::now_ms() as u64,
            created: Instant::now(),
            parent,
            live: Some(live),
            paused: None,
            slot: Some(slot),
        }
    }

    fn live(&self) -> ApiResult<&LiveFork> {
        self.live
            .as_ref()
            .ok_or_else(|| ApiError::new(409, format!("sandbox {} is paused: resume it first", self.id)))
    }

    fn view(&self) -> serde_json::Value {
        let s = &self.settings;
        json!({
            "id": self.id,
            "environment": s.environment.id,
            "state": if self.live.is_some() { "running" } else { "paused" },
            "cpus": s.environment.spec.cpus,
            "memory_mib": s.environment.spec.memory_mib,
            "network": s.network_name,
            "workdir": self.live.as_ref().map(|l| l.place.workdir.clone()).or_else(|| s.spec.workdir.clone()),
            "user": self.live.as_ref().map(|l| l.place.user.clone()).unwrap_or_else(|| s.spec.user.clone()),
            "created_at_ms": self.created_ms,
            "expires_at_ms": self.created_ms + s.lifetime.as_millis() as u64,
            "idle_timeout_secs": s.idle.as_secs(),
            "parent": self.parent,
            "metadata": s.metadata,
        })
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.settings.environment.sandboxes.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Every sandbox, with the service's limits for them.
pub struct Sandboxes {
    engine: Arc<LazyEngine>,
    networks: BTreeMap<String, egress::Policy>,
    idle: Duration,
    lifetime: Duration,
    warm_pool: usize,
    /// `OUT/sandboxes/paused`.
    paused_dir: PathBuf,
    all: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Sandbox>>>>,
    /// Last use of each and requests in flight (kept outside the sandboxes' locks, so
    /// expiry never waits, and never takes a sandbox a command is running in).
    activity: Mutex<HashMap<String, Activity>>,
    /// Paused sandboxes.
    paused: std::sync::atomic::AtomicUsize,
    /// Why sandboxes whose VM died are gone.
    deaths: Mutex<HashMap<String, String>>,
    /// Idempotency key -> (request digest, the sandbox made), and keys being created now.
    keys: Mutex<IdempotencyKeys>,
    counter: AtomicU64,
}

/// Idempotency keys seen: key -> (request digest, the sandbox made), and the keys whose
/// sandbox is being created now.
type IdempotencyKeys = (HashMap<String, (String, String)>, std::collections::HashSet<String>);

impl Sandboxes {
    pub fn new(
        engine: Arc<LazyEngine>,
        settings: &super::SandboxSection,
        networks: BTreeMap<String, egress::Policy>,
        root: &std::path::Path,
    ) -> anyhow::Result<Sandboxes> {
        let paused_dir = root.join("paused");
        // Sandboxes do not outlive the process that made them.
        let _ = std::fs::remove_dir_all(&paused_dir);
        Ok(Sandboxes {
            engine,
            networks,
            idle: Duration::from_secs(settings.idle_timeout_secs),
            lifetime: Duration::from_secs(settings.max_lifetime_secs),
            warm_pool: settings.warm_pool,
            paused_dir,
            all: Mutex::new(HashMap::new()),
            activity: Mutex::new(HashMap::new()),
            paused: Default::default(),
            deaths: Mutex::new(HashMap::new()),
            keys: Mutex::new(Default::default()),
            counter: AtomicU64::new(0),
        })
    }

    fn new_id(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let digest = <sha2::Sha256 as sha2::Digest>::digest(format!("{nanos}-{n}-{}", std::process::id()).as_bytes());
        format!("sb-{}", snapshotter::template::hex(&digest[..8]))
    }

    fn seed(&self) -> u64 {
        let mut bytes = [0u8; 8];
        let _ = getrandom(&mut bytes);
        u64::from_le_bytes(bytes)
    }

    /// Sandboxes with a VM, and paused ones.
    pub fn counts(&self) -> (usize, usize) {
        let all = self.all.lock().unwrap_or_else(|p| p.into_inner()).len();
        let paused = self.paused.load(Ordering::SeqCst);
        (all.saturating_sub(paused), paused)
    }

    /// A sandbox by id, or 404.
    fn get(&self, id: &str) -> ApiResult<Arc<tokio::sync::Mutex<Sandbox>>> {
        let found = self.all.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned();
        found.ok_or_else(|| match self.deaths.lock().unwrap_or_else(|p| p.into_inner()).get(id) {
            Some(why) => ApiError::new(410, format!("sandbox {id} is gone: {why}")),
            None => ApiError::new(404, format!("no sandbox {id:?} (it may have expired)")),
        })
    }

    /// Marks a sandbox in use until the guard drops (then used last at that moment).
    fn begin(&self, id: &str) -> InUse<'_> {
        let mut activity = self.activity.lock().unwrap_or_else(|p| p.into_inner());
        let a = activity.entry(id.to_string()).or_insert(Activity {
            last: Instant::now(),
            busy: 0,
        });
        a.busy += 1;
        a.last = Instant::now();
        InUse {
            sandboxes: self,
            id: id.to_string(),
        }
    }

    fn add(&self, sandbox: Sandbox) -> serde_json::Value {
        let view = sandbox.view();
        let id = sandbox.id.clone();
        self.activity.lock().unwrap_or_else(|p| p.into_inner()).insert(
            id.clone(),
            Activity {
                last: Instant::now(),
                busy: 0,
            },
        );
        self.all
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Arc::new(tokio::sync::Mutex::new(sandbox)));
        self.update_gauge();
        view
    }

    fn update_gauge(&self) {
        engine::metrics::get()
            .sandboxes
            .set(self.all.lock().unwrap_or_else(|p| p.into_inner()).len() as i64);
    }

    /// `POST /v1/sandboxes`. With an idempotency key, a retry answers with the sandbox the
    /// first request made.
    pub async fn create(
        &self,
        environments: &Environments,
        request: SandboxRequest,
        key: Option<(String, String)>,
        slot: impl FnOnce() -> ApiResult<VmSlot>,
    ) -> ApiResult<(serde_json::Value, bool)> {
        if let Some((key, digest)) = &key {
            if let Some(id) = self.claim_key(key, digest)? {
                let sandbox = self.get(&id)?;
                return Ok((sandbox.lock().await.view(), false));
            }
        }
        let made = self.make(environments, &request, slot).await;
        if let Some((key, digest)) = key {
            let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            keys.1.remove(&key);
            if let Ok(view) = &made {
                keys.0
                    .insert(key, (digest, view["id"].as_str().unwrap_or_default().to_string()));
            }
        }
        made.map(|view| (view, true))
    }

    /// The sandbox an idempotency key made before, or None after claiming the key for a
    /// create (409 while another request holds it, 422 for a different body).
    fn claim_key(&self, key: &str, digest: &str) -> ApiResult<Option<String>> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((seen, id)) = keys.0.get(key) {
            if seen != digest {
                return Err(ApiError::field(
                    422,
                    "Idempotency-Key",
                    "was used before with a different body",
                ));
            }
            return Ok(Some(id.clone()));
        }
        if !keys.1.insert(key.to_string()) {
            return Err(ApiError {
                retry_after: Some(1),
                ..ApiError::field(409, "Idempotency-Key", "a create with this key is in progress")
            });
        }
        Ok(None)
    }

    async fn make(
        &self,
        environments: &Environments,
        request: &SandboxRequest,
        slot: impl FnOnce() -> ApiResult<VmSlot>,
    ) -> ApiResult<serde_json::Value> {
        let settings = self.settings_of(environments, request)?;
        let engine = self.engine.get().await?;
        let slot = slot()?;
        let pool = settings.environment.pool(engine, &settings.ready, self.warm_pool).await;
        let live = engine
            .open_sandbox(
                &settings.ready.snapshot,
                &settings.ready.image,
                &settings.spec,
                self.seed(),
                pool,
            )
            .await
            .map_err(|e| ApiError::new(500, format!("starting the sandbox: {}", e.describe())))?;
        let id = self.new_id();
        tracing::info!(sandbox = %id, environment = %settings.environment.id, "sandbox created");
        Ok(self.add(Sandbox::new(id, settings, None, live, slot)))
    }

    pub async fn view(&self, id: &str) -> ApiResult<serde_json::Value> {
        Ok(self.get(id)?.lock().await.view())
    }

    pub async fn list(&self) -> Vec<serde_json::Value> {
        let all: Vec<_> = self
            .all
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let mut views = Vec::new();
        for sandbox in all {
            views.push(sandbox.lock().await.view());
        }
        views.sort_by_key(|v| (v["created_at_ms"].as_u64(), v["id"].as_str().map(str::to_string)));
        views
    }

    /// `DELETE /v1/sandboxes/{id}`: its VM stops now (a command running in it ends with an
    /// error).
    pub async fn delete(&self, id: &str, why: &str) -> ApiResult<()> {
        let removed = self.all.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        self.activity.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        let sandbox = removed.ok_or_else(|| ApiError::new(404, format!("no sandbox {id:?}")))?;
        let mut sandbox = sandbox.lock().await;
        sandbox.live = None;
        if sandbox.paused.take().is_some() {
            self.paused.fetch_sub(1, Ordering::SeqCst);
        }
        sandbox.slot = None;
        tracing::info!(sandbox = %id, "sandbox removed: {why}");
        self.update_gauge();
        Ok(())
    }

    /// The agent of a running sandbox (without holding its lock afterwards), with the
    /// options `make` builds from its fork.
    async fn agent<T>(
        &self,
        id: &str,
        make: impl FnOnce(&LiveFork) -> ApiResult<T>,
    ) -> ApiResult<(vmm::AgentClient, T, Option<String>)> {
        let sandbox = self.get(id)?;
        let sandbox = sandbox.lock().await;
        let live = sandbox.live()?;
        let made = make(live)?;
        Ok((live.fork.agent().clone(), made, live.place.user.clone()))
    }

    /// `POST /v1/sandboxes/{id}/branch`: a new sandbox that continues from this one's state.
    pub async fn branch(&self, id: &str, slot: impl FnOnce() -> ApiResult<VmSlot>) -> ApiResult<serde_json::Value> {
        let sandbox = self.get(id)?;
        let sandbox = sandbox.lock().await;
        let live = sandbox.live()?;
        let slot = slot()?;
        let engine = self.engine.get().await?;
        let (child, _branch) = engine
            .branch(
                live,
                &sandbox.settings.ready.snapshot,
                &engine.store,
                self.seed(),
                Role::Sandbox,
            )
            .await
            .map_err(|e| ApiError::new(500, format!("branching sandbox {id}: {}", engine::describe(&e))))?;
        let child_id = self.new_id();
        tracing::info!(sandbox = %child_id, parent = %id, "sandbox branched");
        let new = Sandbox::new(child_id, sandbox.settings.clone(), Some(id.to_string()), child, slot);
        drop(sandbox);
        Ok(self.add(new))
    }

    /// `POST /v1/sandboxes/{id}/pause`: saved to disk, its VM stopped, its slot given back.
    pub async fn pause(&self, id: &str) -> ApiResult<serde_json::Value> {
        let sandbox = self.get(id)?;
        let mut sandbox = sandbox.lock().await;
        let live = sandbox.live()?;
        let dir = self.paused_dir.join(&sandbox.id);
        let paused = self
            .engine
            .get()
            .await?
            .pause(live, &sandbox.settings.ready.snapshot, &dir)
            .await
            .map_err(|e| {
                let _ = std::fs::remove_dir_all(&dir);
                ApiError::new(500, format!("pausing sandbox {id}: {}", engine::describe(&e)))
            })?;
        sandbox.paused = Some(Arc::new(paused));
        self.paused.fetch_add(1, Ordering::SeqCst);
        sandbox.live = None;
        sandbox.slot = None;
        Ok(sandbox.view())
    }

    /// `POST /v1/sandboxes/{id}/resume`: forked again from its saved state.
    pub async fn resume(&self, id: &str, slot: impl FnOnce() -> ApiResult<VmSlot>) -> ApiResult<serde_json::Value> {
        let sandbox = self.get(id)?;
        let mut sandbox = sandbox.lock().await;
        let Some(paused) = sandbox.paused.clone() else {
            return Err(ApiError::new(409, format!("sandbox {id} is not paused")));
        };
        let slot = slot()?;
        let live = self
            .engine
            .get()
            .await?
            .unpause(&paused, None, Role::Sandbox)
            .await
            .map_err(|e| ApiError::new(500, format!("resuming sandbox {id}: {}", engine::describe(&e))))?;
        // Its own policy (rules included), not the one the saved state records.
        live.fork
            .machine
            .set_network(sandbox.settings.spec.network.clone().unwrap_or_default());
        sandbox.live = Some(live);
        sandbox.paused = None;
        self.paused.fetch_sub(1, Ordering::SeqCst);
        sandbox.slot = Some(slot);
        Ok(sandbox.view())
    }

    /// `POST /v1/sandboxes/{id}/snapshot`: a new environment of this sandbox's state.
    pub async fn snapshot(&self, environments: &Environments, id: &str) -> ApiResult<serde_json::Value> {
        let sandbox = self.get(id)?;
        let sandbox = sandbox.lock().await;
        let live = sandbox.live()?;
        let snapshot = self
            .engine
            .get()
            .await?
            .snapshot_sandbox(live, &sandbox.settings.ready.snapshot)
            .await
            .map_err(|e| match e {
                engine::sandbox::SnapshotSandboxError::Resumed => ApiError::new(409, e.to_string()),
                other => ApiError::new(500, format!("snapshotting sandbox {id}: {}", other.describe())),
            })?;
        let env = environments.add_snapshot(
            id,
            &sandbox.settings.environment,
            snapshot,
            live.origin().cloned(),
            sandbox.settings.ready.image.clone(),
        )?;
        Ok(env.view())
    }

    /// Removes sandboxes idle past their timeout or past their lifetime.
    pub async fn expire(&self) {
        let now = Instant::now();
        let all: Vec<(String, Arc<tokio::sync::Mutex<Sandbox>>)> = self
            .all
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (id, sandbox) in all {
            let activity = self
                .activity
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&id)
                .copied();
            // A sandbox busy with a request is not idle.
            let Ok(guard) = sandbox.try_lock() else { continue };
            let settings = &guard.settings;
            let idle = activity.is_some_and(|a| a.busy == 0 && now.duration_since(a.last) > settings.idle);
            let why = if now.duration_since(guard.created) > settings.lifetime {
                Some("past its lifetime")
            } else if guard.live.is_some() && idle {
                Some("idle past its timeout")
            } else {
                None
            };
            drop(guard);
            if let Some(why) = why {
                let _ = self.delete(&id, why).await;
            }
        }
    }

    /// Removes every sandbox (the service is stopping).
    pub async fn shut_down(&self) {
        let ids: Vec<String> = self
            .all
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        for id in ids {
            let _ = self.delete(&id, "the service shut down").await;
        }
        let _ = std::fs::remove_dir_all(&self.paused_dir);
    }
}

/// When a sandbox was used last, and how many requests are using it now.
#[derive(Clone, Copy)]
struct Activity {
    last: Instant,
    busy: usize,
}

/// A request using a sandbox (see [`Sandboxes::begin`]).
struct InUse<'a> {
    sandboxes: &'a Sandboxes,
    id: String,
}

impl Drop for InUse<'_> {
    fn drop(&mut self) {
        let mut activity = self.sandboxes.activity.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = activity.get_mut(&self.id) {
            a.busy = a.busy.saturating_sub(1);
            a.last = Instant::now();
        }
    }
}

fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}
