//! `farm bench boot|fork`: latency and memory numbers, each against a baseline measured in
//! the same run. Benchmarks report; they never fail on a time.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use serde_json::json;

use super::measure::{bench_template, check_host_limits, percentiles, print_report, round};
use snapshotter::{ForkIdentity, Forker, PoolMode, WarmPool};
use vmm::{AccelSetting, ExecOptions, GuestArtifacts, Machine, VmSettings};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Cold boot to agent-ready, and exec round trips in a booted VM.
    Boot(BootArgs),
    /// Cold boot vs fork-to-first-exec (with and without the warm pool), private dirty memory
    /// per idle fork, and forks alive at once within a memory budget.
    Fork(ForkArgs),
    /// Idle but live forks held at once (default 1,000): exec latency against a few alive,
    /// memory per fork (PSS, USS, where it goes), idle CPU, host memory, OOM kills.
    Density(super::density::DensityArgs),
    /// Write a synthetic run of N rows (for timing `farm report` on large runs; no VM runs).
    SyntheticRun(SyntheticArgs),
}

#[derive(Args)]
pub struct SyntheticArgs {
    /// Output folder (must not hold a run).
    #[arg(long)]
    out: std::path::PathBuf,
    #[arg(long, default_value_t = 100_000)]
    rows: usize,
    /// Rows are spread over this many tasks.
    #[arg(long, default_value_t = 1_000)]
    tasks: usize,
    /// Write only shard I of N of the run (the tasks `farm run --shard I/N` would take), with
    /// its summary: input for `farm merge`.
    #[arg(long, value_name = "I/N")]
    shard: Option<String>,
}

#[derive(Args)]
pub struct BootArgs {
    #[arg(long, default_value = "minimal")]
    image: String,
    /// Boots to measure.
    #[arg(short, default_value_t = 5)]
    n: usize,
    /// Exec round trips to measure in one booted VM.
    #[arg(long, default_value_t = 50)]
    execs: usize,
    /// Accelerator: auto (KVM where it runs stock guests, else TCG), kvm or tcg.
    #[arg(long, default_value = "auto")]
    accel: AccelSetting,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ForkArgs {
    #[arg(long, default_value = "minimal")]
    image: String,
    /// Forks to measure per mode.
    #[arg(short, default_value_t = 30)]
    n: usize,
    /// Forks started at once.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Cold boots for the baseline.
    #[arg(long, default_value_t = 5)]
    cold: usize,
    /// QEMU processes kept waiting in the warm pool.
    #[arg(long, default_value_t = 4)]
    pool: usize,
    /// Forks to hold alive at once for the memory measurement.
    #[arg(long, default_value_t = 50)]
    alive: usize,
    /// Resets in place of one fork (0: skip).
    #[arg(long, default_value_t = 30)]
    resets: usize,
    /// Memory budget for the forks-alive figure, in MiB (default: 90% of MemTotal).
    #[arg(long)]
    memory_budget_mib: Option<u64>,
    /// TCG translation buffer per VM in MiB (0: QEMU's default).
    #[arg(long, default_value_t = 64)]
    tb_size_mib: u32,
    /// Accelerator: auto (KVM where it runs stock guests, else TCG), kvm or tcg.
    #[arg(long, default_value = "auto")]
    accel: AccelSetting,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

pub async fn run(command: BenchCommand) -> Result<i32> {
    match command {
        BenchCommand::Boot(args) => boot(args).await,
        BenchCommand::Fork(args) => fork(args).await,
        BenchCommand::Density(args) => super::density::density(args).await,
        BenchCommand::SyntheticRun(args) => synthetic_run(args).await,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn p50(v: &serde_json::Value) -> f64 {
    v.get("p50").and_then(|x| x.as_f64()).unwrap_or(f64::NAN)
}

async fn exec_true(agent: &vmm::AgentClient) -> Result<()> {
    let out = agent.exec(ExecOptions::argv(&["true"])).await?;
    if out.result.exit_code != Some(0) {
        bail!("`true` failed in the guest: {:?}", out.result);
    }
    Ok(())
}

/// Cold boots: QEMU start -> agent ready -> first exec answered.
async fn cold_boots(
    settings: &VmSettings,
    artifacts: &GuestArtifacts,
    n: usize,
    progress: bool,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut to_ready = Vec::new();
    let mut to_first_exec = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        let machine = Machine::boot(settings, &artifacts.kernel.path, &artifacts.image.path).await?;
        to_ready.push(ms(t.elapsed()));
        exec_true(machine.agent()).await?;
        to_first_exec.push(ms(t.elapsed()));
        machine.shutdown().await;
        if progress {
            eprint!("\rcold boot {}/{n}", i + 1);
        }
    }
    if progress {
        eprintln!();
    }
    Ok((to_ready, to_first_exec))
}

async fn boot(args: BootArgs) -> Result<i32> {
    let artifacts = GuestArtifacts::locate(&vmm::artifacts::cache_dir(), &args.image)?;
    let settings = VmSettings::detect(args.accel)?;
    let (to_ready, to_first_exec) = cold_boots(&settings, &artifacts, args.n, !args.json).await?;
    let machine = Machine::boot(&settings, &artifacts.kernel.path, &artifacts.image.path).await?;
    let mut round_trips = Vec::new();
    for _ in 0..args.execs {
        let t = Instant::now();
        exec_true(machine.agent()).await?;
        round_trips.push(ms(t.elapsed()));
    }
    let mut pings = Vec::new();
    for _ in 0..args.execs {
        let t = Instant::now();
        machine.agent().ping().await?;
        pings.push(ms(t.elapsed()));
    }
    machine.shutdown().await;
    let report = json!({
        "benchmark": "boot",
        "image": args.image,
        "accel": settings.accel.to_string(),
        "memory_mib": settings.memory_mib,
        "cold_boot_to_agent_ready_ms": percentiles(&to_ready),
        "cold_boot_to_first_exec_ms": percentiles(&to_first_exec),
        "exec_round_trip_ms": percentiles(&round_trips),
        "ping_round_trip_ms": percentiles(&pings),
    });
    print_report(&report, args.json);
    Ok(0)
}

/// Private dirty bytes of a process (from /proc/PID/smaps_rollup).
fn private_dirty_bytes(pid: u32) -> Option<u64> {
    vmm::memory::ProcessMemory::of(pid).map(|m| m.private_dirty)
}

async fn fork(args: ForkArgs) -> Result<i32> {
    // A host limit that would stop the forks held alive is named before anything starts,
    // with the setting that lifts it.
    check_host_limits(args.alive, "--alive")?;
    let progress = !args.json;
    let say = |s: &str| {
        if progress {
            eprintln!("bench: {s}");
        }
    };
    let artifacts = GuestArtifacts::locate(&vmm::artifacts::cache_dir(), &args.image)?;
    let mut settings = VmSettings::detect(args.accel)?;
    settings.tcg_tb_size_mib = (args.tb_size_mib > 0).then_some(args.tb_size_mib);
    let forker = Forker::new(settings.clone())?;
    let snapshot = bench_template(&forker, &args.image).await?;
    say(&format!("template snapshot {}", snapshot.id()));

    say("cold boots (baseline)");
    let (cold_ready, cold_first_exec) = cold_boots(&settings, &artifacts, args.cold, progress).await?;

    say("forks without the warm pool");
    let concurrency = args.concurrency.max(1);
    let no_pool = forks_without_pool(&forker, &snapshot, args.n, concurrency).await?;

    let pool_size = args.pool.max(concurrency);
    say(&format!(
        "forks from a warm pool of {pool_size} (QEMU waiting for incoming state)"
    ));
    let incoming = measure_pool(&forker, &snapshot, PoolMode::Incoming, pool_size, args.n, concurrency).await?;
    say(&format!(
        "forks from a warm pool of {pool_size} (pre-resumed, identity on take)"
    ));
    let resumed = measure_pool(&forker, &snapshot, PoolMode::Resumed, pool_size, args.n, concurrency).await?;
    let (warm, second_exec, dirty) = (incoming.first_exec, incoming.second_exec, incoming.private_dirty_mib);

    say(&format!("{} resets in place of one fork", args.resets));
    let resets = measure_resets(&forker, &snapshot, args.resets).await?;

    say(&format!("holding {} forks alive", args.alive));
    let alive = hold_forks_alive(&forker, &snapshot, args.alive, progress).await?;

    let warm_p = percentiles(&warm);
    let cold_p = percentiles(&cold_first_exec);
    let report = json!({
        "benchmark": "fork",
        "image": args.image,
        "accel": settings.accel.to_string(),
        "memory_mib": snapshot.manifest.memory_mib,
        "tb_size_mib": settings.tcg_tb_size_mib,
        "n": args.n,
        "concurrency": concurrency,
        "cold_boot_to_agent_ready_ms": percentiles(&cold_ready),
        "cold_boot_to_first_exec_ms": cold_p,
        "fork_to_first_exec_no_pool_ms": percentiles(&no_pool),
        "fork_to_first_exec_warm_pool_ms": warm_p,
        "fork_to_first_exec_resumed_pool_ms": percentiles(&resumed.first_exec),
        "fork_taken_resumed_pool_ms": percentiles(&resumed.taken),
        "resumed_pool_second_exec_ms": percentiles(&resumed.second_exec),
        "ratio_cold_boot_over_resumed_pool_fork_p50": round(p50(&cold_p) / p50(&percentiles(&resumed.first_exec))),
        "second_exec_same_fork_ms": percentiles(&second_exec),
        "ratio_cold_boot_over_warm_fork_p50": round(p50(&cold_p) / p50(&warm_p)),
        "ratio_cold_boot_over_no_pool_fork_p50": round(p50(&cold_p) / p50(&percentiles(&no_pool))),
        "private_dirty_per_idle_fork_mib": percentiles(&dirty),
        "reset_ms": percentiles(&resets.reset),
        "reset_parts_ms": {
            "stop_and_channels": percentiles(&resets.stop_and_channels),
            "ram": percentiles(&resets.ram),
            "devices": percentiles(&resets.devices),
        },
        "reset_to_first_exec_ms": percentiles(&resets.to_first_exec),
        "ratio_resumed_pool_fork_over_reset_to_first_exec_p50":
            round(p50(&percentiles(&resumed.first_exec)) / p50(&percentiles(&resets.to_first_exec))),
        "forks_alive": alive.summary(args.memory_budget_mib, &dirty),
    });
    print_report(&report, args.json);
    Ok(0)
}

/// Fork without the pool: spawn QEMU, load state, identity, first exec; `n` forks,
/// `concurrency` at once.
async fn forks_without_pool(
    forker: &Forker,
    snapshot: &snapshotter::Snapshot,
    n: usize,
    concurrency: usize,
) -> Result<Vec<f64>> {
    let mut no_pool = Vec::new();
    for batch in (0..n).collect::<Vec<_>>().chunks(concurrency) {
        let tasks: Vec<_> = batch
            .iter()
            .map(|&i| {
                let forker = forker.clone();
                let snapshot = snapshot.clone();
                tokio::spawn(async move {
                    let t = Instant::now();
                    let fork = forker.fork(&snapshot, ForkIdentity::new(i as u64)).await?;
                    exec_true(fork.agent()).await?;
                    anyhow::Ok(ms(t.elapsed()))
                })
            })
            .collect();
        for t in tasks {
            no_pool.push(t.await??);
        }
    }
    Ok(no_pool)
}

#[derive(Default)]
struct ResetSamples {
    /// The reset itself: stop, new channels, RAM, device state (the guest left paused).
    reset: Vec<f64>,
    stop_and_channels: Vec<f64>,
    ram: Vec<f64>,
    devices: Vec<f64>,
    /// Reset, resume, identity and the first exec answered: what a fork is compared with.
    to_first_exec: Vec<f64>,
}

/// Resets one fork `n` times; before each, the fork runs a command that writes a little
/// (a rollout's trace), so every reset has pages to drop and a disk to revert.
async fn measure_resets(forker: &Forker, snapshot: &snapshotter::Snapshot, n: usize) -> Result<ResetSamples> {
    let mut samples = ResetSamples::default();
    if n == 0 {
        return Ok(samples);
    }
    let mut fork = forker.fork_resettable(snapshot, ForkIdentity::new(0)).await?;
    for i in 0..n {
        let out = fork
            .agent()
            .exec(ExecOptions::shell(
                "echo rollout > /dev/shm/trace; echo rollout > /tmp/trace; sync",
            ))
            .await?;
        if out.result.exit_code != Some(0) {
            bail!("the rollout's command failed in the guest: {:?}", out.result);
        }
        let t = Instant::now();
        let parts = fork.reset(ForkIdentity::new(i as u64 + 1)).await?;
        exec_true(fork.agent()).await?;
        samples.to_first_exec.push(ms(t.elapsed()));
        samples
            .reset
            .push(ms(parts.stop_and_channels + parts.ram + parts.devices));
        samples.stop_and_channels.push(ms(parts.stop_and_channels));
        samples.ram.push(ms(parts.ram));
        samples.devices.push(ms(parts.devices));
    }
    Ok(samples)
}

/// What forks held alive at once showed after a short idle.
struct AliveForks {
    /// Forks that answered a ping.
    responsive: usize,
    /// Each started fork's private dirty memory.
    private_dirty_mib: Vec<f64>,
}

impl AliveForks {
    /// The report's `forks_alive`: their memory, and how many would fit in the budget (90% of
    /// the host's memory unless given), at their mean (or, when none was measured, at the
    /// pool forks' mean, `idle_fork_dirty_mib`).
    fn summary(&self, memory_budget_mib: Option<u64>, idle_fork_dirty_mib: &[f64]) -> serde_json::Value {
        let alive_total: f64 = self.private_dirty_mib.iter().sum();
        let budget =
            memory_budget_mib.unwrap_or(vmm::memory::HostMemory::probe().map_or(0, |m| m.total >> 20) * 9 / 10);
        let per_fork = if self.private_dirty_mib.is_empty() {
            mean(idle_fork_dirty_mib)
        } else {
            alive_total / self.private_dirty_mib.len() as f64
        };
        json!({
            "started": self.private_dirty_mib.len(),
            "responsive": self.responsive,
            "total_private_dirty_mib": round(alive_total),
            "mean_private_dirty_mib": round(per_fork),
            "memory_budget_mib": budget,
            "max_forks_in_budget": if per_fork > 0.0 { (budget as f64 / per_fork).floor() } else { 0.0 },
        })
    }
}

/// Forks alive at once: start them, let them idle, sum their private dirty memory.
async fn hold_forks_alive(
    forker: &Forker,
    snapshot: &snapshotter::Snapshot,
    count: usize,
    progress: bool,
) -> Result<AliveForks> {
    let mut alive = Vec::new();
    for i in 0..count {
        let fork = forker.fork(snapshot, ForkIdentity::new(i as u64)).await?;
        exec_true(fork.agent()).await?;
        alive.push(fork);
        if progress && (i + 1) % 10 == 0 {
            eprint!("\ralive {}/{}", i + 1, count);
        }
    }
    if progress && count > 0 {
        eprintln!();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut responsive = 0;
    for fork in &alive {
        if fork.agent().ping().await.is_ok() {
            responsive += 1;
        }
    }
    let private_dirty_mib: Vec<f64> = alive
        .iter()
        .filter_map(|f| private_dirty_bytes(f.machine.pid()))
        .map(|b| b as f64 / (1 << 20) as f64)
        .collect();
    Ok(AliveForks {
        responsive,
        private_dirty_mib,
    })
}

struct PoolSamples {
    first_exec: Vec<f64>,
    /// Of `first_exec`: until the fork was taken (with its identity applied).
    taken: Vec<f64>,
    second_exec: Vec<f64>,
    private_dirty_mib: Vec<f64>,
}

/// Forks `n` times from a full pool, `concurrency` at once; records fork-to-first-exec,
/// a second exec, and the fork's private dirty memory after a short idle.
async fn measure_pool(
    forker: &Forker,
    snapshot: &snapshotter::Snapshot,
    mode: PoolMode,
    size: usize,
    n: usize,
    concurrency: usize,
) -> Result<PoolSamples> {
    let pool = WarmPool::start_with_mode(forker.clone(), snapshot.clone(), size, mode)?;
    let mut samples = PoolSamples {
        first_exec: Vec::new(),
        taken: Vec::new(),
        second_exec: Vec::new(),
        private_dirty_mib: Vec::new(),
    };
    for batch in (0..n).collect::<Vec<_>>().chunks(concurrency) {
        if !pool.wait_full(Duration::from_secs(120)).await {
            bail!("the warm pool did not fill: {:?}", pool.last_error());
        }
        let forks = futures_collect(batch.iter().map(|&i| {
            let pool = &pool;
            async move {
                let t = Instant::now();
                let fork = pool.fork(ForkIdentity::new(i as u64)).await?;
                let taken = ms(t.elapsed());
                exec_true(fork.agent()).await?;
                anyhow::Ok((ms(t.elapsed()), taken, fork))
            }
        }))
        .await?;
        for (latency, taken, fork) in forks {
            samples.first_exec.push(latency);
            samples.taken.push(taken);
            let t = Instant::now();
            exec_true(fork.agent()).await?;
            samples.second_exec.push(ms(t.elapsed()));
            tokio::time::sleep(Duration::from_millis(100)).await;
            if let Some(bytes) = private_dirty_bytes(fork.machine.pid()) {
                samples.private_dirty_mib.push(bytes as f64 / (1 << 20) as f64);
            }
        }
    }
    Ok(samples)
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Runs futures concurrently and collects their results in order.
async fn futures_collect<T, F>(futures: impl Iterator<Item = F>) -> Result<Vec<T>>
where
    F: std::future::Future<Output = Result<T>>,
{
    futures::future::join_all(futures).await.into_iter().collect()
}

/// Rows shaped like a real run's (three steps with some output, score details), with
/// deterministic statuses and rewards, written through the run's recorder.
async fn synthetic_run(args: SyntheticArgs) -> Result<i32> {
    use engine::recorder::{Recorder, RecorderOptions, RunIdentity};
    let shard = args.shard.as_deref().map(engine::shard::Shard::parse).transpose()?;
    let identity = RunIdentity {
        run_id: "run-synthetic".into(),
        suite_name: "synthetic".into(),
        suite_digest: "synthetic".into(),
        shard,
    };
    let (recorder, _) = Recorder::open(
        &args.out,
        identity,
        RecorderOptions {
            rows_per_part: 10_000,
            resume: false,
            requests: None,
        },
    )
    .await?;
    let tasks = args.tasks.max(1);
    let mine = shard.map(|s| shard_tasks(s, args.rows, tasks));
    let started = Instant::now();
    let mut written = 0usize;
    let mut batch = Vec::new();
    let samples = (args.rows / args.tasks.max(1)).max(1) as u32;
    for i in 0..args.rows {
        let task = i % tasks;
        if mine.as_ref().is_some_and(|m| !m.contains(&format!("task-{task:05}"))) {
            continue;
        }
        written += 1;
        batch.push(synthetic_row(i, tasks));
        if batch.len() == 1000 {
            recorder.append_batch(std::mem::take(&mut batch)).await?;
        }
    }
    if !batch.is_empty() {
        recorder.append_batch(batch).await?;
    }
    recorder.flush().await?;
    if shard.is_some() {
        let provenance = engine::recorder::summary::Provenance {
            host: "synthetic".into(),
            shard,
            ..Default::default()
        };
        let inputs = engine::recorder::SummaryInputs {
            samples,
            planned: written,
            provenance,
            concurrency: 1,
            wall: started.elapsed(),
            merged: None,
        };
        recorder.summarise(inputs).await?;
    }
    eprintln!(
        "farm: wrote {written} rows ({} tasks, {samples} samples each) to {}",
        args.tasks,
        args.out.display()
    );
    Ok(0)
}

/// The tasks of `shard` when `rows` rows are spread over `tasks` tasks.
fn shard_tasks(shard: engine::shard::Shard, rows: usize, tasks: usize) -> std::collections::BTreeSet<String> {
    let per_task: std::collections::BTreeMap<String, usize> = (0..tasks)
        .map(|t| (format!("task-{t:05}"), rows / tasks + usize::from(t < rows % tasks)))
        .collect();
    shard.tasks(&per_task)
}

/// Row `i` of a synthetic run over `tasks` tasks; its status, reward and timings follow `i`.
fn synthetic_row(i: usize, tasks: usize) -> engine::row::Row {
    use engine::row::{Row, Status, Step, StepKind, Timings};
    let (task, sample) = (i % tasks, (i / tasks) as u32);
    let status = match i % 10 {
        0..=5 => Status::Passed,
        6..=8 => Status::Failed,
        _ => Status::EnvError,
    };
    let step = |k: u32| Step {
        stdout: format!("{}\n{} passed in 0.{k}s\n", "line of test output ".repeat(20), k + 1),
        exit_code: Some(0),
        started_at_ms: 1_700_000_000_000 + i as i64 * 50,
        duration_ms: 40.0 + k as f64,
        ..Step::new(
            k,
            StepKind::Exec,
            format!("python3 -m pytest -q tests/test_{task}.py -k case_{k}"),
        )
    };
    Row {
        run_id: "run-synthetic".into(),
        suite_name: "synthetic".into(),
        suite_digest: "synthetic".into(),
        task_digest: format!("{task:064x}"),
        snapshot_id: "t-synthetic".into(),
        policy_name: "replay".into(),
        steps: (0..3).map(step).collect(),
        reward: (status != Status::EnvError).then_some(if status == Status::Passed { 1.0 } else { 0.0 }),
        status,
        trust: (status != Status::EnvError).then_some(scorers::Trust::Sound),
        score_details: r#"{"basis":"exit code","tests":{"exit_code":0}}"#.into(),
        timings: Timings {
            fork_ms: 80.0 + (i % 50) as f64,
            rollout_ms: 150.0 + (i % 300) as f64,
            score_ms: 700.0 + (i % 900) as f64,
            total_ms: 1000.0,
        },
        started_at_ms: 1_700_000_000_000 + i as i64 * 50,
        ..Row::blank(&format!("task-{task:05}"), sample, i as u64)
    }
}
