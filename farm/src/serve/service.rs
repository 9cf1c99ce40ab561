//! The state of `farm serve`: the engines (one per suite), the admission queue, running
//! rollouts, live sessions, the output writer and the requests journal.
//!
//! Durability: every admitted rollout and every session is written to `requests.jsonl`
//! (fsynced) before the request is answered; every finished rollout or submitted session is
//! a row of `journal.jsonl` (fsynced) and later of a Parquet part, exactly as in `farm run`.
//! A restart reads both: rows stay served from their cursors, and anything admitted that has
//! no row gets an `env_error` row "lost in restart".

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use datasets::Task;
use serde::{Deserialize, Serialize};
use serde_json::json;
use snapshotter::{Snapshot, SnapshotStore};
use tokio::sync::{watch, Notify};

use super::ServeSection;
use crate::engine::output::{OutputWriter, Row, Status, Step};
use crate::engine::policy::Action;
use crate::engine::{now_ms, rollout_seed, Branch, End, Engine, LiveFork, Planned, Policy, Served, TaskSnapshots};
use crate::metrics::{self, Role};
use crate::run::suite::{RolloutsSection, Suite};
use crate::run::Log;

/// A failure a request can be told about: an HTTP status and a message (and the request
/// field it concerns).
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub field: Option<String>,
    /// Seconds, for 429.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), field: None, retry_after: None }
    }
    pub fn field(status: u16, field: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), field: Some(field.into()), retry_after: None }
    }
}

type ApiResult<T> = std::result::Result<T, ApiError>;

/// Bytes of rows one `/v1/results` answer carries at most (at least one row).
const RESULTS_MAX_BYTES: u64 = 64 << 20;

/// A request's `metadata`, as JSON text, at most.
const METADATA_MAX_BYTES: usize = 64 << 10;

/// One suite the service serves.
struct SuiteState {
    engine: Arc<Engine>,
    tasks: HashMap<String, Arc<Task>>,
    snapshots: TaskSnapshots,
}

/// Where a rollout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Queued,
    Running,
    /// A live session (its row comes when it is submitted).
    Session,
    Done,
}

#[derive(Debug, Clone)]
struct Entry {
    /// The session, for a session's rollout.
    session: Option<String>,
    group_id: String,
    policy_version: Option<u64>,
    phase: Phase,
    /// The row's cursor once done.
    cursor: Option<usize>,
}

/// A line of `requests.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Record {
    /// Rollouts admitted by one submit.
    Submit {
        #[serde(default)]
        idempotency_key: Option<String>,
        #[serde(default)]
        body_digest: String,
        response: serde_json::Value,
        rollouts: Vec<Admitted>,
    },
    /// A session opened (a branch is a session too).
    Session { session_id: String, rollout: Admitted },
    /// A session ended without a row (deleted, expired, shut down).
    SessionEnd { session_id: String, reason: String },
}

/// What a restart needs to record a rollout that was lost.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Admitted {
    rollout_id: String,
    group_id: String,
    suite: String,
    task_id: String,
    sample: u32,
    seed: u64,
    #[serde(default)]
    policy_version: Option<u64>,
    #[serde(default)]
    policy_name: String,
    #[serde(default)]
    metadata: Option<String>,
}

struct Inner {
    rollouts: HashMap<String, Entry>,
    queue: VecDeque<Planned>,
    running: HashMap<String, (tokio::task::AbortHandle, Planned)>,
    /// Idempotency key -> (body digest, response).
    idempotency: HashMap<String, (String, serde_json::Value)>,
    sessions: HashMap<String, Arc<tokio::sync::Mutex<Session>>>,
    /// Session id -> last use (kept outside the session's lock, so expiry never waits).
    touched: HashMap<String, Instant>,
    /// Sessions being submitted: expiry, DELETE and shutdown leave them to finish (a
    /// process killed meanwhile reports them lost on restart, as no end was recorded).
    submitting: std::collections::HashSet<String>,
    /// Session slots taken by sessions still being opened or branched.
    reserved: usize,
}

/// A live environment a caller steps.
pub struct Session {
    id: String,
    suite: String,
    task: Arc<Task>,
    snapshot: Arc<Snapshot>,
    /// None once ended.
    live: Option<LiveFork>,
    steps: Vec<Step>,
    limits: RolloutsSection,
    planned: Planned,
    /// Time its actions took so far (against `limits.timeout_secs`).
    spent: Duration,
    /// Branch snapshots this session's fork depends on.
    _branch: Option<Arc<Branch>>,
}

pub struct Service {
    suites: HashMap<String, SuiteState>,
    /// The suite a request without `suite` means (when exactly one is served).
    default_suite: Option<String>,
    settings: ServeSection,
    slots: usize,
    inner: Mutex<Inner>,
    writer: Mutex<OutputWriter>,
    requests: Mutex<std::fs::File>,
    rows: watch::Sender<usize>,
    wake: Notify,
    stopping: AtomicBool,
    branches: SnapshotStore,
    run_id: String,
    counter: AtomicU64,
    guest_mib: u32,
    /// Held while the service runs (see `start`).
    _lock: std::fs::File,
}

impl Service {
    /// Loads every suite's dataset and template (reusing snapshots), the task snapshots,
    /// and the output folder; records what a previous process left unfinished.
    pub async fn start(settings: &ServeSection, suites: &[Suite], out: &Path, accel: vmm::AccelSetting, log: &Log) -> Result<Service> {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        // One service per output folder: two would interleave their journals.
        let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(out.join(".lock")).with_context(|| format!("creating {}", out.join(".lock").display()))?;
        if lock.try_lock().is_err() {
            anyhow::bail!("another farm serve is using the output folder {}: stop it, or choose another --out", out.display());
        }
        let rows_per_part = suites.first().map(|s| s.config.output.rows_per_part).unwrap_or(256);
        // Restarts continue the same output; the service is not tied to one suite version.
        let mut writer = OutputWriter::open(out, &crate::run::new_run_id(), "farm-serve", "farm-serve", true, rows_per_part)?;
        let run_id = writer.run_id().to_string();
        let guest_mib = suites.iter().map(|s| s.config.template.memory_mib).max().unwrap_or(512);
        let counts = super::resolve_counts(settings, guest_mib);
        let mut states = HashMap::new();
        for suite in suites {
            let config = &suite.config;
            let tasks = crate::run::load_tasks(suite, config, None)?;
            let name = config.suite.name.clone();
            let progress = |line: &str| log.line(&format!("{name}: template: {line}"));
            let mut engine = Engine::start(suite, config, accel, &run_id, &progress).await?;
            let snapshots = engine.prepare(&tasks, counts.concurrency, &|line: &str| log.line(&format!("{name}: {line}"))).await?;
            if snapshots.values().any(|s| matches!(s, Ok(s) if s.id() == engine.template.id())) {
                engine.start_pool(counts.warm_pool)?;
            }
            log.line(&format!("{name}: {} tasks", tasks.len()));
            let tasks = tasks.into_iter().map(|t| (t.id.clone(), t)).collect();
            states.insert(name, SuiteState { engine: Arc::new(engine), tasks, snapshots });
        }
        log.line(&counts.explanation);
        let default_suite = (states.len() == 1).then(|| states.keys().next().cloned()).flatten();

        // What the previous process admitted and never finished.
        let requests_path = out.join("requests.jsonl");
        let (records, good_len) = read_records(&requests_path)?;
        let requests = std::fs::OpenOptions::new().create(true).append(true).open(&requests_path).with_context(|| format!("opening {}", requests_path.display()))?;
        requests.set_len(good_len)?;
        let mut inner = Inner {
            rollouts: HashMap::new(),
            queue: VecDeque::new(),
            running: HashMap::new(),
            idempotency: HashMap::new(),
            sessions: HashMap::new(),
            touched: HashMap::new(),
            submitting: Default::default(),
            reserved: 0,
        };
        let done: HashMap<String, usize> = rows_by_id(&writer)?;
        let mut ended_sessions = std::collections::HashSet::new();
        for record in &records {
            if let Record::SessionEnd { session_id, .. } = record {
                ended_sessions.insert(session_id.clone());
            }
        }
        let mut lost = 0;
        for record in records {
            let (admitted, closed) = match record {
                Record::Submit { idempotency_key, body_digest, response, rollouts } => {
                    if let Some(key) = idempotency_key {
                        inner.idempotency.insert(key, (body_digest, response));
                    }
                    (rollouts, false)
                }
                Record::Session { session_id, rollout } => (vec![rollout], ended_sessions.contains(&session_id)),
                Record::SessionEnd { .. } => continue,
            };
            for a in admitted {
                let cursor = match (done.get(&a.rollout_id).copied(), closed) {
                    (Some(c), _) => Some(c),
                    // A session ended without a row (deleted or expired).
                    (None, true) => None,
                    (None, false) => {
                        writer.append(lost_row(&a, &run_id))?;
                        lost += 1;
                        Some(writer.rows() - 1)
                    }
                };
                let phase = Phase::Done;
                inner.rollouts.insert(a.rollout_id.clone(), Entry { session: None, group_id: a.group_id.clone(), policy_version: a.policy_version, phase, cursor });
            }
        }
        if lost > 0 {
            log.line(&format!("{lost} rollouts or sessions of the previous process were lost in its restart (recorded as env_error)"));
        }
        writer.flush()?;
        let (rows, _) = watch::channel(writer.rows());
        // Branch snapshots live as long as a session needs them; a previous process's are
        // of no use to anyone.
        let branches = SnapshotStore::new(out.join("branches"));
        let _ = std::fs::remove_dir_all(branches.root());
        Ok(Service {
            suites: states,
            default_suite,
            settings: settings.clone(),
            slots: counts.concurrency,
            inner: Mutex::new(inner),
            writer: Mutex::new(writer),
            requests: Mutex::new(requests),
            rows,
            wake: Notify::new(),
            stopping: AtomicBool::new(false),
            branches,
            run_id,
            counter: AtomicU64::new(0),
            guest_mib,
            _lock: lock,
        })
    }

    /// The dispatcher (starts queued rollouts as slots free up), session expiry and
    /// periodic Parquet parts.
    pub fn spawn_background(self: Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            let mut last_flush = Instant::now();
            let mut last_status = String::new();
            let log = Log::new();
            loop {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tick.tick() => {
                        self.expire_sessions();
                        if last_flush.elapsed() > Duration::from_secs(60) {
                            if let Err(e) = self.flush() {
                                log.line(&format!("writing a Parquet part failed (the rows stay in the journal): {e:#}"));
                            }
                            last_flush = Instant::now();
                            // A status line a minute, when anything changed.
                            let status = self.status();
                            if status != last_status {
                                log.line(&status);
                                last_status = status;
                            }
                        }
                    }
                }
                self.dispatch();
            }
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts queued rollouts while slots are free.
    fn dispatch(self: &Arc<Self>) {
        let mut inner = self.lock();
        while inner.running.len() < self.slots && !self.stopping.load(Ordering::SeqCst) {
            let Some(item) = inner.queue.pop_front() else { break };
            let id = item.served.as_ref().expect("served rollouts have ids").rollout_id.clone();
            let Some(state) = self.suites.get(suite_of(&item)) else { continue };
            let engine = state.engine.clone();
            let service = self.clone();
            let kept = item.clone();
            let handle = tokio::spawn(async move {
                let row = engine.run_one(item).await;
                service.emit(row);
                service.wake.notify_one();
            });
            inner.running.insert(id.clone(), (handle.abort_handle(), kept));
            if let Some(e) = inner.rollouts.get_mut(&id) {
                e.phase = Phase::Running;
            }
        }
        metrics::get().queue_depth.set(inner.queue.len() as i64);
        let warm: usize = self.suites.values().map(|s| s.engine.warm()).sum();
        metrics::get().warm_ready.set(warm as i64);
    }

    /// Records a finished rollout once (a cancelled one may finish meanwhile: the first row
    /// wins) and wakes the result readers.
    fn emit(&self, row: Row) -> Option<usize> {
        let id = row.rollout_id.clone().unwrap_or_default();
        let mut inner = self.lock();
        inner.running.remove(&id);
        let entry = inner.rollouts.get_mut(&id)?;
        if entry.phase == Phase::Done {
            return None;
        }
        let mut writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = writer.append(row.clone()) {
            tracing::error!("recording rollout {id}: {e:#}");
            return None;
        }
        metrics::get().record(&row);
        let cursor = writer.rows() - 1;
        entry.phase = Phase::Done;
        entry.cursor = Some(cursor);
        // send_replace: the count is kept even when no reader waits right now.
        self.rows.send_replace(writer.rows());
        Some(cursor)
    }

    fn record(&self, record: &Record) -> ApiResult<()> {
        let mut line = serde_json::to_vec(record).map_err(|e| ApiError::new(500, e.to_string()))?;
        line.push(b'\n');
        let mut file = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        file.write_all(&line).and_then(|_| file.sync_data()).map_err(|e| ApiError::new(500, format!("journaling the request: {e}")))
    }

    fn new_id(&self, prefix: &str) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let digest = <sha2::Sha256 as sha2::Digest>::digest(format!("{}-{nanos}-{n}-{}", self.run_id, std::process::id()).as_bytes());
        format!("{prefix}-{}", digest.iter().take(8).map(|b| format!("{b:02x}")).collect::<String>())
    }

    fn suite(&self, name: Option<&str>, field: &str) -> ApiResult<(&str, &SuiteState)> {
        let name = match name.or(self.default_suite.as_deref()) {
            Some(n) => n,
            None => {
                let names: Vec<&str> = self.suites.keys().map(String::as_str).collect();
                return Err(ApiError::field(400, field, format!("several suites are served ({}): name one", names.join(", "))));
            }
        };
        match self.suites.get_key_value(name) {
            Some((k, v)) => Ok((k.as_str(), v)),
            None => Err(ApiError::field(404, field, format!("no suite {name:?} is served"))),
        }
    }

    fn task(&self, suite: &SuiteState, task_id: &str, field: &str) -> ApiResult<(Arc<Task>, Arc<Snapshot>)> {
        let task = suite.tasks.get(task_id).ok_or_else(|| ApiError::field(404, field, format!("no task {task_id:?} in suite {:?}", suite.engine.suite_name)))?;
        match suite.snapshots.get(task_id) {
            Some(Ok(s)) => Ok((task.clone(), s.clone())),
            Some(Err(e)) => Err(ApiError::field(409, field, format!("task {task_id:?} cannot run: {e}"))),
            None => Err(ApiError::field(500, field, format!("task {task_id:?} has no snapshot"))),
        }
    }

    fn check_admitting(&self) -> ApiResult<()> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err(ApiError::new(503, "the service is shutting down"));
        }
        Ok(())
    }

    /// A request's task: a served task by id, or an inline task (a JSONL task table's row),
    /// whose snapshot is made (or reused) when it needs one.
    async fn resolve_task(&self, suite: &SuiteState, task_id: Option<&str>, inline: Option<&serde_json::Value>, at: &(dyn Fn(&str) -> String + Sync)) -> ApiResult<(Arc<Task>, Arc<Snapshot>)> {
        match (task_id, inline) {
            (Some(id), None) => self.task(suite, id, &at("task_id")),
            (None, Some(value)) => {
                let task = datasets::task_from_json(value.clone()).map_err(|e| ApiError::field(400, at("task"), format!("not a task: {e}")))?;
                if suite.engine.config.scoring.external.is_empty() && !task.is_scorable() {
                    return Err(ApiError::field(400, at("task"), "the task has neither a test command nor an expected answer, and the suite sets no scoring.external"));
                }
                let task = Arc::new(task);
                let snapshots = suite.engine.prepare(std::slice::from_ref(&task), 1, &|_: &str| {}).await.map_err(|e| ApiError::new(500, format!("{e:#}")))?;
                match snapshots.get(&task.id) {
                    Some(Ok(s)) => Ok((task.clone(), s.clone())),
                    Some(Err(e)) => Err(ApiError::field(422, at("task"), e.clone())),
                    None => Err(ApiError::field(500, at("task"), "no snapshot was made")),
                }
            }
            (Some(_), Some(_)) => Err(ApiError::field(400, at("task"), "give task_id or task, not both")),
            (None, None) => Err(ApiError::field(400, at("task_id"), "missing: give task_id (a served task) or task (an inline task)")),
        }
    }

    /// `POST /v1/rollouts`.
    pub async fn submit(&self, request: SubmitRequest, idempotency_key: Option<String>, body_digest: String) -> ApiResult<serde_json::Value> {
        self.check_admitting()?;
        if let Some(key) = &idempotency_key {
            if let Some((digest, response)) = self.lock().idempotency.get(key) {
                if *digest != body_digest {
                    return Err(ApiError::field(422, "Idempotency-Key", "this key was used with a different request body"));
                }
                return Ok(response.clone());
            }
        }
        if request.items.is_empty() {
            return Err(ApiError::field(400, "items", "must hold at least one item"));
        }
        let mut planned = Vec::new();
        let mut admitted = Vec::new();
        let mut groups = Vec::new();
        for (i, item) in request.items.iter().enumerate() {
            let at = |f: &str| format!("items[{i}].{f}");
            let (suite_name, suite) = self.suite(item.suite.as_deref(), &at("suite"))?;
            if item.n == 0 || item.n > self.settings.max_samples_per_item {
                return Err(ApiError::field(400, at("n"), format!("must be 1 to {} (serve.max_samples_per_item)", self.settings.max_samples_per_item)));
            }
            let metadata = metadata_text(item.metadata.as_ref(), &at("metadata"))?;
            let (task, snapshot) = self.resolve_task(suite, item.task_id.as_deref(), item.task.as_ref(), &at).await?;
            let policy = Arc::new(item.policy.build().map_err(|(field, message)| ApiError::field(400, at(&format!("policy.{field}")), message))?);
            let limits = item.limits.apply(&suite.engine.config.rollouts).map_err(|(field, message)| ApiError::field(400, at(&format!("limits.{field}")), message))?;
            let group_id = self.new_id("g");
            let mut ids = Vec::new();
            for sample in 0..item.n {
                let rollout_id = self.new_id("r");
                let seed = rollout_seed(item.seed, &task.id, sample);
                let served = Served { suite: suite_name.to_string(), rollout_id: rollout_id.clone(), group_id: group_id.clone(), policy_version: item.policy_version, metadata: metadata.clone() };
                admitted.push(Admitted {
                    rollout_id: rollout_id.clone(),
                    group_id: group_id.clone(),
                    suite: suite_name.to_string(),
                    task_id: task.id.clone(),
                    sample,
                    seed,
                    policy_version: item.policy_version,
                    policy_name: policy.name().to_string(),
                    metadata: metadata.clone(),
                });
                planned.push(Planned {
                    task: task.clone(),
                    sample,
                    seed,
                    snapshot: Ok(snapshot.clone()),
                    policy: policy.clone(),
                    limits: limits.clone(),
                    served: Some(served),
                });
                ids.push(rollout_id);
            }
            groups.push(json!({ "group_id": group_id, "task_id": task.id, "suite": suite_name, "rollout_ids": ids }));
        }
        let response = json!({ "groups": groups });
        {
            let mut inner = self.lock();
            // Checked again under the lock: a retry with the same key may have been admitted
            // while this one prepared, and a shutdown may have begun.
            if self.stopping.load(Ordering::SeqCst) {
                return Err(ApiError::new(503, "the service is shutting down"));
            }
            if let Some(key) = &idempotency_key {
                if let Some((digest, response)) = inner.idempotency.get(key) {
                    if *digest != body_digest {
                        return Err(ApiError::field(422, "Idempotency-Key", "this key was used with a different request body"));
                    }
                    return Ok(response.clone());
                }
            }
            let room = self.settings.queue_limit.saturating_sub(inner.queue.len());
            if planned.len() > room {
                let per_slot = inner.queue.len() / self.slots.max(1);
                return Err(ApiError {
                    status: 429,
                    message: format!(
                        "the queue holds {} rollouts (serve.queue_limit {}); {} more do not fit: retry later",
                        inner.queue.len(),
                        self.settings.queue_limit,
                        planned.len()
                    ),
                    field: None,
                    retry_after: Some((per_slot as u64).clamp(1, 60)),
                });
            }
            // Journaled before it is admitted or answered: a crash after this line reports
            // these rollouts as lost, never forgets them.
            self.record(&Record::Submit { idempotency_key: idempotency_key.clone(), body_digest: body_digest.clone(), response: response.clone(), rollouts: admitted })?;
            if let Some(key) = idempotency_key {
                inner.idempotency.insert(key, (body_digest, response.clone()));
            }
            for p in planned {
                let s = p.served.as_ref().expect("served");
                inner.rollouts.insert(s.rollout_id.clone(), Entry { session: None, group_id: s.group_id.clone(), policy_version: s.policy_version, phase: Phase::Queued, cursor: None });
                inner.queue.push_back(p);
            }
            metrics::get().queue_depth.set(inner.queue.len() as i64);
        }
        self.wake.notify_one();
        Ok(response)
    }

    /// `GET /v1/results`: rows from `cursor`, waiting up to `wait` for the first.
    pub async fn results(&self, cursor: usize, max: usize, wait: Duration) -> ApiResult<(Vec<Vec<u8>>, usize)> {
        let mut rows = self.rows.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        while *rows.borrow_and_update() <= cursor {
            if tokio::time::timeout_at(deadline, rows.changed()).await.is_err() {
                break;
            }
        }
        // The index is copied under the lock; the lines are read without it.
        let (journal, index) = {
            let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            (writer.journal_path(), writer.line_index(cursor, max, RESULTS_MAX_BYTES))
        };
        let lines = crate::engine::output::read_lines_at(&journal, &index).map_err(|e| ApiError::new(500, format!("reading the journal: {e:#}")))?;
        let next = cursor + lines.len();
        Ok((lines, next))
    }

    /// `GET /v1/rollouts/{id}`.
    pub fn rollout(&self, id: &str) -> ApiResult<serde_json::Value> {
        let entry = self.lock().rollouts.get(id).cloned().ok_or_else(|| ApiError::new(404, format!("no rollout {id:?}")))?;
        let mut out = json!({ "rollout_id": id, "group_id": entry.group_id, "policy_version": entry.policy_version, "state": entry.phase, "cursor": entry.cursor });
        if let Some(cursor) = entry.cursor {
            let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            let line = writer.read_lines(cursor, 1).map_err(|e| ApiError::new(500, format!("reading the journal: {e:#}")))?;
            if let Some(line) = line.first() {
                out["row"] = serde_json::from_slice(line).unwrap_or_default();
            }
        }
        Ok(out)
    }

    /// Cancels queued or running rollouts: each gets an `env_error` row saying why.
    fn cancel_ids(&self, ids: &[String], why: &str) -> usize {
        let mut cancelled = Vec::new();
        {
            let mut inner = self.lock();
            for id in ids {
                let Some(entry) = inner.rollouts.get(id) else { continue };
                match entry.phase {
                    Phase::Queued => {
                        if let Some(pos) = inner.queue.iter().position(|p| p.served.as_ref().is_some_and(|s| s.rollout_id == *id)) {
                            cancelled.push(inner.queue.remove(pos).expect("position is in range"));
                        }
                    }
                    Phase::Running => {
                        if let Some((handle, item)) = inner.running.remove(id) {
                            // The rollout's VMs are killed as its task is dropped.
                            handle.abort();
                            cancelled.push(item);
                        }
                    }
                    Phase::Session | Phase::Done => {}
                }
            }
        }
        let mut n = 0;
        for item in cancelled {
            let engine = &self.suites[suite_of(&item)].engine;
            // None: the rollout's own row came first; it was not cancelled after all.
            if self.emit(engine.ended(&item, End::Cancelled(why.into()))).is_some() {
                n += 1;
            }
        }
        self.wake.notify_one();
        n
    }

    /// `POST /v1/rollouts/{id}/cancel`.
    pub fn cancel(&self, id: &str) -> ApiResult<serde_json::Value> {
        let phase = self.lock().rollouts.get(id).map(|e| e.phase).ok_or_else(|| ApiError::new(404, format!("no rollout {id:?}")))?;
        if phase == Phase::Session {
            return Err(ApiError::new(409, format!("rollout {id:?} is a live session: DELETE /v1/sessions/{{id}} ends it")));
        }
        let n = self.cancel_ids(&[id.to_string()], "by request");
        Ok(json!({ "rollout_id": id, "cancelled": n == 1, "state": if n == 1 { Phase::Done } else { phase } }))
    }

    /// `POST /v1/cancel {"policy_version_below": V}`.
    pub fn cancel_below(&self, version: u64) -> serde_json::Value {
        let ids: Vec<String> = self
            .lock()
            .rollouts
            .iter()
            .filter(|(_, e)| matches!(e.phase, Phase::Queued | Phase::Running) && e.policy_version.is_some_and(|v| v < version))
            .map(|(id, _)| id.clone())
            .collect();
        let n = self.cancel_ids(&ids, &format!("policy_version below {version}"));
        json!({ "cancelled": n })
    }

    /// One log line: rows recorded by status, work in flight.
    fn status(&self) -> String {
        let counts: Vec<(Status, u64)> = Status::ALL.iter().map(|s| (*s, metrics::get().rollouts.with_label_values(&[s.as_str()]).get())).collect();
        let shown: Vec<String> = counts.iter().map(|(s, n)| format!("{s} {n}")).collect();
        let inner = self.lock();
        format!(
            "{} rows recorded since start ({}); {} running, {} queued, {} sessions",
            counts.iter().map(|(_, n)| n).sum::<u64>(),
            shown.join(", "),
            inner.running.len(),
            inner.queue.len(),
            inner.sessions.len()
        )
    }

    /// `GET /v1/capacity`.
    pub fn capacity(&self) -> serde_json::Value {
        let inner = self.lock();
        let warm: usize = self.suites.values().map(|s| s.engine.warm()).sum();
        json!({
            "slots": self.slots,
            "in_flight": inner.running.len(),
            "queued": inner.queue.len(),
            "warm": warm,
            "queue_limit": self.settings.queue_limit,
            "sessions": inner.sessions.len(),
            "max_sessions": self.settings.max_sessions,
        })
    }

    /// Memory for one more VM, or a clear refusal.
    fn check_memory(&self) -> ApiResult<()> {
        let host = crate::run::counts::Host::probe();
        let need = self.guest_mib as u64 + crate::run::counts::QEMU_OVERHEAD_MIB;
        match host.mem_available_mib {
            Some(free) if free < need * 2 => Err(ApiError::new(503, format!("the host has {free} MiB available; a VM needs {need} MiB and the service keeps as much in reserve"))),
            _ => Ok(()),
        }
    }

    /// Reserves a session slot until the session is added (or the reservation dropped).
    fn take_session_slot(&self) -> ApiResult<SessionSlot<'_>> {
        self.check_admitting()?;
        self.check_memory()?;
        let mut inner = self.lock();
        let live = inner.sessions.len() + inner.reserved;
        if live >= self.settings.max_sessions {
            return Err(ApiError { retry_after: Some(5), ..ApiError::new(429, format!("{live} sessions are live or opening (serve.max_sessions {})", self.settings.max_sessions)) });
        }
        inner.reserved += 1;
        Ok(SessionSlot(self))
    }

    fn add_session(&self, slot: SessionSlot<'_>, session: Session, admitted: Admitted) -> ApiResult<()> {
        let mut inner = self.lock();
        if self.stopping.load(Ordering::SeqCst) {
            return Err(ApiError::new(503, "the service is shutting down"));
        }
        // Journaled under the lock, so a shutdown sweep sees either no session or a
        // recorded one.
        self.record(&Record::Session { session_id: session.id.clone(), rollout: admitted.clone() })?;
        inner.reserved -= 1;
        std::mem::forget(slot);
        inner.rollouts.insert(admitted.rollout_id.clone(), Entry { session: Some(session.id.clone()), group_id: admitted.group_id, policy_version: admitted.policy_version, phase: Phase::Session, cursor: None });
        inner.touched.insert(session.id.clone(), Instant::now());
        inner.sessions.insert(session.id.clone(), Arc::new(tokio::sync::Mutex::new(session)));
        metrics::get().sessions_live.set(inner.sessions.len() as i64);
        Ok(())
    }

    /// `POST /v1/sessions`.
    pub async fn open_session(&self, request: SessionRequest) -> ApiResult<serde_json::Value> {
        let slot = self.take_session_slot()?;
        let metadata = metadata_text(request.metadata.as_ref(), "metadata")?;
        let (suite_name, suite) = self.suite(request.suite.as_deref(), "suite")?;
        let (task, snapshot) = self.resolve_task(suite, request.task_id.as_deref(), request.task.as_ref(), &|f: &str| f.to_string()).await?;
        let limits = request.limits.apply(&suite.engine.config.rollouts).map_err(|(f, m)| ApiError::field(400, format!("limits.{f}"), m))?;
        let seed = rollout_seed(request.seed, &task.id, 0);
        let rollout_id = self.new_id("r");
        let session_id = self.new_id("s");
        let group_id = self.new_id("g");
        let planned = Planned {
            task: task.clone(),
            sample: 0,
            seed,
            snapshot: Ok(snapshot.clone()),
            policy: Arc::new(Policy::Actions(Vec::new())),
            limits: limits.clone(),
            served: Some(Served { suite: suite_name.to_string(), rollout_id: rollout_id.clone(), group_id: group_id.clone(), policy_version: request.policy_version, metadata: metadata.clone() }),
        };
        let live = suite.engine.open(&task, &snapshot, seed, &limits, Role::Session).await.map_err(|end| ApiError::new(503, format!("opening the session failed: {end:?}")))?;
        let admitted = Admitted {
            rollout_id: rollout_id.clone(),
            group_id: group_id.clone(),
            suite: suite_name.to_string(),
            task_id: task.id.clone(),
            sample: 0,
            seed,
            policy_version: request.policy_version,
            policy_name: "session".into(),
            metadata,
        };
        let session = Session {
            id: session_id.clone(),
            suite: suite_name.to_string(),
            task: task.clone(),
            snapshot,
            live: Some(live),
            steps: Vec::new(),
            limits,
            planned,
            spent: Duration::ZERO,
            _branch: None,
        };
        self.add_session(slot, session, admitted)?;
        Ok(json!({ "session_id": session_id, "rollout_id": rollout_id, "group_id": group_id, "task_id": task.id, "suite": suite_name, "instruction": task.instruction }))
    }

    fn session(&self, id: &str) -> ApiResult<Arc<tokio::sync::Mutex<Session>>> {
        let mut inner = self.lock();
        let session = inner.sessions.get(id).cloned().ok_or_else(|| ApiError::new(404, format!("no live session {id:?}")))?;
        if inner.submitting.contains(id) {
            return Err(ApiError::new(409, format!("session {id:?} is being submitted")));
        }
        inner.touched.insert(id.to_string(), Instant::now());
        Ok(session)
    }

    /// Marks a session used now, if it is still live.
    fn touch(&self, id: &str) {
        let mut inner = self.lock();
        if inner.sessions.contains_key(id) {
            inner.touched.insert(id.to_string(), Instant::now());
        }
    }

    /// `POST /v1/sessions/{id}/exec` and `/write_file`: one action, its observation. The
    /// session's actions share its `timeout_secs` budget, as a rollout's do; past it the
    /// session ends as a `timeout`.
    pub async fn act(&self, id: &str, action: Action, timeout_secs: Option<u64>) -> ApiResult<serde_json::Value> {
        let session = self.session(id)?;
        let mut session = session.lock().await;
        let live = session.live.as_ref().ok_or_else(|| ApiError::new(404, format!("session {id:?} has ended")))?;
        if session.steps.len() >= session.limits.max_steps {
            return Err(ApiError::new(409, format!("session {id:?} took its {} steps (rollouts.max_steps): submit it", session.limits.max_steps)));
        }
        let mut limits = session.limits.clone();
        if let Some(t) = timeout_secs {
            if t == 0 {
                return Err(ApiError::field(400, "timeout_secs", "must be at least 1"));
            }
            limits.step_timeout_secs = t.min(limits.step_timeout_secs);
        }
        let engine = self.suites[&session.suite].engine.clone();
        let index = session.steps.len() as u32;
        let budget = Duration::from_secs(limits.timeout_secs).saturating_sub(session.spent);
        let started = Instant::now();
        let result = tokio::time::timeout(budget, engine.act(live, &action, index, &limits)).await;
        session.spent += started.elapsed();
        self.touch(id);
        let ended = |session: &mut Session, end: End, steps: Vec<Step>| {
            let mut row = engine.ended(&session.planned, end);
            row.policy_name = "session".into();
            row.steps = steps;
            session.live = None;
            (row.status, row.error.clone(), self.emit(row))
        };
        match result {
            Ok(Ok((step, _))) => {
                let out = json!({ "step": step, "observation": crate::engine::observation(&step), "ended": false });
                session.steps.push(step);
                Ok(out)
            }
            Ok(Err((step, reason))) => {
                // The action took the VM down: the session ends as the agent's failure.
                session.steps.push(step.clone());
                let steps = session.steps.clone();
                let (status, error, cursor) = ended(&mut session, End::AgentBrokeVm(reason), steps);
                drop(session);
                self.drop_session(id, Phase::Done);
                Ok(json!({ "step": step, "observation": crate::engine::observation(&step), "ended": true, "status": status, "error": error, "cursor": cursor }))
            }
            Err(_) => {
                let steps = session.steps.clone();
                let secs = limits.timeout_secs;
                let (status, error, cursor) = ended(&mut session, End::Timeout(secs), steps);
                drop(session);
                self.drop_session(id, Phase::Done);
                Ok(json!({ "step": null, "observation": format!("the session ran past its {secs} s limit"), "ended": true, "status": status, "error": error, "cursor": cursor }))
            }
        }
    }

    /// `POST /v1/sessions/{id}/branch`.
    pub async fn branch(&self, id: &str) -> ApiResult<serde_json::Value> {
        let slot = self.take_session_slot()?;
        let session = self.session(id)?;
        let session = session.lock().await;
        let live = session.live.as_ref().ok_or_else(|| ApiError::new(404, format!("session {id:?} has ended")))?;
        let engine = self.suites[&session.suite].engine.clone();
        let planned_parent = session.planned.served.clone().expect("sessions are served");
        let rollout_id = self.new_id("r");
        let session_id = self.new_id("s");
        let seed = rollout_seed(session.planned.seed, &rollout_id, 0);
        let (child, branch) = engine
            .branch(live, &session.snapshot, &self.branches, seed, Role::Session)
            .await
            .map_err(|e| ApiError::new(503, format!("branching session {id:?} failed: {e:#}")))?;
        let mut planned = session.planned.clone();
        planned.seed = seed;
        planned.served = Some(Served { rollout_id: rollout_id.clone(), ..planned_parent.clone() });
        let admitted = Admitted {
            rollout_id: rollout_id.clone(),
            group_id: planned_parent.group_id.clone(),
            suite: session.suite.clone(),
            task_id: session.task.id.clone(),
            sample: 0,
            seed,
            policy_version: planned_parent.policy_version,
            policy_name: "session".into(),
            metadata: planned_parent.metadata.clone(),
        };
        let new = Session {
            id: session_id.clone(),
            suite: session.suite.clone(),
            task: session.task.clone(),
            snapshot: session.snapshot.clone(),
            live: Some(child),
            steps: session.steps.clone(),
            limits: session.limits.clone(),
            planned,
            spent: session.spent,
            _branch: Some(branch),
        };
        drop(session);
        self.add_session(slot, new, admitted)?;
        Ok(json!({ "session_id": session_id, "rollout_id": rollout_id, "group_id": planned_parent.group_id, "parent": id }))
    }

    /// `POST /v1/sessions/{id}/submit`: ends the session, scores it like any rollout (with
    /// the suite's scoring mode: by default in a fresh fork, where the session cannot reach)
    /// and records the row.
    pub async fn submit_session(&self, id: &str, answer: Option<String>) -> ApiResult<serde_json::Value> {
        let session = self.session(id)?;
        // From here on, expiry, DELETE and shutdown leave this session to finish.
        if !self.lock().submitting.insert(id.to_string()) {
            return Err(ApiError::new(409, format!("session {id:?} is being submitted")));
        }
        let mut session = session.lock().await;
        let Some(live) = session.live.take() else {
            self.lock().submitting.remove(id);
            return Err(ApiError::new(404, format!("session {id:?} has ended")));
        };
        let engine = self.suites[&session.suite].engine.clone();
        let started = Instant::now();
        let mut row = engine.ended(&session.planned, End::Scored);
        row.policy_name = "session".into();
        row.status = Status::EnvError;
        row.steps = session.steps.clone();
        row.timings.rollout_ms = session.spent.as_secs_f64() * 1e3;
        let (task, snapshot) = (session.task.clone(), session.snapshot.clone());
        let end = engine.finish(live, &task, &snapshot, answer, &mut row).await;
        end.settle(&mut row);
        row.timings.total_ms = started.elapsed().as_secs_f64() * 1e3;
        let cursor = self.emit(row.clone());
        drop(session);
        self.drop_session(id, Phase::Done);
        Ok(json!({ "rollout_id": row.rollout_id, "status": row.status, "reward": row.reward, "error": row.error, "trust": row.trust, "trust_reason": row.trust_reason, "cursor": cursor, "score_details": serde_json::from_str::<serde_json::Value>(&row.score_details).unwrap_or_default() }))
    }

    /// `DELETE /v1/sessions/{id}`: ends it without a row.
    pub fn end_session(&self, id: &str, reason: &str) -> ApiResult<serde_json::Value> {
        {
            let inner = self.lock();
            if !inner.sessions.contains_key(id) {
                return Err(ApiError::new(404, format!("no live session {id:?}")));
            }
            if inner.submitting.contains(id) {
                return Err(ApiError::new(409, format!("session {id:?} is being submitted")));
            }
            self.record(&Record::SessionEnd { session_id: id.to_string(), reason: reason.to_string() })?;
        }
        self.drop_session(id, Phase::Done);
        Ok(json!({ "session_id": id, "ended": true }))
    }

    fn drop_session(&self, id: &str, phase: Phase) {
        let mut inner = self.lock();
        inner.sessions.remove(id);
        inner.touched.remove(id);
        inner.submitting.remove(id);
        let rollout = inner.rollouts.iter().find(|(_, e)| e.session.as_deref() == Some(id)).map(|(r, _)| r.clone());
        if let Some(entry) = rollout.and_then(|r| inner.rollouts.get_mut(&r)) {
            if entry.phase == Phase::Session {
                entry.phase = phase;
            }
        }
        metrics::get().sessions_live.set(inner.sessions.len() as i64);
    }

    fn expire_sessions(&self) {
        let lease = Duration::from_secs(self.settings.session_lease_secs);
        let idle: Vec<String> = {
            let mut inner = self.lock();
            let Inner { touched, sessions, submitting, .. } = &mut *inner;
            touched.retain(|id, _| sessions.contains_key(id));
            touched.iter().filter(|(id, t)| t.elapsed() > lease && !submitting.contains(*id)).map(|(id, _)| id.clone()).collect()
        };
        for id in idle {
            tracing::info!(session_id = %id, "session expired");
            let _ = self.end_session(&id, "expired");
        }
    }

    /// Stops admitting, cancels queued and running rollouts (each recorded as cancelled),
    /// and ends every session.
    pub async fn shut_down(&self) {
        {
            // Under the lock: whatever is admitted is admitted before this, and is swept.
            let _inner = self.lock();
            self.stopping.store(true, Ordering::SeqCst);
        }
        let ids: Vec<String> = self.lock().rollouts.iter().filter(|(_, e)| matches!(e.phase, Phase::Queued | Phase::Running)).map(|(id, _)| id.clone()).collect();
        self.cancel_ids(&ids, "the service shut down");
        let sessions: Vec<String> = {
            let inner = self.lock();
            inner.sessions.keys().filter(|id| !inner.submitting.contains(*id)).cloned().collect()
        };
        for id in sessions {
            let _ = self.end_session(&id, "the service shut down");
        }
    }

    /// Writes pending rows into a Parquet part.
    pub fn flush(&self) -> Result<()> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner()).flush()
    }

    /// The Parquet schema of rows (for the Arrow stream).
    pub fn schema(&self) -> Arc<arrow_schema::Schema> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner()).schema()
    }
}

/// A session slot taken by [`Service::take_session_slot`]; given back when dropped unless
/// the session was added.
struct SessionSlot<'a>(&'a Service);

impl Drop for SessionSlot<'_> {
    fn drop(&mut self) {
        self.0.lock().reserved -= 1;
    }
}

/// A request's metadata as JSON text, within its size limit.
fn metadata_text(metadata: Option<&serde_json::Value>, field: &str) -> ApiResult<Option<String>> {
    let Some(m) = metadata else { return Ok(None) };
    let text = m.to_string();
    if text.len() > METADATA_MAX_BYTES {
        return Err(ApiError::field(413, field, format!("{} bytes of JSON; at most {METADATA_MAX_BYTES}", text.len())));
    }
    Ok(Some(text))
}

/// The suite a served rollout belongs to.
fn suite_of(item: &Planned) -> &str {
    item.served.as_ref().map(|s| s.suite.as_str()).unwrap_or_default()
}

/// The `env_error` row of a rollout a previous process admitted and never finished.
fn lost_row(a: &Admitted, run_id: &str) -> Row {
    let mut row = Row {
        run_id: run_id.to_string(),
        suite_name: a.suite.clone(),
        policy_name: a.policy_name.clone(),
        attempts: 0,
        started_at_ms: now_ms(),
        rollout_id: Some(a.rollout_id.clone()),
        group_id: Some(a.group_id.clone()),
        policy_version: a.policy_version,
        metadata: a.metadata.clone(),
        ..Row::blank(&a.task_id, a.sample, a.seed)
    };
    End::LostInRestart.settle(&mut row);
    row
}

/// Rollout id -> cursor of every row in the journal.
fn rows_by_id(writer: &OutputWriter) -> Result<HashMap<String, usize>> {
    #[derive(Deserialize)]
    struct Id {
        #[serde(default)]
        rollout_id: Option<String>,
    }
    let mut out = HashMap::new();
    for (i, line) in writer.read_lines(0, usize::MAX)?.iter().enumerate() {
        if let Ok(Id { rollout_id: Some(id) }) = serde_json::from_slice(line) {
            out.insert(id, i);
        }
    }
    Ok(out)
}

/// The records of `requests.jsonl` up to a torn last line, and the length they take.
fn read_records(path: &PathBuf) -> Result<(Vec<Record>, u64)> {
    let Ok(file) = std::fs::File::open(path) else { return Ok((Vec::new(), 0)) };
    let mut reader = std::io::BufReader::new(file);
    let (mut records, mut len) = (Vec::new(), 0u64);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 || line.last() != Some(&b'\n') {
            break;
        }
        match serde_json::from_slice(&line) {
            Ok(r) => records.push(r),
            Err(_) => break,
        }
        len += n as u64;
    }
    Ok((records, len))
}

/// `POST /v1/rollouts` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    pub items: Vec<SubmitItem>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitItem {
    /// Which served suite (optional when one is served).
    #[serde(default)]
    pub suite: Option<String>,
    /// A served task's id; or:
    #[serde(default)]
    pub task_id: Option<String>,
    /// An inline task, as a row of a JSONL task table.
    #[serde(default)]
    pub task: Option<serde_json::Value>,
    /// Samples: one group.
    #[serde(default = "one")]
    pub n: u32,
    #[serde(default)]
    pub seed: u64,
    pub policy: PolicyRequest,
    #[serde(default)]
    pub policy_version: Option<u64>,
    #[serde(default)]
    pub limits: LimitsRequest,
    #[serde(default)]
    pub metadata: Option<serde_json::Value>,
}

fn one() -> u32 {
    1
}

/// A request's policy: an OpenAI-compatible endpoint, or actions to replay.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum PolicyRequest {
    Openai {
        base_url: String,
        model: String,
        /// Sent as a bearer token to `base_url`. (The service never reads a key from its own
        /// environment for a request: a caller could send it anywhere.)
        #[serde(default)]
        api_key: Option<String>,
        #[serde(default)]
        temperature: Option<f64>,
        #[serde(default)]
        top_p: Option<f64>,
        #[serde(default)]
        max_tokens: Option<u32>,
        #[serde(default)]
        logprobs: Option<bool>,
        #[serde(default)]
        system_prompt: Option<String>,
        #[serde(default)]
        request_timeout_secs: Option<u64>,
    },
    Replay {
        actions: Vec<Action>,
    },
}

impl PolicyRequest {
    fn build(&self) -> std::result::Result<Policy, (String, String)> {
        match self {
            PolicyRequest::Replay { actions } => Ok(Policy::Actions(actions.clone())),
            PolicyRequest::Openai { base_url, model, api_key, temperature, top_p, max_tokens, logprobs, system_prompt, request_timeout_secs } => {
                let mut table = toml::Table::new();
                table.insert("base_url".into(), base_url.clone().into());
                table.insert("model".into(), model.clone().into());
                let mut config: crate::engine::openai::OpenAiConfig = table.try_into().map_err(|e: toml::de::Error| ("base_url".to_string(), e.to_string()))?;
                config.temperature = *temperature;
                config.top_p = *top_p;
                config.system_prompt = system_prompt.clone();
                if let Some(v) = max_tokens {
                    config.max_tokens = *v;
                }
                if let Some(v) = logprobs {
                    config.logprobs = *v;
                }
                if let Some(v) = request_timeout_secs {
                    config.request_timeout_secs = (*v).max(1);
                }
                if let Some(t) = temperature {
                    if !(0.0..=2.0).contains(t) {
                        return Err(("temperature".into(), format!("{t} is not in [0, 2]")));
                    }
                }
                let policy = crate::engine::openai::OpenAiPolicy::with_key(config, api_key.clone()).map_err(|e| ("base_url".to_string(), format!("{e:#}")))?;
                Ok(Policy::OpenAi(policy))
            }
        }
    }
}

/// Limits a request may lower (never raise) below the suite's `[rollouts]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsRequest {
    #[serde(default)]
    pub max_steps: Option<usize>,
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    #[serde(default)]
    pub step_timeout_secs: Option<u64>,
}

impl LimitsRequest {
    fn apply(&self, suite: &RolloutsSection) -> std::result::Result<RolloutsSection, (String, String)> {
        let mut out = suite.clone();
        let lower = |name: &str, asked: Option<u64>, max: u64| -> std::result::Result<u64, (String, String)> {
            match asked {
                None => Ok(max),
                Some(0) => Err((name.into(), "must be at least 1".into())),
                Some(v) if v > max => Err((name.into(), format!("{v} is above the suite's limit of {max}"))),
                Some(v) => Ok(v),
            }
        };
        out.max_steps = lower("max_steps", self.max_steps.map(|v| v as u64), suite.max_steps as u64)? as usize;
        out.timeout_secs = lower("timeout_secs", self.timeout_secs, suite.timeout_secs)?;
        out.step_timeout_secs = lower("step_timeout_secs", self.step_timeout_secs, suite.step_timeout_secs)?;
        Ok(out)
    }
}

/// `POST /v1/sessions` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    #[serde(default)]
    pub suite: Option<String>,
    #[serde(default)]
    pub task_id: Option<String>,
    /// An inline task, as a row of a JSONL task table.
    #[serde(default)]
    pub task: Option<serde_json::Value>,
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub policy_version: Option<u64>,
    #[serde(default)]
    pub limits: LimitsRequest,
    #[serde(default)]
    pub metadata: Option<serde_json::Value>,
}
