//! `farm run SUITE.toml`: the batch front-end of the rollout engine ([`crate::engine`]).
//!
//! config -> dataset -> template snapshot -> per-task snapshots -> forked rollouts (policy
//! acts) -> artifacts out -> protected scoring -> journal and Parquet parts -> summary.

pub mod counts;
pub mod suite;

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::Args;
use datasets::Task;
use sha2::{Digest, Sha256};

use crate::engine::output::{self, OutputWriter, Row, Status, Timings};
use crate::engine::{Engine, Planned, Policy};
use suite::Suite;

#[derive(Args)]
pub struct RunArgs {
    /// The suite file.
    suite: PathBuf,
    /// Output folder (default: the suite's `output.dir`, relative to the suite file).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Finish an interrupted run in the output folder (same suite file).
    #[arg(long)]
    resume: bool,
    /// Only the first N tasks.
    #[arg(long)]
    limit: Option<usize>,
    /// Rollouts at once (overrides `rollouts.concurrency`).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Accelerator: auto (KVM where it runs stock guests, else TCG), kvm or tcg.
    #[arg(long, default_value = "auto")]
    accel: vmm::AccelSetting,
    /// Serve Prometheus metrics at http://ADDR/metrics while the run lasts (e.g.
    /// 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
}

/// The suite's tasks: loaded, filtered by `dataset.tasks` and limited; checked scorable.
pub fn load_tasks(suite: &Suite, config: &suite::SuiteConfig, limit: Option<usize>) -> Result<Vec<Arc<Task>>> {
    let dataset_path = suite.resolve(&config.dataset.path);
    let mut tasks = datasets::load(&dataset_path, config.dataset.format)?;
    if !config.dataset.tasks.is_empty() {
        tasks.retain(|t| config.dataset.tasks.contains(&t.id));
    }
    if let Some(limit) = limit.or(config.dataset.limit) {
        tasks.truncate(limit);
    }
    if config.scoring.external.is_empty() {
        if let Some(t) = tasks.iter().find(|t| !t.is_scorable()) {
            anyhow::bail!("{}: task {:?} has neither a test command nor an expected answer, and the suite sets no scoring.external", dataset_path.display(), t.id);
        }
    }
    Ok(tasks.into_iter().map(Arc::new).collect())
}

pub async fn run(args: RunArgs) -> Result<i32> {
    // 1. Config.
    let suite = Suite::load(&args.suite)?;
    let mut config = suite.config.clone();
    if let Some(c) = args.concurrency {
        config.rollouts.concurrency = suite::Count::Fixed(c.max(1));
    }
    let out_dir = match &args.out {
        Some(dir) => dir.clone(),
        None => suite.resolve(&config.output.dir),
    };
    let log = Log::new();
    if let Some(addr) = args.metrics_listen {
        let bound = crate::metrics::serve(addr).await?;
        log.line(&format!("metrics on http://{bound}/metrics"));
    }

    // 2. Dataset.
    let tasks = load_tasks(&suite, &config, args.limit)?;
    let dataset_path = suite.resolve(&config.dataset.path);
    let policy = Arc::new(Policy::load(&suite, &config)?);
    let live_requests = if policy.is_live() { config.policy.openai().ok().map(|c| c.concurrency) } else { None };
    let counts = counts::resolve(config.rollouts.concurrency, config.rollouts.warm_pool, live_requests, config.template.memory_mib, &counts::Host::probe());

    // Output first: a run that cannot record must not start.
    let run_id = new_run_id();
    let writer = OutputWriter::open(&out_dir, &run_id, &config.suite.name, &suite.digest, args.resume, config.output.rows_per_part)?;
    let run_id = writer.run_id().to_string();
    let digests: HashMap<&str, String> = tasks.iter().map(|t| (t.id.as_str(), t.digest())).collect();
    if let Some(changed) = writer.outcomes().iter().find(|o| digests.get(o.task_id.as_str()).is_some_and(|d| *d != o.task_digest)) {
        anyhow::bail!(
            "task {:?} in {} changed since the recorded rollouts of this run: resuming would mix two versions of it; start a new run in another folder",
            changed.task_id,
            dataset_path.display()
        );
    }

    // Ctrl-C or SIGTERM while snapshots are prepared: stop at once (nothing has run yet).
    let mut signals = Signals::new()?;
    let prepared = tokio::select! {
        prepared = prepare(&suite, &config, &args, &run_id, &tasks, &policy, &writer, counts.concurrency, &log) => prepared?,
        code = signals.recv() => {
            log.line("interrupted while preparing snapshots; nothing ran");
            return Ok(code);
        }
    };
    let (mut engine, todo, planned_total) = prepared;
    if let Some(note) = vmm::jail::missing_cgroups_note() {
        log.line(&note);
    }
    if !counts.explanation.is_empty() {
        log.line(&counts.explanation);
    }
    let uses_template = todo.iter().any(|p| matches!(&p.snapshot, Ok(s) if s.id() == engine.template.id()));
    if uses_template {
        engine.start_pool(counts.warm_pool)?;
    }

    // 5. Rollouts, scored as they finish, each recorded as it ends.
    run_rollouts(Arc::new(engine), counts.concurrency, todo, writer, signals, planned_total, &log, &args, &out_dir).await
}

/// 3 and 4: the template snapshot, then a snapshot per task that has files or setup; the
/// rollouts still to run.
#[allow(clippy::too_many_arguments)]
async fn prepare(
    suite: &Suite,
    config: &suite::SuiteConfig,
    args: &RunArgs,
    run_id: &str,
    tasks: &[Arc<Task>],
    policy: &Arc<Policy>,
    writer: &OutputWriter,
    concurrency: usize,
    log: &Log,
) -> Result<(Engine, Vec<Planned>, usize)> {
    let progress = |line: &str| log.line(&format!("template: {line}"));
    let engine = Engine::start(suite, config, args.accel, run_id, &progress).await?;
    let mut plan = engine.plan(tasks, policy, config.rollouts.samples);
    let planned_total = plan.len();
    plan.retain(|p| !writer.done().contains(&output::plan_key(&p.task.id, p.sample)));
    log.line(&format!(
        "suite {} ({} tasks, {} rollouts planned, {} already done)",
        config.suite.name,
        tasks.len(),
        planned_total,
        planned_total - plan.len(),
    ));
    let mut needed: Vec<Arc<Task>> = plan.iter().map(|p| p.task.clone()).collect();
    needed.dedup_by(|a, b| a.id == b.id);
    let snapshots = engine.prepare(&needed, concurrency, &|line: &str| log.line(line)).await?;
    for p in &mut plan {
        p.snapshot = snapshots[&p.task.id].clone();
    }
    Ok((engine, plan, planned_total))
}

/// 5 and 6: run the rollouts with bounded concurrency, record each as it ends, summarise.
#[allow(clippy::too_many_arguments)]
async fn run_rollouts(
    engine: Arc<Engine>,
    concurrency: usize,
    planned: Vec<Planned>,
    mut writer: OutputWriter,
    mut signals: Signals,
    planned_total: usize,
    log: &Log,
    args: &RunArgs,
    out_dir: &std::path::Path,
) -> Result<i32> {
    let config = engine.config.clone();
    let total = planned.len();
    let metrics = crate::metrics::get();
    metrics.queue_depth.set(total as i64);
    let mut running = tokio::task::JoinSet::new();
    let mut queue = planned.into_iter();
    let mut progress = Progress::new(total);
    let mut interrupted = None;
    let wall = Instant::now();
    let mut write_time = Duration::ZERO;
    let mut finished_now = 0usize;
    loop {
        // Start what the concurrency allows.
        while running.len() < concurrency && interrupted.is_none() {
            let Some(item) = queue.next() else { break };
            metrics.queue_depth.dec();
            let engine = engine.clone();
            running.spawn(async move { engine.run_one(item).await });
        }
        metrics.warm_ready.set(engine.warm() as i64);
        if running.is_empty() {
            break;
        }
        tokio::select! {
            finished = running.join_next() => {
                let Some(finished) = finished else { break };
                let row = finished.context("a rollout task panicked")?;
                progress.record(&row, log);
                metrics.record(&row);
                let t = Instant::now();
                writer.append(row)?;
                write_time += t.elapsed();
                finished_now += 1;
            }
            code = signals.recv(), if interrupted.is_none() => {
                log.line(&format!("interrupted: stopping {} rollouts in flight; `farm run {} --resume` finishes the run", running.len(), args.suite.display()));
                interrupted = Some(code);
                // In-flight rollouts end now (their VMs are killed); they are not recorded and
                // will run again on resume. Rollouts that finished meanwhile are recorded.
                running.abort_all();
                while let Some(finished) = running.join_next().await {
                    if let Ok(row) = finished {
                        progress.record(&row, log);
                        writer.append(row)?;
                        finished_now += 1;
                    }
                }
                break;
            }
        }
    }
    progress.finish();

    // 6. Output.
    let t = Instant::now();
    writer.flush()?;
    write_time += t.elapsed();
    let mut summary = output::summary(writer.outcomes(), config.rollouts.samples, planned_total);
    summary["provenance"] = provenance(&engine);
    summary["performance"] = performance(&writer.outcomes()[writer.outcomes().len() - finished_now..], wall.elapsed(), write_time, concurrency);
    writer.write_summary(&summary)?;
    log.line(&format!(
        "{} of {} rollouts recorded: {} passed, {} failed, {} timeout, {} env_error; mean reward {}; summary in {}",
        writer.outcomes().len(),
        planned_total,
        summary["counts"]["passed"],
        summary["counts"]["failed"],
        summary["counts"]["timeout"],
        summary["counts"]["env_error"],
        summary["mean_reward"],
        out_dir.join("summary.json").display()
    ));
    Ok(interrupted.unwrap_or(0))
}

/// Throughput and per-phase times of the rollouts finished by this invocation.
fn performance(rows: &[output::Outcome], wall: Duration, write: Duration, concurrency: usize) -> serde_json::Value {
    let phase = |f: fn(&Timings) -> f64| {
        let mut v: Vec<f64> = rows.iter().map(|r| f(&r.timings)).collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        if v.is_empty() {
            return serde_json::json!(null);
        }
        let p = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        serde_json::json!({ "mean_ms": v.iter().sum::<f64>() / v.len() as f64, "p50_ms": p(0.5), "p99_ms": p(0.99) })
    };
    serde_json::json!({
        "rollouts": rows.len(),
        "concurrency": concurrency,
        "wall_secs": wall.as_secs_f64(),
        "rollouts_per_sec": rows.len() as f64 / wall.as_secs_f64().max(1e-9),
        "fork": phase(|t| t.fork_ms),
        "rollout": phase(|t| t.rollout_ms),
        "score": phase(|t| t.score_ms),
        "total": phase(|t| t.total_ms),
        "write_ms_total": write.as_secs_f64() * 1e3,
        "write_ms_per_rollout": write.as_secs_f64() * 1e3 / rows.len().max(1) as f64,
    })
}

/// Where and with what the run was made (for reports that must be told apart).
fn provenance(engine: &Engine) -> serde_json::Value {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    serde_json::json!({
        "host": host,
        "farm_version": env!("CARGO_PKG_VERSION"),
        "accel": format!("{:?}", engine.forker.vm.accel).to_lowercase(),
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "template_snapshot": engine.template.id(),
    })
}

pub fn new_run_id() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let digest = Sha256::digest(format!("{nanos}-{}", std::process::id()).as_bytes());
    format!("run-{}", digest.iter().take(6).map(|b| format!("{b:02x}")).collect::<String>())
}

/// Text fit for a terminal: control characters (a guest's file names, a candidate's error
/// text) are shown escaped, so nothing a rollout produced can move the cursor, retitle the
/// terminal or hide a line.
pub fn printable(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { c.escape_unicode().to_string() } else { c.to_string() }).collect()
}

/// Log lines: plain on a pipe; above a progress line on a terminal.
pub struct Log {
    tty: bool,
}

impl Log {
    pub fn new() -> Log {
        Log { tty: std::io::stderr().is_terminal() }
    }

    pub fn line(&self, text: &str) {
        if self.tty {
            eprint!("\r\x1b[2K");
        }
        eprintln!("farm: {}", printable(text));
    }
}

struct Progress {
    total: usize,
    done: usize,
    counts: std::collections::BTreeMap<Status, usize>,
    started: Instant,
    tty: bool,
}

impl Progress {
    fn new(total: usize) -> Progress {
        Progress { total, done: 0, counts: Default::default(), started: Instant::now(), tty: std::io::stderr().is_terminal() }
    }

    fn record(&mut self, row: &Row, log: &Log) {
        self.done += 1;
        *self.counts.entry(row.status).or_default() += 1;
        let elapsed = self.started.elapsed().as_secs_f64();
        let rate = self.done as f64 / elapsed.max(1e-3);
        let eta = (self.total - self.done) as f64 / rate.max(1e-9);
        let counts: Vec<String> = self.counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
        if self.tty {
            let width = 30;
            let filled = (self.done * width / self.total.max(1)).min(width);
            eprint!(
                "\r\x1b[2K[{}{}] {}/{} {:.2}/s ETA {:.0}s | {}",
                "#".repeat(filled),
                " ".repeat(width - filled),
                self.done,
                self.total,
                rate,
                eta,
                counts.join(", ")
            );
        } else {
            log.line(&format!(
                "{}/{} {} sample {}: {}{} ({:.1}/s, ETA {:.0}s)",
                self.done,
                self.total,
                row.task_id,
                row.sample_index,
                row.status,
                row.error.as_deref().map(|e| format!(" ({})", e.chars().take(200).collect::<String>())).unwrap_or_default(),
                rate,
                eta
            ));
        }
    }

    fn finish(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

/// SIGINT and SIGTERM, as exit codes.
pub struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn new() -> Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals { interrupt: signal(SignalKind::interrupt())?, terminate: signal(SignalKind::terminate())? })
    }

    pub async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.interrupt.recv() => 128 + libc::SIGINT,
            _ = self.terminate.recv() => 128 + libc::SIGTERM,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_text_cannot_carry_terminal_controls() {
        assert_eq!(printable("ok \u{1b}]0;PWNED\u{7}\r\nnext"), "ok \\u{1b}]0;PWNED\\u{7}\\u{d}\\u{a}next");
        assert_eq!(printable("plain: text"), "plain: text");
    }
}
