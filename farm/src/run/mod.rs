//! `farm run SUITE.toml`: the batch front-end of the rollout engine (`engine`). It reads the
//! command line, drives the engine's stages in order, shows progress, and turns signals into
//! a clean stop; the engine does the rest.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use datasets::Task;
use engine::config::{Count, PolicyOrigin, Suite};
use engine::recorder::summary::Provenance;
use engine::recorder::{Opened, Recorder, RecorderOptions, RunIdentity, SummaryInputs};
use engine::row::{plan_key, Row, Status};
use engine::shard::Shard;
use engine::sizing::{self, Counts};
use engine::{Engine, Planned, Policy, Preload};

use crate::signals::Signals;
use crate::ui::Progress;

#[derive(Args)]
pub struct RunArgs {
    /// The suite file.
    pub suite: PathBuf,
    /// Output folder (default: the suite's `output.dir`, relative to the suite file).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Finish an interrupted run in the output folder (same suite file).
    #[arg(long)]
    pub resume: bool,
    /// Only the first N tasks.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Rollouts at once (overrides `rollouts.concurrency`).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// How far apart checks are kept (overrides `scoring.isolation`): vm (each rollout's
    /// check in a VM that is the task's snapshot: a fresh fork, or one reset in place) or
    /// sandbox (harness checks share scoring VMs, each in a fresh sandbox; trust `shared`).
    #[arg(long, value_name = "vm|sandbox")]
    pub isolation: Option<scorers::ScoringIsolation>,
    /// How VMs start when one of the same snapshot is idle (overrides `rollouts.reuse`):
    /// reset (in place, exactly to the snapshot), fork (a new QEMU process) or auto (reset on
    /// a QEMU that keeps its translated code across a reset: the one the set-up builds).
    #[arg(long, value_name = "auto|reset|fork")]
    pub reuse: Option<engine::config::Reuse>,
    /// Accelerator: auto (KVM where it runs stock guests, else TCG), kvm or tcg.
    #[arg(long, default_value = "auto")]
    pub accel: engine::sizing::AccelSetting,
    /// Serve Prometheus metrics at http://ADDR/metrics while the run lasts (e.g.
    /// 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Run only the I-th of N parts of the suite (0-based: 0/4 to 3/4), split by task and
    /// balanced by planned rollouts; `auto` takes I and N from a Slurm job array or a
    /// Kubernetes Indexed Job. `farm merge` puts the parts' folders together.
    #[arg(long, value_name = "I/N|auto")]
    pub shard: Option<String>,
    /// With `--shard auto` under a Kubernetes Indexed Job: how many shards (default: the
    /// FARM_SHARDS variable).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub shards: Option<u32>,
}

impl RunArgs {
    /// The suite with the command line's overrides applied, and the output folder.
    fn suite(&self) -> Result<(Suite, PathBuf)> {
        let mut suite = Suite::load(&self.suite)?;
        if let Some(c) = self.concurrency {
            suite.config.rollouts.concurrency = Count::Fixed(c.max(1));
        }
        if let Some(isolation) = self.isolation {
            if isolation == scorers::ScoringIsolation::Sandbox
                && suite.config.scoring.mode != scorers::ScoringMode::FreshFork
            {
                anyhow::bail!(
                    "--isolation sandbox shares fresh scoring VMs; the suite's scoring.mode is not \"fresh_fork\""
                );
            }
            suite.config.scoring.isolation = isolation;
        }
        if let Some(reuse) = self.reuse {
            suite.config.rollouts.reuse = reuse;
        }
        let out = self
            .out
            .clone()
            .unwrap_or_else(|| suite.resolve(&suite.config.output.dir));
        Ok((suite, out))
    }

    /// The part of the suite to run (`--shard`), None for all of it.
    fn shard(&self) -> Result<Option<Shard>, engine::shard::ShardError> {
        match self.shard.as_deref() {
            None => Ok(None),
            Some("auto") => Shard::from_env(&|k| std::env::var(k).ok(), self.shards).map(Some),
            Some(spec) => Shard::parse(spec).map(Some),
        }
    }
}

/// The life of a suite: load → plan → prepare snapshots → run → summarise.
pub async fn run(args: RunArgs) -> Result<i32> {
    let (suite, out) = args.suite()?;
    let shard = args.shard()?;
    if let Some(addr) = args.metrics_listen {
        tracing::info!("metrics on http://{}/metrics", crate::metrics_http::serve(addr).await?);
    }
    let tasks = suite.tasks(args.limit)?;
    let policy = Arc::new(Policy::build(&suite, &suite.config.policy, PolicyOrigin::Suite)?);
    let counts = sizing::resolve(
        suite.config.rollouts.concurrency,
        suite.config.rollouts.warm_pool,
        policy.live_requests(),
        suite.config.template.memory_mib,
        &sizing::Host::probe(),
    );
    // The recorder first: a run that cannot record must not start.
    let identity = RunIdentity {
        run_id: new_run_id(),
        suite_name: suite.config.suite.name.clone(),
        suite_digest: suite.digest.clone(),
        shard,
    };
    let options = RecorderOptions {
        rows_per_part: suite.config.output.rows_per_part,
        resume: args.resume,
        requests: None,
    };
    let (recorder, opened) = Recorder::open(&out, identity, options).await?;
    refuse_changed_tasks(&suite, &tasks, &opened)?;
    let mut signals = Signals::new()?;
    let prepared = tokio::select! {
        prepared = prepare(&suite, &args, shard, recorder.run_id(), &tasks, &policy, &opened, &counts) => prepared?,
        code = signals.recv() => {
            tracing::info!("interrupted while preparing snapshots; nothing ran");
            return Ok(code);
        }
    };
    let (engine, todo, plan) = prepared;
    let planned = plan.rollouts();
    // What the run plans, for `farm merge` to count its rows against.
    recorder.record_plan(plan).await?;
    let started = Instant::now();
    let interrupted = run_rollouts(
        engine.clone(),
        counts.concurrency,
        todo,
        &recorder,
        &mut signals,
        &args.suite,
    )
    .await?;
    let inputs = SummaryInputs {
        samples: suite.config.rollouts.samples,
        planned,
        provenance: Provenance {
            shard,
            ..provenance(&engine)
        },
        concurrency: counts.concurrency,
        wall: started.elapsed(),
        merged: None,
    };
    let summary = recorder.summarise(inputs).await?;
    tracing::info!(
        "{} of {planned} rollouts recorded: {} passed, {} failed, {} timeout, {} env_error; mean reward {}; summary in {}",
        summary.finished,
        summary.count(Status::Passed),
        summary.count(Status::Failed),
        summary.count(Status::Timeout),
        summary.count(Status::EnvError),
        summary.totals.mean_reward.map(|r| format!("{r:.3}")).unwrap_or_else(|| "null".into()),
        out.join("summary.json").display()
    );
    Ok(interrupted.unwrap_or(0))
}

/// A resumed run whose tasks changed since it recorded them would mix two versions.
fn refuse_changed_tasks(suite: &Suite, tasks: &[Arc<Task>], opened: &Opened) -> Result<()> {
    let digests: HashMap<&str, String> = tasks.iter().map(|t| (t.id.as_str(), t.digest())).collect();
    if let Some(changed) = opened
        .outcomes
        .iter()
        .find(|o| digests.get(o.task_id.as_str()).is_some_and(|d| *d != o.task_digest))
    {
        anyhow::bail!(
            "task {:?} in {} changed since the recorded rollouts of this run: resuming would mix two versions of it; start a new run in another folder",
            changed.task_id,
            suite.resolve(&suite.config.dataset.path).display()
        );
    }
    Ok(())
}

/// Plan and prepare: the template snapshot, the rollouts still to run, then a snapshot per
/// task that has files or setup, and the warm pool. Returns the engine, the rollouts to run
/// and what the whole run plans (each task's samples).
#[allow(clippy::too_many_arguments)]
async fn prepare(
    suite: &Suite,
    args: &RunArgs,
    shard: Option<Shard>,
    run_id: &str,
    tasks: &[Arc<Task>],
    policy: &Arc<Policy>,
    opened: &Opened,
    counts: &Counts,
) -> Result<(Arc<Engine>, Vec<Planned>, engine::recorder::Plan)> {
    let progress = |line: &str| tracing::info!("template: {line}");
    let host = engine::Host::start(args.accel)?;
    let mut engine = Engine::start(
        suite,
        &host,
        run_id,
        Preload::for_tasks(tasks.iter().map(|t| &**t)),
        &progress,
    )
    .await?;
    let mut plan = engine.plan(tasks, policy, suite.config.rollouts.samples);
    if let Some(shard) = shard {
        let mut per_task = BTreeMap::new();
        for p in &plan {
            *per_task.entry(p.task.id.clone()).or_insert(0usize) += 1;
        }
        let mine = shard.tasks(&per_task);
        let all = plan.len();
        plan.retain(|p| mine.contains(&p.task.id));
        if mine.is_empty() {
            tracing::info!(
                "shard {shard} has no task ({} tasks for {} shards): its run is empty",
                per_task.len(),
                shard.count
            );
        } else {
            tracing::info!(
                "shard {shard}: {} of {} tasks, {} of {all} rollouts",
                mine.len(),
                per_task.len(),
                plan.len()
            );
        }
    }
    let planned = plan.len();
    let mut recorded = engine::recorder::Plan { tasks: BTreeMap::new() };
    for p in &plan {
        *recorded.tasks.entry(p.task.id.clone()).or_insert(0) += 1;
    }
    plan.retain(|p| !opened.done.contains(&plan_key(&p.task.id, p.sample)));
    tracing::info!(
        "suite {} ({} tasks, {planned} rollouts planned, {} already done)",
        suite.config.suite.name,
        tasks.len(),
        planned - plan.len()
    );
    let mut needed: Vec<Arc<Task>> = plan.iter().map(|p| p.task.clone()).collect();
    needed.dedup_by(|a, b| a.id == b.id);
    if let Some(note) = engine::sizing::missing_cgroups_note() {
        tracing::info!("{note}");
    }
    if !counts.explanation.is_empty() {
        tracing::info!("{}", counts.explanation);
    }
    let snapshots = engine
        .prepare_and_pool(&needed, counts.concurrency, counts.warm_pool, &|line: &str| {
            tracing::info!("{line}")
        })
        .await?;
    for p in &mut plan {
        p.snapshot = snapshots[&p.task.id].clone();
    }
    debug_assert_eq!(recorded.rollouts(), planned);
    Ok((Arc::new(engine), plan, recorded))
}

/// Runs the rollouts with bounded concurrency and records each as it ends. A signal stops
/// the run: rollouts in flight are killed and not recorded (a resume runs them again);
/// returns the signal's exit code.
async fn run_rollouts(
    engine: Arc<Engine>,
    concurrency: usize,
    planned: Vec<Planned>,
    recorder: &Recorder,
    signals: &mut Signals,
    suite_file: &Path,
) -> Result<Option<i32>> {
    let metrics = engine::metrics::get();
    metrics.queue_depth.set(planned.len() as i64);
    let mut progress = Tally::new(planned.len());
    let mut running = tokio::task::JoinSet::new();
    let mut queue = planned.into_iter();
    loop {
        while running.len() < concurrency {
            let Some(item) = queue.next() else { break };
            metrics.queue_depth.dec();
            let engine = engine.clone();
            running.spawn(async move { engine.run_one(item).await });
        }
        metrics.warm_ready.set(engine.warm() as i64);
        tokio::select! {
            finished = running.join_next() => {
                let Some(finished) = finished else { return Ok(None) };
                let row = finished.context("a rollout task panicked")?;
                progress.record(&row);
                recorder.append(row).await?;
            }
            code = signals.recv() => {
                tracing::info!("interrupted: stopping {} rollouts in flight; `farm run {} --resume` finishes the run", running.len(), suite_file.display());
                // In-flight rollouts end now (their VMs are killed); they are not recorded and
                // will run again on resume. Rollouts that finished meanwhile are recorded.
                running.abort_all();
                while let Some(finished) = running.join_next().await {
                    if let Ok(row) = finished {
                        progress.record(&row);
                        recorder.append(row).await?;
                    }
                }
                return Ok(Some(code));
            }
        }
    }
}

/// Where and with what the run was made (for reports that must be told apart).
fn provenance(engine: &Engine) -> Provenance {
    Provenance {
        host: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default(),
        farm_version: env!("CARGO_PKG_VERSION").to_string(),
        accel: format!("{:?}", engine.forker.vm.accel).to_lowercase(),
        cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        template_snapshot: engine.template.id().to_string(),
        image_pulled: engine.image_pulled.clone(),
        shard: None,
        environments: engine.environments.lock().unwrap_or_else(|e| e.into_inner()).clone(),
    }
}

pub use engine::recorder::new_run_id;

/// The run's progress: a bar on a terminal, a line per finished rollout elsewhere.
struct Tally {
    bar: Progress,
    total: usize,
    done: usize,
    counts: BTreeMap<Status, usize>,
    started: Instant,
}

impl Tally {
    fn new(total: usize) -> Tally {
        Tally {
            bar: Progress::new(total),
            total,
            done: 0,
            counts: BTreeMap::new(),
            started: Instant::now(),
        }
    }

    fn record(&mut self, row: &Row) {
        self.done += 1;
        *self.counts.entry(row.status).or_default() += 1;
        let counts: Vec<String> = self.counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
        self.bar.step(counts.join(", "));
        if !self.bar.tty {
            let rate = self.done as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
            let eta = (self.total - self.done) as f64 / rate.max(1e-9);
            let error = row
                .error
                .as_deref()
                .map(|e| format!(" ({})", e.chars().take(200).collect::<String>()))
                .unwrap_or_default();
            tracing::info!(
                "{}/{} {} sample {}: {}{error} ({rate:.1}/s, ETA {eta:.0}s)",
                self.done,
                self.total,
                row.task_id,
                row.sample_index,
                row.status
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn suite_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("tasks.jsonl"),
            "{\"id\": \"t\", \"expected_answer\": \"1\"}\n",
        )
        .unwrap();
        let suite = "[suite]\nname = \"s\"\n[template]\nimage = \"minimal\"\n[dataset]\npath = \"tasks.jsonl\"\nformat = \"jsonl\"\n\
                     [policy]\nkind = \"replay\"\n[rollouts]\nconcurrency = 2\n[output]\ndir = \"results\"\n";
        std::fs::write(dir.path().join("suite.toml"), suite).unwrap();
        dir
    }

    #[test]
    fn flags_override_the_suite_and_the_rest_comes_from_it() {
        let dir = suite_dir();
        let file = dir.path().join("suite.toml");
        let cli = Cli::try_parse_from([
            "farm",
            file.to_str().unwrap(),
            "--concurrency",
            "3",
            "--out",
            "elsewhere",
            "--limit",
            "1",
            "--resume",
            "--accel",
            "tcg",
        ])
        .unwrap();
        let (suite, out) = cli.run.suite().unwrap();
        assert_eq!(
            (suite.config.rollouts.concurrency, out),
            (Count::Fixed(3), PathBuf::from("elsewhere"))
        );
        assert!(cli.run.resume && cli.run.limit == Some(1) && cli.run.accel == engine::sizing::AccelSetting::Tcg);
        // Without flags: the suite's own settings; output.dir relative to the suite file.
        let cli = Cli::try_parse_from(["farm", file.to_str().unwrap()]).unwrap();
        let (suite, out) = cli.run.suite().unwrap();
        assert_eq!(
            (suite.config.rollouts.concurrency, out),
            (Count::Fixed(2), dir.path().join("results"))
        );
        assert_eq!(
            (cli.run.accel, cli.run.resume),
            (engine::sizing::AccelSetting::Auto, false)
        );
        // --concurrency 0 means one at a time, never none.
        let cli = Cli::try_parse_from(["farm", file.to_str().unwrap(), "--concurrency", "0"]).unwrap();
        assert_eq!(cli.run.suite().unwrap().0.config.rollouts.concurrency, Count::Fixed(1));
        assert!(Cli::try_parse_from(["farm", file.to_str().unwrap(), "--accel", "fast"]).is_err());
        assert!(Cli::try_parse_from(["farm", file.to_str().unwrap(), "--metrics-listen", "nowhere"]).is_err());
    }

    #[test]
    fn a_resumed_run_refuses_tasks_that_changed() {
        let dir = suite_dir();
        let suite = Suite::load(&dir.path().join("suite.toml")).unwrap();
        let tasks = suite.tasks(None).unwrap();
        let outcome = |digest: &str| engine::row::Outcome {
            key: plan_key("t", 0),
            task_id: "t".into(),
            task_digest: digest.into(),
            sample_index: 0,
            status: Status::Passed,
            reward: Some(1.0),
            trust: None,
            timings: Default::default(),
        };
        let opened = |digest: &str| Opened {
            run_id: "r".into(),
            done: Default::default(),
            outcomes: vec![outcome(digest)],
        };
        assert!(refuse_changed_tasks(&suite, &tasks, &opened(&tasks[0].digest())).is_ok());
        let err = refuse_changed_tasks(&suite, &tasks, &opened("old"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("changed since the recorded rollouts"), "{err}");
    }
}
