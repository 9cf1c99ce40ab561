//! The state of `farm serve`: the engines (one per suite), the admission queue, running
//! rollouts, live sessions, and the recorder that writes the run folder.
//!
//! Durability: every admitted rollout and every session is written to `requests.jsonl`
//! (fsynced, by the recorder) before the request is answered; every finished rollout or
//! submitted session is a row of `journal.jsonl` (fsynced) and later of a Parquet part,
//! exactly as in `farm run`. A restart reads both: rows stay served from their cursors, and
//! anything admitted that has no row gets an `env_error` row "lost in restart". No lock is
//! held across a write or a read of the folder.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use datasets::Task;
use engine::book::{Book, Kind};
use engine::config::Suite;
use engine::recorder::{Recorder, RecorderOptions, RunIdentity};
use engine::row::{Row, Status};
use engine::sizing;
use engine::snapshots::{Snapshot, SnapshotStore};
use engine::{Engine, Planned, TaskSnapshot, TaskSnapshots};
use tokio::sync::Notify;

pub use super::entries::Queued;
use super::entries::{Entry, Open, Phase};
pub use super::error::{ApiError, ApiResult};
pub use super::forks::{Forks, InUse, VmSlot};
use super::requests::{read_records, Record};
use super::ServeSection;
use crate::error::ErrorKind;

/// One suite the service serves.
pub struct SuiteState {
    pub suite: Suite,
    pub engine: Arc<Engine>,
    pub tasks: HashMap<String, Arc<Task>>,
    pub snapshots: TaskSnapshots,
}

#[derive(Default)]
pub struct Inner {
    pub rollouts: HashMap<String, Entry>,
    /// Admitted rollouts waiting for a slot, by tenant, served by weight.
    pub queue: tenants::fair::FairQueue<Queued>,
    pub running: HashMap<String, (tokio::task::AbortHandle, Planned)>,
    /// Idempotency keys of submits: their answers, and those being journaled right now.
    pub idempotency: engine::idempotency::Keys<serde_json::Value>,
    /// Queue room taken by submits being journaled right now.
    pub admitting: usize,
}

pub struct Service {
    pub suites: HashMap<String, SuiteState>,
    /// The suite a request without `suite` means (when exactly one is served).
    default_suite: Option<String>,
    pub settings: ServeSection,
    pub slots: usize,
    inner: Mutex<Inner>,
    /// Every open session and sandbox.
    pub forks: Forks,
    pub recorder: Recorder,
    pub wake: Notify,
    pub stopping: AtomicBool,
    pub branches: SnapshotStore,
    /// The output folder.
    pub out: std::path::PathBuf,
    pub run_id: String,
    /// `serve.max_sessions`, resolved.
    pub max_sessions: usize,
    /// What one more VM costs, as measured on the running ones.
    pub vm_cost: super::admission::VmCost,
    /// The sandbox API (None when `serve.sandboxes.enabled` is false).
    pub sandbox: Option<super::sandbox::SandboxApi>,
    /// Tenants: keys, quotas, who owns which id, the audit.
    pub tenancy: Arc<super::tenancy::Tenancy>,
    /// Lifecycle events of sandboxes and sessions, and tenants' webhooks.
    pub events: Arc<super::events::Events>,
    /// Held while the service runs (see `start`).
    _lock: std::fs::File,
}

impl Service {
    /// Loads every suite's dataset and template (reusing snapshots), the task snapshots,
    /// and the output folder; records what a previous process left unfinished.
    pub async fn start(
        settings: &ServeSection,
        suites: Vec<Suite>,
        out: &Path,
        accel: sizing::AccelSetting,
        token: Option<&str>,
    ) -> Result<Service> {
        warn_of_ksm(settings)?;
        let max_sessions = super::admission::resolve_max_sessions(settings);
        let lock = lock_out_folder(out)?;
        let tenancy = super::tenancy::Tenancy::open_for(settings, out, token)?;
        let events = Arc::new(super::events::Events::new(tenancy.clone(), &settings.events));
        let rows_per_part = suites.first().map(|s| s.config.output.rows_per_part).unwrap_or(256);
        let (recorder, opened, records) = open_recorder(out, rows_per_part).await?;
        let run_id = opened.run_id.clone();
        let guest_mib = suites.iter().map(|s| s.config.template.memory_mib).max().unwrap_or(512);
        let counts = super::resolve_counts(settings, guest_mib);
        let host = engine::Host::start(engine::HostChoices {
            accel,
            ksm: settings.ksm,
        })?;
        let states = start_suites(suites, &host, &run_id, &counts).await?;
        super::admission::log_capacity(settings, max_sessions, &counts, states.len());
        let default_suite = (states.len() == 1).then(|| states.keys().next().cloned()).flatten();
        let forks: Forks = Default::default();
        let sandbox = if settings.sandboxes.enabled {
            let hold = super::sandbox::held_by_owner(&tenancy);
            Some(super::sandbox::SandboxApi::start(
                settings,
                out,
                host,
                events.clone(),
                forks.clone(),
                hold,
            )?)
        } else {
            None
        };
        // A previous process's branch snapshots are of no use to anyone.
        let branches = SnapshotStore::new(out.join("branches"));
        let _ = std::fs::remove_dir_all(branches.root());
        let service = Service {
            suites: states,
            default_suite,
            settings: settings.clone(),
            slots: counts.concurrency,
            inner: Mutex::new(Inner::default()),
            forks,
            recorder,
            wake: Notify::new(),
            stopping: AtomicBool::new(false),
            branches,
            out: out.to_path_buf(),
            run_id,
            max_sessions,
            vm_cost: super::admission::VmCost::new((u64::from(guest_mib) + engine::sizing::QEMU_OVERHEAD_MIB) << 20),
            sandbox,
            tenancy,
            events,
            _lock: lock,
        };
        let done: HashMap<String, usize> = opened
            .outcomes
            .iter()
            .enumerate()
            .map(|(cursor, o)| (o.key.clone(), cursor))
            .collect();
        service.restore(records, &done).await?;
        if let Some(api) = &service.sandbox {
            api.restore().await;
        }
        service.adopt_unowned()?;
        Ok(service)
    }

    /// The dispatcher (starts queued rollouts as slots free up), session expiry and
    /// periodic Parquet parts.
    pub fn spawn_background(self: Arc<Self>) -> tokio::task::JoinHandle<()> {
        let tenancy = self.tenancy.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                tenancy.end_revoked().await;
            }
        });
        tokio::spawn(super::events::webhooks::deliver_forever(self.events.clone()));
        let (events, service) = (self.events.clone(), self.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(3600));
            loop {
                tick.tick().await;
                events.prune();
                if let Some(api) = &service.sandbox {
                    api.workspaces.expire();
                }
            }
        });
        let every = self.settings.sandboxes.checkpoint_secs;
        if let (Some(api), true) = (&self.sandbox, every > 0) {
            let sandboxes = api.sandboxes.clone();
            let every = Duration::from_secs(every);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every.min(Duration::from_secs(60)));
                loop {
                    tick.tick().await;
                    sandboxes.checkpoint_due(every).await;
                }
            });
        }
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            let mut last_flush = Instant::now();
            let mut last_status = String::new();
            loop {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tick.tick() => {
                        self.expire_sessions().await;
                        // VMs kept for a reset in place go after a minute unused.
                        for state in self.suites.values() {
                            state.engine.prune_idle(Duration::from_secs(60));
                        }
                        if let Some(api) = &self.sandbox {
                            api.sandboxes.watch().await;
                            api.sandboxes.expire().await;
                        }
                        if last_flush.elapsed() > Duration::from_secs(60) {
                            if let Err(e) = self.recorder.flush().await {
                                tracing::warn!("writing a Parquet part failed (the rows stay in the journal): {e}");
                            }
                            last_flush = Instant::now();
                            // A status line a minute, when anything changed.
                            let status = self.status();
                            if status != last_status {
                                tracing::info!("{status}");
                                last_status = status;
                            }
                        }
                    }
                }
                self.dispatch();
            }
        })
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts queued rollouts while slots are free.
    fn dispatch(self: &Arc<Self>) {
        let mut inner = self.lock();
        while inner.running.len() < self.slots && !self.stopping.load(Ordering::SeqCst) {
            let Some((
                tenant,
                Queued {
                    item,
                    since,
                    tenant_name,
                },
            )) = inner.queue.pop()
            else {
                break;
            };
            let _ = tenant;
            engine::metrics::get()
                .tenant_admission_wait
                .with_label_values(&[tenant_name.as_str()])
                .observe(since.elapsed().as_secs_f64());
            let id = item
                .served
                .as_ref()
                .expect("served rollouts have ids")
                .rollout_id
                .clone();
            let Some(state) = self.suites.get(suite_of(&item)) else {
                continue;
            };
            let engine = state.engine.clone();
            let service = self.clone();
            let kept = item.clone();
            let handle = tokio::spawn(async move {
                let row = engine.run_one(item).await;
                service.emit(row).await;
                service.wake.notify_one();
            });
            inner.running.insert(id.clone(), (handle.abort_handle(), kept));
            if let Some(e) = inner.rollouts.get_mut(&id) {
                e.phase = Phase::Running;
            }
        }
        engine::metrics::get().queue_depth.set(inner.queue.len() as i64);
        let warm: usize = self.suites.values().map(|s| s.engine.warm()).sum();
        engine::metrics::get().warm_ready.set(warm as i64);
    }

    /// Records a finished rollout once (a cancelled one may finish meanwhile: the first row
    /// wins) and returns its cursor; readers waiting for rows are woken by the recorder.
    pub async fn emit(&self, row: Row) -> Option<usize> {
        let id = row.rollout_id.clone().unwrap_or_default();
        {
            let mut inner = self.lock();
            inner.running.remove(&id);
            let entry = inner.rollouts.get_mut(&id)?;
            if entry.phase == Phase::Done || entry.recording {
                return None;
            }
            entry.recording = true;
        }
        let recorded = self.recorder.append(row).await;
        let mut inner = self.lock();
        let entry = inner.rollouts.get_mut(&id)?;
        entry.recording = false;
        match recorded {
            Ok(cursor) => {
                entry.phase = Phase::Done;
                entry.cursor = Some(cursor);
                Some(cursor)
            }
            Err(e) => {
                tracing::error!("recording rollout {id}: {e}");
                None
            }
        }
    }

    pub fn new_id(&self, prefix: &str) -> String {
        super::ids::new_id(prefix)
    }

    pub fn suite(&self, name: Option<&str>, field: &str) -> ApiResult<(&str, &SuiteState)> {
        let name = match name.or(self.default_suite.as_deref()) {
            Some(n) => n,
            None => {
                let names: Vec<&str> = self.suites.keys().map(String::as_str).collect();
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    field,
                    format!("several suites are served ({}): name one", names.join(", ")),
                ));
            }
        };
        match self.suites.get_key_value(name) {
            Some((k, v)) => Ok((k.as_str(), v)),
            None => Err(ApiError::field(
                ErrorKind::NotFound,
                field,
                format!("no suite {name:?} is served"),
            )),
        }
    }

    fn task(&self, suite: &SuiteState, task_id: &str, field: &str) -> ApiResult<(Arc<Task>, Arc<Snapshot>)> {
        let task = suite.tasks.get(task_id).ok_or_else(|| {
            ApiError::field(
                ErrorKind::NotFound,
                field,
                format!("no task {task_id:?} in suite {:?}", suite.engine.suite_name),
            )
        })?;
        match suite.snapshots.get(task_id) {
            Some(TaskSnapshot::Ready(s)) => Ok((task.clone(), s.clone())),
            Some(TaskSnapshot::Failed(e)) => Err(ApiError::field(
                ErrorKind::Conflict,
                field,
                format!("task {task_id:?} cannot run: {e}"),
            )),
            Some(TaskSnapshot::Pending) | None => Err(ApiError::field(
                ErrorKind::Internal,
                field,
                format!("task {task_id:?} has no snapshot"),
            )),
        }
    }

    /// The book of open forks.
    pub fn forks(&self) -> std::sync::MutexGuard<'_, Book<Open, crate::entries::Card>> {
        self.forks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A VM slot for a session or sandbox about to open, branch or resume, counted against
    /// `serve.max_sessions` and admitted by the memory check; given back when dropped unless
    /// the fork took it.
    pub fn vm_slot(&self) -> ApiResult<VmSlot> {
        self.check_admitting()?;
        self.check_memory()?;
        self.forks().reserve(self.max_sessions)?;
        Ok(VmSlot(Some(self.forks.clone())))
    }

    pub fn check_admitting(&self) -> ApiResult<()> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err(ApiError::new(ErrorKind::Unavailable, "the service is shutting down"));
        }
        Ok(())
    }

    /// A request's task: a served task by id, or an inline task (a JSONL task table's row),
    /// whose snapshot is made (or reused) when it needs one.
    pub async fn resolve_task(
        &self,
        suite: &SuiteState,
        task_id: Option<&str>,
        inline: Option<&serde_json::Value>,
        at: &(dyn Fn(&str) -> String + Sync),
    ) -> ApiResult<(Arc<Task>, Arc<Snapshot>)> {
        match (task_id, inline) {
            (Some(id), None) => self.task(suite, id, &at("task_id")),
            (None, Some(value)) => {
                let task = datasets::task_from_json(value.clone())
                    .map_err(|e| ApiError::field(ErrorKind::Invalid, at("task"), format!("not a task: {e}")))?;
                if suite.engine.config.scoring.external.is_empty() && !task.is_scorable() {
                    return Err(ApiError::field(ErrorKind::Invalid, at("task"), "the task has neither a test command nor an expected answer, and the suite sets no scoring.external"));
                }
                let task = Arc::new(task);
                let snapshots = suite
                    .engine
                    .prepare(std::slice::from_ref(&task), 1, &|_: &str| {})
                    .await
                    .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
                match snapshots.get(&task.id) {
                    Some(TaskSnapshot::Ready(s)) => Ok((task.clone(), s.clone())),
                    Some(TaskSnapshot::Failed(e)) => {
                        Err(ApiError::field(ErrorKind::Unprocessable, at("task"), e.clone()))
                    }
                    Some(TaskSnapshot::Pending) | None => {
                        Err(ApiError::field(ErrorKind::Internal, at("task"), "no snapshot was made"))
                    }
                }
            }
            (Some(_), Some(_)) => Err(ApiError::field(
                ErrorKind::Invalid,
                at("task"),
                "give task_id or task, not both",
            )),
            (None, None) => Err(ApiError::field(
                ErrorKind::Invalid,
                at("task_id"),
                "missing: give task_id (a served task) or task (an inline task)",
            )),
        }
    }

    /// One log line: rows recorded by status, work in flight.
    fn status(&self) -> String {
        let counts: Vec<(Status, u64)> = Status::ALL
            .iter()
            .map(|s| {
                (
                    *s,
                    engine::metrics::get().rollouts.with_label_values(&[s.as_str()]).get(),
                )
            })
            .collect();
        let shown: Vec<String> = counts.iter().map(|(s, n)| format!("{s} {n}")).collect();
        let inner = self.lock();
        format!(
            "{} rows recorded since start ({}); {} running, {} queued, {} sessions",
            counts.iter().map(|(_, n)| n).sum::<u64>(),
            shown.join(", "),
            inner.running.len(),
            inner.queue.len(),
            self.forks().count(Kind::Session).0
        )
    }

    /// Stops admitting, cancels queued and running rollouts (each recorded as cancelled),
    /// and ends every session.
    pub async fn shut_down(&self) {
        {
            // Under the lock: whatever is admitted is admitted before this, and is swept.
            let _inner = self.lock();
            self.stopping.store(true, Ordering::SeqCst);
        }
        let ids: Vec<String> = self
            .lock()
            .rollouts
            .iter()
            .filter(|(_, e)| matches!(e.phase, Phase::Queued | Phase::Running))
            .map(|(id, _)| id.clone())
            .collect();
        self.cancel_ids(&ids, "the service shut down").await;
        let sessions = self.forks().endable_ids(Kind::Session);
        for id in sessions {
            let _ = self
                .end_session(
                    &super::ids::SessionId::trusted(&id),
                    "the service shut down",
                    super::events::Cause::ServiceStop,
                )
                .await;
        }
        if let Some(api) = &self.sandbox {
            api.sandboxes.shut_down().await;
        }
        // Paused sessions stay on disk for the next start.
        let all = self.forks().all(Kind::Session);
        for (_, session) in all {
            if let Some(paused) = session.lock().await.run.paused() {
                paused.keep_on_disk();
            }
        }
    }

    /// Writes pending rows into a Parquet part.
    pub async fn flush(&self) -> Result<()> {
        Ok(self.recorder.flush().await?)
    }
}

/// Says what `serve.ksm` cannot do on this host (an error when it cannot be had at all).
fn warn_of_ksm(settings: &ServeSection) -> Result<()> {
    if let Some(note) = sizing::KsmHost::probe()
        .check(settings.ksm)
        .map_err(|e| anyhow::anyhow!("serve.ksm: {e}"))?
    {
        tracing::warn!("{note}");
    }
    Ok(())
}

/// The recorder of the output folder, continuing what a previous process wrote, and what it
/// admitted (a bad line of `requests.jsonl` stops the start, naming it).
async fn open_recorder(out: &Path, rows_per_part: usize) -> Result<(Recorder, engine::recorder::Opened, Vec<Record>)> {
    // What the previous process admitted (a bad line stops the start, naming it).
    let requests_path = out.join("requests.jsonl");
    let path = requests_path.clone();
    let (records, good_len) = tokio::task::spawn_blocking(move || read_records(&path)).await??;
    // Restarts continue the same output; the service is not tied to one suite version.
    let identity = RunIdentity {
        run_id: engine::recorder::new_run_id(),
        suite_name: "farm-serve".into(),
        suite_digest: "farm-serve".into(),
        shard: None,
    };
    let options = RecorderOptions {
        rows_per_part,
        resume: true,
        requests: Some((requests_path, good_len)),
    };
    let (recorder, opened) = Recorder::open(out, identity, options).await?;
    Ok((recorder, opened, records))
}

/// Creates the output folder and takes its lock: one service per output folder (two would
/// interleave their journals).
fn lock_out_folder(out: &Path) -> Result<std::fs::File> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(out.join(".lock"))
        .with_context(|| format!("creating {}", out.join(".lock").display()))?;
    if lock.try_lock().is_err() {
        anyhow::bail!(
            "another farm serve is using the output folder {}: stop it, or choose another --out",
            out.display()
        );
    }
    Ok(lock)
}

/// Every suite's engine: its template (reused when built before), task snapshots and warm
/// pool.
async fn start_suites(
    suites: Vec<Suite>,
    host: &Arc<engine::Host>,
    run_id: &str,
    counts: &engine::sizing::Counts,
) -> Result<HashMap<String, SuiteState>> {
    let mut states = HashMap::new();
    for suite in suites {
        let tasks = suite.tasks(None)?;
        let name = suite.config.suite.name.clone();
        let progress = |line: &str| tracing::info!("{name}: template: {line}");
        let mut engine = Engine::start(&suite, host, run_id, engine::Preload::UnitTests, &progress).await?;
        let snapshots = engine
            .prepare_and_pool(&tasks, counts.concurrency, counts.warm_pool, &|line: &str| {
                tracing::info!("{name}: {line}")
            })
            .await?;
        tracing::info!("{name}: {} tasks", tasks.len());
        let tasks = tasks.into_iter().map(|t| (t.id.clone(), t)).collect();
        states.insert(
            name,
            SuiteState {
                suite,
                engine: Arc::new(engine),
                tasks,
                snapshots,
            },
        );
    }
    Ok(states)
}

/// The suite a served rollout belongs to.
pub fn suite_of(item: &Planned) -> &str {
    item.served.as_ref().map(|s| s.suite.as_str()).unwrap_or_default()
}
