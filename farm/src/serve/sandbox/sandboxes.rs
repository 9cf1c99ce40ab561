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
use engine::sandbox::{Command, SandboxSpec};
use engine::LiveFork;
use farm_protocol::Program;
use serde::Deserialize;
use serde_json::json;

use super::environments::{Environment, Environments, Ready};
use super::LazyEngine;
use crate::serve::error::{ApiError, ApiResult};

/// Largest file a client may upload or download in one request.
pub const MAX_FILE_BYTES: u64 = 64 << 20;
/// Largest folder archive a client may download.
pub const MAX_FOLDER_BYTES: u64 = 256 << 20;
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

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxRequest {
    pub environment: String,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub workdir: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub network: Option<String>,
    #[serde(default)]
    pub disk_mib: Option<u64>,
    #[serde(default)]
    pub idle_timeout_secs: Option<u64>,
    #[serde(default)]
    pub lifetime_secs: Option<u64>,
    #[serde(default)]
    pub cpus: Option<u32>,
    #[serde(default)]
    pub memory_mib: Option<u32>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

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

/// A sandbox's settings, which its branches share.
#[derive(Clone)]
struct Settings {
    environment: Arc<Environment>,
    ready: Ready,
    spec: SandboxSpec,
    network_name: Option<String>,
    idle: Duration,
    lifetime: Duration,
    metadata: BTreeMap<String, String>,
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

    /// The settings a request asks for, or a 400 naming the field.
    fn settings_of(&self, environments: &Environments, request: &SandboxRequest) -> ApiResult<Settings> {
        let environment = environments.get(&request.environment, "environment")?;
        let ready = environment.ready("environment")?;
        let spec = &environment.spec;
        if request.cpus.is_some_and(|c| c != spec.cpus) {
            return Err(ApiError::field(
                400,
                "cpus",
                format!(
                    "environment {} has {} vCPUs, fixed in its snapshot: create an environment with cpus {} for this",
                    environment.id,
                    spec.cpus,
                    request.cpus.unwrap_or_default()
                ),
            ));
        }
        if request.memory_mib.is_some_and(|m| m != spec.memory_mib) {
            return Err(ApiError::field(400, "memory_mib", format!(
                "environment {} has {} MiB of memory, fixed in its snapshot: create an environment with memory_mib {} for this",
                environment.id, spec.memory_mib, request.memory_mib.unwrap_or_default()
            )));
        }
        let network = match &request.network {
            None => None,
            Some(name) => Some(self.networks.get(name).cloned().ok_or_else(|| {
                let names: Vec<&str> = self.networks.keys().map(String::as_str).collect();
                ApiError::field(
                    400,
                    "network",
                    format!(
                        "no network policy {name:?} in serve.sandboxes.networks (the service has: {})",
                        if names.is_empty() {
                            "none".to_string()
                        } else {
                            names.join(", ")
                        }
                    ),
                )
            })?),
        };
        for k in request.env.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(ApiError::field(400, format!("env.{k}"), "not a variable name"));
            }
        }
        if let Some(dir) = &request.workdir {
            if !dir.starts_with('/') {
                return Err(ApiError::field(400, "workdir", "must be an absolute guest path"));
            }
        }
        if let Some(user) = &request.user {
            if user.is_empty() || user.contains(|c: char| c.is_whitespace() || c == '\0') {
                return Err(ApiError::field(400, "user", "must be a user name, UID or UID:GID"));
            }
        }
        let timer = |name: &str, asked: Option<u64>, max: Duration| -> ApiResult<Duration> {
            match asked {
                Some(0) => Err(ApiError::field(400, name, "must be at least 1")),
                Some(s) => Ok(Duration::from_secs(s).min(max)),
                None => Ok(max),
            }
        };
        if request.disk_mib == Some(0) {
            return Err(ApiError::field(400, "disk_mib", "must be at least 1"));
        }
        Ok(Settings {
            environment: environment.clone(),
            ready,
            spec: SandboxSpec {
                env: request.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                workdir: request.workdir.clone(),
                user: request.user.clone(),
                network,
                max_disk_bytes: request.disk_mib.map(|m| m << 20),
            },
            network_name: request.network.clone(),
            idle: timer("idle_timeout_secs", request.idle_timeout_secs, self.idle)?,
            lifetime: timer("lifetime_secs", request.lifetime_secs, self.lifetime)?,
            metadata: request.metadata.clone(),
        })
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

    /// What a command's request asks, checked: the program and its settings.
    fn command_of(request: ExecRequest, stream: bool) -> ApiResult<(Program, Command)> {
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
    async fn watched<T>(
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
    fn vm_error(&self, id: &str, e: &vmm::AgentError) -> ApiError {
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
            let _ = tx.send(event).await;
            let _ = agent.remove_tree(&dir).await;
        });
        Ok(rx)
    }

    /// `PUT /v1/sandboxes/{id}/files`.
    pub async fn write_file(&self, id: &str, path: &str, mode: u32, bytes: Vec<u8>) -> ApiResult<serde_json::Value> {
        check_path(path)?;
        let _in_use = self.begin(id);
        let (agent, (), user) = self.agent(id, |_| Ok(())).await?;
        let placement = vmm::FilePlacement {
            beneath: None,
            owner: user,
        };
        let len = bytes.len();
        agent
            .write_file_placed(path, bytes, mode, &placement)
            .await
            .map_err(|e| self.file_error(id, path, &e))?;
        Ok(json!({ "path": path, "bytes": len }))
    }

    /// `GET /v1/sandboxes/{id}/files`.
    pub async fn read_file(&self, id: &str, path: &str) -> ApiResult<Vec<u8>> {
        check_path(path)?;
        let _in_use = self.begin(id);
        let (agent, (), _) = self.agent(id, |_| Ok(())).await?;
        let (bytes, size) = agent
            .read_file(path, MAX_FILE_BYTES)
            .await
            .map_err(|e| self.file_error(id, path, &e))?;
        if size > MAX_FILE_BYTES {
            return Err(ApiError::field(
                413,
                "path",
                format!(
                    "{path} is {size} bytes, past the {} MiB a file download may be (download its folder as a tar)",
                    MAX_FILE_BYTES >> 20
                ),
            ));
        }
        Ok(bytes)
    }

    fn file_error(&self, id: &str, path: &str, e: &vmm::AgentError) -> ApiError {
        match e {
            vmm::AgentError::Refused { message, .. } => {
                let missing = message.contains("No such file") || message.contains("os error 2");
                ApiError::field(if missing { 404 } else { 400 }, "path", format!("{path}: {message}"))
            }
            other => self.vm_error(id, other),
        }
    }

    /// `PUT /v1/sandboxes/{id}/folders`: a tar archive unpacked in the guest under `path`.
    pub async fn write_folder(&self, id: &str, path: &str, archive: Vec<u8>) -> ApiResult<serde_json::Value> {
        check_path(path)?;
        let _in_use = self.begin(id);
        let (agent, (), _) = self.agent(id, |_| Ok(())).await?;
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let tmp = format!("/tmp/.farm-upload-{}-{n}.tar", std::process::id());
        let len = archive.len();
        agent
            .write_file(&tmp, archive, 0o600)
            .await
            .map_err(|e| self.file_error(id, &tmp, &e))?;
        let script = format!(
            "mkdir -p -- {dir} && tar -x -o -f {tmp} -C {dir}; rc=$?; rm -f {tmp}; exit $rc",
            dir = shell_quote(path)
        );
        let out = self.guest_sh(id, &agent, &script).await?;
        if out.result.exit_code != Some(0) {
            return Err(ApiError::field(
                400,
                "body",
                format!(
                    "unpacking the archive in {path} failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            ));
        }
        Ok(json!({ "path": path, "bytes": len }))
    }

    /// `GET /v1/sandboxes/{id}/folders`: a tar archive of the folder, made in the guest.
    pub async fn read_folder(&self, id: &str, path: &str) -> ApiResult<Vec<u8>> {
        check_path(path)?;
        let _in_use = self.begin(id);
        let (agent, (), _) = self.agent(id, |_| Ok(())).await?;
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let tmp = format!("/tmp/.farm-download-{}-{n}.tar", std::process::id());
        let script = format!(
            "[ -d {dir} ] || {{ echo 'no such folder' >&2; exit 3; }}; tar -c -f {tmp} -C {dir} .",
            dir = shell_quote(path)
        );
        let out = self.guest_sh(id, &agent, &script).await;
        let result = match out {
            Ok(out) if out.result.exit_code == Some(0) => self.read_whole(id, &agent, &tmp).await,
            Ok(out) if out.result.exit_code == Some(3) => {
                Err(ApiError::field(404, "path", format!("{path}: no such folder")))
            }
            Ok(out) => Err(ApiError::field(
                400,
                "path",
                format!("packing {path} failed: {}", String::from_utf8_lossy(&out.stderr).trim()),
            )),
            Err(e) => Err(e),
        };
        let _ = agent.remove_file(&tmp, None).await;
        result
    }

    /// A guest file in chunks, up to [`MAX_FOLDER_BYTES`].
    async fn read_whole(&self, id: &str, agent: &vmm::AgentClient, path: &str) -> ApiResult<Vec<u8>> {
        const CHUNK: u64 = 16 << 20;
        let mut out = Vec::new();
        loop {
            let (bytes, size) = agent
                .read_file_at(path, out.len() as u64, CHUNK, None)
                .await
                .map_err(|e| self.file_error(id, path, &e))?;
            if size > MAX_FOLDER_BYTES {
                return Err(ApiError::field(
                    413,
                    "path",
                    format!(
                        "the folder's archive is {size} bytes, past the {} MiB a download may be",
                        MAX_FOLDER_BYTES >> 20
                    ),
                ));
            }
            let done = bytes.is_empty();
            out.extend_from_slice(&bytes);
            if done || out.len() as u64 >= size {
                return Ok(out);
            }
        }
    }

    async fn guest_sh(&self, id: &str, agent: &vmm::AgentClient, script: &str) -> ApiResult<vmm::ExecOutput> {
        let options = vmm::ExecOptions {
            timeout: Some(Duration::from_secs(600)),
            ..vmm::ExecOptions::argv(&["/bin/sh", "-c", script])
        };
        agent.exec(options).await.map_err(|e| self.vm_error(id, &e))
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

/// A guest path a client names: absolute, without NUL.
fn check_path(path: &str) -> ApiResult<()> {
    if !path.starts_with('/') || path.contains('\0') || path.len() > 4096 {
        return Err(ApiError::field(400, "path", "must be an absolute guest path"));
    }
    Ok(())
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
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
        assert_eq!(shell_quote("a'b"), "'a'\\''b'");
        assert!(check_path("rel").is_err());
        assert!(check_path("/a\0b").is_err());
    }
}
