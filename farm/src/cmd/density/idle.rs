//! The idle period of `farm bench density`: CPU used while every fork idles, by whom (the
//! forks' QEMU processes, farm, ksmd, the host as a whole and the busiest other processes),
//! with ksmd's scan rate set for the idle period if asked.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;
use vmm::memory;

use crate::cmd::measure::round;

/// CPU ticks at the start and the end of the idle period, by whom; and KSM around it.
pub(super) struct IdleCpu {
    seconds: f64,
    /// The host's busy ticks.
    busy: (u64, u64),
    /// The forks' QEMU processes' ticks.
    qemu: (u64, u64),
    /// farm's own ticks.
    farm: (u64, u64),
    pub(super) ksmd: (Option<u64>, Option<u64>),
    /// Other processes that used CPU, most first: (name (pid), ticks).
    others: Vec<(String, u64)>,
    /// ksmd's pages_to_scan during the fill (the host's setting).
    pub(super) fill_pages_to_scan: Option<String>,
    pub(super) ksm_after: Option<vmm::ksm::KsmStats>,
}

impl IdleCpu {
    /// Idles for `idle_secs`, with ksmd's pages_to_scan set to `idle_pages_to_scan` if given
    /// (and restored afterwards).
    pub(super) async fn measure(
        pids: &[u32],
        ksmd: Option<u32>,
        idle_pages_to_scan: Option<u64>,
        idle_secs: u64,
    ) -> Result<IdleCpu> {
        let qemu_ticks = |pids: &[u32]| pids.iter().filter_map(|&p| memory::cpu_ticks(p)).sum::<u64>();
        let pages_to_scan = format!("{}/pages_to_scan", vmm::ksm::SYSFS);
        let fill_pages_to_scan = std::fs::read_to_string(&pages_to_scan).ok();
        if let Some(n) = idle_pages_to_scan {
            std::fs::write(&pages_to_scan, n.to_string()).with_context(|| format!("writing {pages_to_scan}"))?;
        }
        let ksmd0 = ksmd.and_then(memory::cpu_ticks);
        let everyone0 = all_process_ticks();
        let (busy0, _) = memory::host_cpu_ticks().unwrap_or((0, 0));
        let (qemu0, farm0) = (qemu_ticks(pids), memory::cpu_ticks(std::process::id()).unwrap_or(0));
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_secs(idle_secs)).await;
        let seconds = t0.elapsed().as_secs_f64();
        let (busy1, _) = memory::host_cpu_ticks().unwrap_or((0, 0));
        let (qemu1, farm1) = (qemu_ticks(pids), memory::cpu_ticks(std::process::id()).unwrap_or(0));
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
        if let (Some(_), Some(original)) = (idle_pages_to_scan, &fill_pages_to_scan) {
            let _ = std::fs::write(&pages_to_scan, original.trim());
        }
        Ok(IdleCpu {
            seconds,
            busy: (busy0, busy1),
            qemu: (qemu0, qemu1),
            farm: (farm0, farm1),
            ksmd: (ksmd0, ksmd1),
            others,
            fill_pages_to_scan,
            ksm_after,
        })
    }

    /// The report's `idle_cpu`, for `forks` forks: shares of one core.
    pub(super) fn report(&self, forks: usize) -> serde_json::Value {
        let (seconds, (busy0, busy1), (qemu0, qemu1), (farm0, farm1)) = (self.seconds, self.busy, self.qemu, self.farm);
        let hz = memory::ticks_per_second() as f64;
        let percent = |ticks: u64| round(ticks as f64 / hz / seconds * 100.0);
        json!({
            "seconds": round(seconds),
            "host_percent_of_one_core": percent(busy1.saturating_sub(busy0)),
            "qemu_percent_of_one_core": percent(qemu1.saturating_sub(qemu0)),
            "farm_percent_of_one_core": percent(farm1.saturating_sub(farm0)),
            "other_processes_percent_of_one_core": self.others.iter().take(6).map(|(n, t)| json!({ "process": n, "percent": percent(*t) })).collect::<Vec<_>>(),
            "ksmd_percent_of_one_core": match self.ksmd { (Some(a), Some(b)) => json!(percent(b.saturating_sub(a))), _ => json!(null) },
            "per_fork_percent_of_one_core": if forks == 0 { 0.0 } else { round(qemu1.saturating_sub(qemu0) as f64 / hz / seconds * 100.0 / forks as f64 * 1000.0) / 1000.0 },
        })
    }
}

/// The pid of the kernel's `ksmd` thread, if it has one.
pub(super) fn ksmd_pid() -> Option<u32> {
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
