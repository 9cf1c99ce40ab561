//! `farm bench density`: how many idle but live forks one host holds, and what each costs.
//!
//! One run measures, in order:
//! 1. exec latency with a few forks alive (the baseline);
//! 2. the fill: forks started until `--forks` are alive or the host's free memory falls to
//!    the headroom (nothing is left to the OOM killer), each answering its first exec;
//! 3. exec latency with every fork alive (one exec in each), as a ratio to the baseline;
//! 4. the idle cost: host and QEMU CPU over `--idle-secs`, and every fork's memory (PSS,
//!    USS, private dirty) with a breakdown of where it goes.
//!
//! It prints one JSON object with `--json`. It reports; it never fails on a figure.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use snapshotter::{Fork, ForkIdentity, Forker};
use vmm::memory::{self, Breakdown, HostMemory, ProcessMemory};
use vmm::{AccelSetting, ExecOptions, VmSettings};

use super::measure::{check_host_limits, percentiles, print_report, round};

mod idle;

use idle::{ksmd_pid, IdleCpu};

#[derive(Args)]
pub struct DensityArgs {
    #[arg(long, default_value = "minimal")]
    image: String,
    /// Forks to hold alive at once.
    #[arg(long, default_value_t = 1000)]
    forks: usize,
    /// Forks alive for the baseline exec latency.
    #[arg(long, default_value_t = 10)]
    baseline: usize,
    /// Execs timed with the baseline forks (spread over them). With every fork up, each fork
    /// runs one.
    #[arg(long, default_value_t = 200)]
    execs: usize,
    /// Seconds over which the idle forks' CPU use is measured.
    #[arg(long, default_value_t = 60)]
    idle_secs: u64,
    /// Stop starting forks when the host's available memory falls below this share of
    /// MemTotal, in percent (the OOM killer is never reached).
    #[arg(long, default_value_t = 10)]
    headroom_percent: u64,
    /// Forks started at once while filling.
    #[arg(long, default_value_t = 2)]
    concurrency: usize,
    /// TCG translation buffer per VM in MiB (default: farm's setting for this host).
    #[arg(long)]
    tb_size_mib: Option<u32>,
    /// Accelerator: auto (KVM where it runs stock guests, else TCG), kvm or tcg.
    #[arg(long, default_value = "auto")]
    accel: AccelSetting,
    /// Same-page merging of QEMU's memory: off, on, or on-no-aslr (see docs/commands.md, "Density").
    /// ksmd must be running.
    #[arg(long, default_value = "off")]
    ksm: vmm::Ksm,
    /// With KSM: ksmd's pages_to_scan during the idle minute (ksmd scans fast while forks
    /// start and slowly once they idle); the host's setting is restored afterwards.
    #[arg(long)]
    ksmd_idle_pages_to_scan: Option<u64>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mib(bytes: u64) -> f64 {
    round(bytes as f64 / (1u64 << 20) as f64)
}

async fn timed_exec(fork: &Fork) -> Result<f64> {
    let t = Instant::now();
    let out = fork
        .agent()
        .exec(ExecOptions::argv(&["true"]))
        .await
        .map_err(|e| anyhow::anyhow!(fork.explain(&e)))?;
    anyhow::ensure!(
        out.result.exit_code == Some(0),
        "`true` failed in the guest: {:?}",
        out.result
    );
    Ok(ms(t.elapsed()))
}

/// MemTotal and MemAvailable as the guest sees them, in MiB.
async fn guest_memory(fork: &Fork) -> Option<(f64, f64)> {
    let out = fork
        .agent()
        .exec(ExecOptions::argv(&["cat", "/proc/meminfo"]))
        .await
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let m = HostMemory::parse(&text);
    Some((mib(m.total), mib(m.available)))
}

/// Starts forks and keeps them.
struct Filler {
    forker: Forker,
    snapshot: snapshotter::Snapshot,
    /// Available memory below which no fork is started.
    floor: u64,
    headroom_percent: u64,
    concurrency: usize,
    progress: bool,
    forks: Vec<Fork>,
    /// Fork to first exec answered, per fork.
    start_ms: Vec<f64>,
    peak_used: u64,
    /// KSM is on: wait for ksmd at the headroom.
    ksm: bool,
    /// The largest PSS of a fork started so far (bytes).
    largest_fork: u64,
}

impl Filler {
    /// No forks yet; `host` is the host's memory before any.
    fn new(forker: Forker, snapshot: snapshotter::Snapshot, args: &DensityArgs, host: &HostMemory) -> Filler {
        Filler {
            forker,
            snapshot,
            floor: host.total / 100 * args.headroom_percent,
            headroom_percent: args.headroom_percent,
            concurrency: args.concurrency.max(1),
            progress: !args.json,
            forks: Vec::new(),
            start_ms: Vec::new(),
            peak_used: host.used(),
            ksm: args.ksm != vmm::Ksm::Off,
            largest_fork: 64 << 20,
        }
    }

    /// Waits for ksmd to bring available memory back above the floor plus 2 %, as long as
    /// merging still frees memory (at least 16 MiB a minute); true when it got there.
    async fn wait_for_merging(&mut self) -> bool {
        let probe = || HostMemory::probe().unwrap_or_default();
        let total = probe().total;
        let mut last_gain = (Instant::now(), probe().available);
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = probe();
            if now.available >= self.floor + (self.concurrency as u64) * self.largest_fork + total / 50 {
                return true;
            }
            if now.available >= last_gain.1 + (16 << 20) {
                last_gain = (Instant::now(), now.available);
            } else if last_gain.0.elapsed() > Duration::from_secs(60) {
                return false;
            }
        }
    }

    /// Starts forks until `target` are alive. Returns why it stopped short, if it did: the
    /// memory headroom was reached or a fork failed.
    async fn fill(&mut self, target: usize) -> Result<Option<String>> {
        while self.forks.len() < target {
            let host = HostMemory::probe().context("reading /proc/meminfo")?;
            self.peak_used = self.peak_used.max(host.used());
            // The next batch must fit above the floor too (a fork costs up to its unmerged
            // size until ksmd gets to it).
            let next = (self.concurrency as u64) * self.largest_fork;
            if host.available < self.floor + next {
                // With KSM, memory comes back as ksmd merges the newest forks: wait while it
                // does, and stop only when it no longer frees enough.
                if !(self.ksm && self.wait_for_merging().await) {
                    return Ok(Some(format!(
                        "memory headroom: {} MiB available, below {}% of MemTotal",
                        host.available >> 20,
                        self.headroom_percent
                    )));
                }
                continue;
            }
            let batch = (target - self.forks.len()).min(self.concurrency);
            let base = self.forks.len();
            let (forker, snapshot) = (&self.forker, &self.snapshot);
            let started = futures::future::join_all((0..batch).map(|i| async move {
                let t = Instant::now();
                let fork = forker.fork(snapshot, ForkIdentity::new((base + i) as u64)).await?;
                timed_exec(&fork).await?;
                anyhow::Ok((ms(t.elapsed()), fork))
            }))
            .await;
            let mut failure = None;
            for result in started {
                match result {
                    Ok((t, fork)) => {
                        if let Some(m) = ProcessMemory::of(fork.machine.pid()) {
                            self.largest_fork = if self.forks.is_empty() {
                                m.pss
                            } else {
                                self.largest_fork.max(m.pss)
                            };
                        }
                        self.start_ms.push(t);
                        self.forks.push(fork);
                    }
                    Err(e) => failure = Some(format!("a fork failed after {base} were alive: {e:#}")),
                }
            }
            if failure.is_some() {
                return Ok(failure);
            }
            if self.progress && (self.forks.len().is_multiple_of(10) || self.forks.len() == target) {
                eprint!(
                    "\ralive {}/{target}  (host memory used {} MiB)",
                    self.forks.len(),
                    host.used() >> 20
                );
            }
        }
        if self.progress {
            eprintln!();
        }
        Ok(None)
    }
}

pub async fn density(args: DensityArgs) -> Result<i32> {
    check_host_limits(args.forks, "--forks")?;
    let progress = !args.json;
    let say = |s: &str| {
        if progress {
            eprintln!("bench: {s}");
        }
    };
    if args.ksm != vmm::Ksm::Off {
        let host = vmm::ksm::KsmHost::probe();
        if let Some(note) = host.check(args.ksm)? {
            anyhow::bail!("{note}");
        }
    }
    let mut settings = VmSettings::detect(args.accel)?;
    settings.ksm = args.ksm;
    if let Some(mib) = args.tb_size_mib {
        settings.tcg_tb_size_mib = (mib > 0).then_some(mib);
    }
    let forker = Forker::new(settings.clone())?;
    let snapshot = super::measure::bench_template(&forker, &args.image).await?;
    say(&format!("template snapshot {}", snapshot.id()));
    let (run, forks) = measure(&args, &forker, &snapshot, &say).await?;
    let report = run.report(&args, &settings, &snapshot);
    say("stopping the forks");
    futures::future::join_all(forks.into_iter().map(|f| f.machine.shutdown())).await;
    print_report(&report, args.json);
    Ok(0)
}

/// What one density run measured (the forks themselves are returned beside it).
struct Density {
    host_before: HostMemory,
    ksm_before: Option<vmm::ksm::KsmStats>,
    ksmd_ticks_before: Option<u64>,
    oom_before: Option<u64>,
    baseline: Baseline,
    /// Why the fill stopped short of `--forks`, if it did.
    stopped_by: Option<String>,
    forks_alive: usize,
    /// Fork to first exec answered, per fork.
    start_ms: Vec<f64>,
    /// The exec in each fork with every fork alive: the latencies, and the failures.
    all_ms: Vec<f64>,
    failed_execs: Vec<String>,
    idle: IdleCpu,
    memory: ForkMemory,
    peak_used: u64,
    host_end: HostMemory,
    responsive: usize,
    oom_after: Option<u64>,
}

/// The measurements in order (the baseline, the fill, an exec in each fork, the idle period,
/// every fork's memory); the forks are returned alive.
async fn measure(
    args: &DensityArgs,
    forker: &Forker,
    snapshot: &snapshotter::Snapshot,
    say: &dyn Fn(&str),
) -> Result<(Density, Vec<Fork>)> {
    let ram_file = snapshot.memory_path();
    let host_before = HostMemory::probe().context("reading /proc/meminfo")?;
    let ksm_before = vmm::ksm::KsmStats::read();
    let ksmd = ksmd_pid();
    let ksmd_ticks_before = ksmd.and_then(memory::cpu_ticks);
    let oom_before = memory::oom_kills();

    let mut fill = Filler::new(forker.clone(), snapshot.clone(), args, &host_before);
    say(&format!(
        "baseline: {} forks alive, {} execs",
        args.baseline, args.execs
    ));
    let mut stopped_by = fill.fill(args.baseline.max(1)).await?;
    let baseline = Baseline::measure(&fill.forks, args.execs, &ram_file).await?;

    if stopped_by.is_none() {
        say(&format!("filling to {} forks", args.forks));
        stopped_by = fill.fill(args.forks).await?;
    }
    let Filler {
        forks,
        start_ms,
        mut peak_used,
        ..
    } = fill;
    if let Some(why) = &stopped_by {
        say(&format!("stopped at {} forks: {why}", forks.len()));
    }
    tokio::time::sleep(Duration::from_secs(5)).await;

    say(&format!("one exec in each of the {} forks", forks.len()));
    let (all_ms, failed_execs) = exec_in_each(&forks).await;

    say(&format!("idle for {} s", args.idle_secs));
    let pids: Vec<u32> = forks.iter().map(|f| f.machine.pid()).collect();
    let idle = IdleCpu::measure(&pids, ksmd, args.ksmd_idle_pages_to_scan, args.idle_secs).await?;
    let memory = ForkMemory::measure(&pids, &ram_file);
    let host_end = HostMemory::probe().unwrap_or_default();
    peak_used = peak_used.max(host_end.used());
    let responsive = futures::future::join_all(forks.iter().map(|f| f.agent().ping()))
        .await
        .iter()
        .filter(|r| r.is_ok())
        .count();
    let oom_after = memory::oom_kills();
    let run = Density {
        host_before,
        ksm_before,
        ksmd_ticks_before,
        oom_before,
        baseline,
        stopped_by,
        forks_alive: forks.len(),
        start_ms,
        all_ms,
        failed_execs,
        idle,
        memory,
        peak_used,
        host_end,
        responsive,
        oom_after,
    };
    Ok((run, forks))
}

/// With the baseline's few forks alive: exec latency, and the first fork's memory as the
/// host and the guest see it.
struct Baseline {
    forks_alive: usize,
    exec_ms: Vec<f64>,
    one_fork: Option<ProcessMemory>,
    one_fork_breakdown: Option<Breakdown>,
    /// The guest's MemTotal and MemAvailable, in MiB.
    guest: Option<(f64, f64)>,
}

impl Baseline {
    /// `execs` execs spread over `forks`, after a short idle.
    async fn measure(forks: &[Fork], execs: usize, ram_file: &std::path::Path) -> Result<Baseline> {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut baseline_ms = Vec::new();
        for i in 0..execs {
            baseline_ms.push(timed_exec(&forks[i % forks.len()]).await?);
        }
        let baseline_alive = forks.len();
        let one_idle = forks.first().map(|f| f.machine.pid());
        let single = one_idle.and_then(ProcessMemory::of);
        let single_breakdown = one_idle.and_then(|pid| Breakdown::of(pid, ram_file));
        let guest = match forks.first() {
            Some(f) => guest_memory(f).await,
            None => None,
        };
        Ok(Baseline {
            forks_alive: baseline_alive,
            exec_ms: baseline_ms,
            one_fork: single,
            one_fork_breakdown: single_breakdown,
            guest,
        })
    }
}

/// One exec in each fork: the latencies of those answered, and the failures.
async fn exec_in_each(forks: &[Fork]) -> (Vec<f64>, Vec<String>) {
    let mut all_ms = Vec::new();
    let mut failed_execs = Vec::new();
    for (i, fork) in forks.iter().enumerate() {
        match timed_exec(fork).await {
            Ok(t) => all_ms.push(t),
            Err(e) => failed_execs.push(format!("fork {i}: {e:#}")),
        }
    }
    (all_ms, failed_execs)
}

/// Every fork's memory after the idle period, and where it goes in a sample of them (about 20).
struct ForkMemory {
    per_fork: Vec<ProcessMemory>,
    sample: Vec<Breakdown>,
}

impl ForkMemory {
    fn measure(pids: &[u32], ram_file: &std::path::Path) -> ForkMemory {
        let per_fork: Vec<ProcessMemory> = pids.iter().filter_map(|&p| ProcessMemory::of(p)).collect();
        let sample: Vec<Breakdown> = pids
            .iter()
            .step_by((pids.len() / 20).max(1))
            .filter_map(|&p| Breakdown::of(p, ram_file))
            .collect();
        ForkMemory { per_fork, sample }
    }

    /// One figure of every fork, in MiB.
    fn series(&self, f: fn(&ProcessMemory) -> u64) -> Vec<f64> {
        self.per_fork
            .iter()
            .map(|m| f(m) as f64 / (1u64 << 20) as f64)
            .collect::<Vec<_>>()
    }

    /// The sample's mean of one part of the breakdown, in MiB.
    fn mean_of(&self, f: fn(&Breakdown) -> u64) -> f64 {
        if self.sample.is_empty() {
            0.0
        } else {
            mib(self.sample.iter().map(f).sum::<u64>() / self.sample.len() as u64)
        }
    }
}

impl Density {
    fn report(&self, args: &DensityArgs, settings: &VmSettings, snapshot: &snapshotter::Snapshot) -> serde_json::Value {
        let baseline_p = percentiles(&self.baseline.exec_ms);
        let all_p = percentiles(&self.all_ms);
        let p99 = |v: &serde_json::Value| v.get("p99").and_then(|x| x.as_f64()).unwrap_or(f64::NAN);
        let guest = self.baseline.guest;
        json!({
            "benchmark": "density",
            "image": args.image,
            "accel": settings.accel.to_string(),
            "guest_memory_mib": snapshot.manifest.memory_mib,
            "tb_size_mib": settings.tcg_tb_size_mib,
            "ksm": args.ksm.to_string(),
            "ksmd_pages_to_scan": { "fill": self.idle.fill_pages_to_scan.as_deref().map(str::trim), "idle": args.ksmd_idle_pages_to_scan },
            "ksm_pages_saved_mib": match (self.ksm_before, self.idle.ksm_after) {
                (Some(a), Some(b)) if args.ksm != vmm::Ksm::Off => json!(mib(b.pages_sharing.saturating_sub(a.pages_sharing) * 4096)),
                _ => json!(null),
            },
            "ksmd_cpu_seconds_whole_run": match (self.ksmd_ticks_before, self.idle.ksmd.1) {
                (Some(a), Some(b)) => json!(round((b - a) as f64 / memory::ticks_per_second() as f64)),
                _ => json!(null),
            },
            "forks_wanted": args.forks,
            "forks_alive": self.forks_alive,
            "stopped_by": self.stopped_by,
            "answered_exec": self.all_ms.len(),
            "failed_execs": self.failed_execs.iter().take(10).collect::<Vec<_>>(),
            "responsive_after_idle": self.responsive,
            "fork_to_first_exec_ms": percentiles(&self.start_ms),
            "exec_ms_baseline": { "forks_alive": self.baseline.forks_alive, "latency": baseline_p },
            "exec_ms_all_alive": { "forks_alive": self.forks_alive, "latency": all_p },
            "ratio_exec_p99_all_over_baseline": round(p99(&all_p) / p99(&baseline_p)),
            "memory": self.memory_report(),
            "guest": { "mem_total_mib": guest.map(|g| g.0), "mem_available_mib": guest.map(|g| g.1) },
            "idle_cpu": self.idle.report(self.forks_alive),
        })
    }

    /// The report's `memory`: per fork, where it goes, and the host's.
    fn memory_report(&self) -> serde_json::Value {
        let (memory, host_before) = (&self.memory, &self.host_before);
        let (single, single_breakdown) = (self.baseline.one_fork, &self.baseline.one_fork_breakdown);
        let breakdown = |b: &Breakdown| {
            json!({
                "guest_ram": mib(b.guest_ram), "translation_buffer": mib(b.translation_buffer), "heap": mib(b.heap),
                "anonymous": mib(b.anonymous), "binaries": mib(b.binaries), "other": mib(b.other),
            })
        };
        json!({
            "per_fork_pss_mib": percentiles(&memory.series(|m| m.pss)),
            "per_fork_uss_mib": percentiles(&memory.series(|m| m.uss)),
            "per_fork_private_dirty_mib": percentiles(&memory.series(|m| m.private_dirty)),
            "total_pss_mib": round(memory.series(|m| m.pss).iter().sum::<f64>()),
            "breakdown_mean_uss_mib": json!({
                "guest_ram": memory.mean_of(|b| b.guest_ram), "translation_buffer": memory.mean_of(|b| b.translation_buffer),
                "heap": memory.mean_of(|b| b.heap), "anonymous": memory.mean_of(|b| b.anonymous),
                "binaries": memory.mean_of(|b| b.binaries), "other": memory.mean_of(|b| b.other), "forks_sampled": memory.sample.len(),
            }),
            "one_fork_at_baseline": json!({
                "pss_mib": single.map(|m| mib(m.pss)), "uss_mib": single.map(|m| mib(m.uss)),
                "breakdown_uss_mib": single_breakdown.as_ref().map(breakdown),
            }),
            "host_total_mib": host_before.total >> 20,
            "host_used_before_mib": host_before.used() >> 20,
            "host_used_peak_percent": round(self.peak_used as f64 / host_before.total as f64 * 100.0),
            "host_used_end_mib": self.host_end.used() >> 20,
            "oom_kills_during_run": match (self.oom_before, self.oom_after) { (Some(a), Some(b)) => json!(b - a), _ => json!(null) },
        })
    }
}
