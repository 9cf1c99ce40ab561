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
use snapshotter::{build_template, Fork, ForkIdentity, Forker, SnapshotStore, TemplateConfig};
use vmm::memory::{self, Breakdown, HostMemory, ProcessMemory};
use vmm::{AccelSetting, ExecOptions, VmSettings};

use super::measure::{check_host_limits, percentiles, print_report, round};

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
    /// Same-page merging of QEMU's memory: off, on, or on-no-aslr (see README, "Density").
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
    let store = SnapshotStore::default_location();
    let template = TemplateConfig::of_image(&args.image);
    let snapshot = build_template(
        &store,
        &forker,
        &template,
        std::path::Path::new("."),
        &format!("bench-{}", args.image),
        &|_: &str| {},
    )
    .await
    .context("building the benchmark template")?
    .snapshot;
    let ram_file = snapshot.memory_path();
    say(&format!("template snapshot {}", snapshot.id()));
    let host_before = HostMemory::probe().context("reading /proc/meminfo")?;
    let ksm_before = vmm::ksm::KsmStats::read();
    let ksmd = ksmd_pid();
    let ksmd_ticks_before = ksmd.and_then(memory::cpu_ticks);
    let oom_before = memory::oom_kills();

    let mut fill = Filler {
        forker: forker.clone(),
        snapshot: snapshot.clone(),
        floor: host_before.total / 100 * args.headroom_percent,
        headroom_percent: args.headroom_percent,
        concurrency: args.concurrency.max(1),
        progress,
        forks: Vec::new(),
        start_ms: Vec::new(),
        peak_used: host_before.used(),
        ksm: args.ksm != vmm::Ksm::Off,
        largest_fork: 64 << 20,
    };
    say(&format!(
        "baseline: {} forks alive, {} execs",
        args.baseline, args.execs
    ));
    let mut stopped_by = fill.fill(args.baseline.max(1)).await?;
    let forks = &fill.forks;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut baseline_ms = Vec::new();
    for i in 0..args.execs {
        baseline_ms.push(timed_exec(&forks[i % forks.len()]).await?);
    }
    let baseline_alive = forks.len();
    let one_idle = forks.first().map(|f| f.machine.pid());
    let single = one_idle.and_then(ProcessMemory::of);
    let single_breakdown = one_idle.and_then(|pid| Breakdown::of(pid, &ram_file));
    let guest = match forks.first() {
        Some(f) => guest_memory(f).await,
        None => None,
    };

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
    let mut all_ms = Vec::new();
    let mut failed_execs = Vec::new();
    for (i, fork) in forks.iter().enumerate() {
        match timed_exec(fork).await {
            Ok(t) => all_ms.push(t),
            Err(e) => failed_execs.push(format!("fork {i}: {e:#}")),
        }
    }

    say(&format!("idle for {} s", args.idle_secs));
    let pids: Vec<u32> = forks.iter().map(|f| f.machine.pid()).collect();
    let qemu_ticks = |pids: &[u32]| pids.iter().filter_map(|&p| memory::cpu_ticks(p)).sum::<u64>();
    let pages_to_scan = format!("{}/pages_to_scan", vmm::ksm::SYSFS);
    let fill_pages_to_scan = std::fs::read_to_string(&pages_to_scan).ok();
    if let Some(n) = args.ksmd_idle_pages_to_scan {
        std::fs::write(&pages_to_scan, n.to_string()).with_context(|| format!("writing {pages_to_scan}"))?;
    }
    let ksmd0 = ksmd.and_then(memory::cpu_ticks);
    let everyone0 = all_process_ticks();
    let (busy0, _) = memory::host_cpu_ticks().unwrap_or((0, 0));
    let (qemu0, farm0) = (qemu_ticks(&pids), memory::cpu_ticks(std::process::id()).unwrap_or(0));
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    let seconds = t0.elapsed().as_secs_f64();
    let (busy1, _) = memory::host_cpu_ticks().unwrap_or((0, 0));
    let (qemu1, farm1) = (qemu_ticks(&pids), memory::cpu_ticks(std::process::id()).unwrap_or(0));
    let ksmd1 = ksmd.and_then(memory::cpu_ticks);
    let mut others: Vec<(String, u64)> = all_process_ticks()
        .into_iter()
        .filter(|(pid, _, _)| !pids.contains(pid) && *pid != std::process::id())
        .filter_map(|(pid, name, t)| {
            everyone0
                .iter()
                .find(|(p, n, _)| *p == pid && *n == name)
                .map(|(_, _, t0)| (format!("{name} ({pid})"), t.saturating_sub(*t0)))
        })
        .filter(|(_, t)| *t > 0)
        .collect();
    others.sort_by_key(|o| std::cmp::Reverse(o.1));
    let ksm_after = vmm::ksm::KsmStats::read();
    if let (Some(_), Some(original)) = (args.ksmd_idle_pages_to_scan, &fill_pages_to_scan) {
        let _ = std::fs::write(&pages_to_scan, original.trim());
    }
    let hz = memory::ticks_per_second() as f64;
    let percent = |ticks: u64| round(ticks as f64 / hz / seconds * 100.0);

    let per_fork: Vec<ProcessMemory> = pids.iter().filter_map(|&p| ProcessMemory::of(p)).collect();
    let series = |f: fn(&ProcessMemory) -> u64| {
        per_fork
            .iter()
            .map(|m| f(m) as f64 / (1u64 << 20) as f64)
            .collect::<Vec<_>>()
    };
    let sample: Vec<Breakdown> = pids
        .iter()
        .step_by((pids.len() / 20).max(1))
        .filter_map(|&p| Breakdown::of(p, &ram_file))
        .collect();
    let mean_of = |f: fn(&Breakdown) -> u64| {
        if sample.is_empty() {
            0.0
        } else {
            mib(sample.iter().map(f).sum::<u64>() / sample.len() as u64)
        }
    };
    let host_end = HostMemory::probe().unwrap_or_default();
    peak_used = peak_used.max(host_end.used());
    let responsive = futures::future::join_all(forks.iter().map(|f| f.agent().ping()))
        .await
        .iter()
        .filter(|r| r.is_ok())
        .count();
    let oom_after = memory::oom_kills();

    let baseline_p = percentiles(&baseline_ms);
    let all_p = percentiles(&all_ms);
    let p99 = |v: &serde_json::Value| v.get("p99").and_then(|x| x.as_f64()).unwrap_or(f64::NAN);
    let breakdown = |b: &Breakdown| {
        json!({
            "guest_ram": mib(b.guest_ram), "translation_buffer": mib(b.translation_buffer), "heap": mib(b.heap),
            "anonymous": mib(b.anonymous), "binaries": mib(b.binaries), "other": mib(b.other),
        })
    };
    let report = json!({
        "benchmark": "density",
        "image": args.image,
        "accel": settings.accel.to_string(),
        "guest_memory_mib": snapshot.manifest.memory_mib,
        "tb_size_mib": settings.tcg_tb_size_mib,
        "ksm": args.ksm.to_string(),
        "ksmd_pages_to_scan": { "fill": fill_pages_to_scan.as_deref().map(str::trim), "idle": args.ksmd_idle_pages_to_scan },
        "ksm_pages_saved_mib": match (ksm_before, ksm_after) {
            (Some(a), Some(b)) if args.ksm != vmm::Ksm::Off => json!(mib(b.pages_sharing.saturating_sub(a.pages_sharing) * 4096)),
            _ => json!(null),
        },
        "ksmd_cpu_seconds_whole_run": match (ksmd_ticks_before, ksmd1) {
            (Some(a), Some(b)) => json!(round((b - a) as f64 / memory::ticks_per_second() as f64)),
            _ => json!(null),
        },
        "forks_wanted": args.forks,
        "forks_alive": forks.len(),
        "stopped_by": stopped_by,
        "answered_exec": all_ms.len(),
        "failed_execs": failed_execs.iter().take(10).collect::<Vec<_>>(),
        "responsive_after_idle": responsive,
        "fork_to_first_exec_ms": percentiles(&start_ms),
        "exec_ms_baseline": { "forks_alive": baseline_alive, "latency": baseline_p },
        "exec_ms_all_alive": { "forks_alive": forks.len(), "latency": all_p },
        "ratio_exec_p99_all_over_baseline": round(p99(&all_p) / p99(&baseline_p)),
        "memory": {
            "per_fork_pss_mib": percentiles(&series(|m| m.pss)),
            "per_fork_uss_mib": percentiles(&series(|m| m.uss)),
            "per_fork_private_dirty_mib": percentiles(&series(|m| m.private_dirty)),
            "total_pss_mib": round(series(|m| m.pss).iter().sum::<f64>()),
            "breakdown_mean_uss_mib": json!({
                "guest_ram": mean_of(|b| b.guest_ram), "translation_buffer": mean_of(|b| b.translation_buffer),
                "heap": mean_of(|b| b.heap), "anonymous": mean_of(|b| b.anonymous),
                "binaries": mean_of(|b| b.binaries), "other": mean_of(|b| b.other), "forks_sampled": sample.len(),
            }),
            "one_fork_at_baseline": json!({
                "pss_mib": single.map(|m| mib(m.pss)), "uss_mib": single.map(|m| mib(m.uss)),
                "breakdown_uss_mib": single_breakdown.as_ref().map(breakdown),
            }),
            "host_total_mib": host_before.total >> 20,
            "host_used_before_mib": host_before.used() >> 20,
            "host_used_peak_percent": round(peak_used as f64 / host_before.total as f64 * 100.0),
            "host_used_end_mib": host_end.used() >> 20,
            "oom_kills_during_run": match (oom_before, oom_after) { (Some(a), Some(b)) => json!(b - a), _ => json!(null) },
        },
        "guest": { "mem_total_mib": guest.map(|g| g.0), "mem_available_mib": guest.map(|g| g.1) },
        "idle_cpu": {
            "seconds": round(seconds),
            "host_percent_of_one_core": percent(busy1.saturating_sub(busy0)),
            "qemu_percent_of_one_core": percent(qemu1.saturating_sub(qemu0)),
            "farm_percent_of_one_core": percent(farm1.saturating_sub(farm0)),
            "other_processes_percent_of_one_core": others.iter().take(6).map(|(n, t)| json!({ "process": n, "percent": percent(*t) })).collect::<Vec<_>>(),
            "ksmd_percent_of_one_core": match (ksmd0, ksmd1) { (Some(a), Some(b)) => json!(percent(b.saturating_sub(a))), _ => json!(null) },
            "per_fork_percent_of_one_core": if pids.is_empty() { 0.0 } else { round(qemu1.saturating_sub(qemu0) as f64 / hz / seconds * 100.0 / pids.len() as f64 * 1000.0) / 1000.0 },
        },
    });
    say("stopping the forks");
    futures::future::join_all(forks.into_iter().map(|f| f.machine.shutdown())).await;
    print_report(&report, args.json);
    Ok(0)
}

/// The pid of the kernel's `ksmd` thread, if it has one.
fn ksmd_pid() -> Option<u32> {
    all_process_ticks()
        .into_iter()
        .find(|(_, name, _)| name == "ksmd")
        .map(|(pid, _, _)| pid)
}

/// Every process's (pid, name, CPU ticks), kernel threads included.
fn all_process_ticks() -> Vec<(u32, String, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .ok()?
                .trim()
                .to_string();
            Some((pid, name, memory::cpu_ticks(pid)?))
        })
        .collect()
}
