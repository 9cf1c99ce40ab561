//! Memory admission: a session (opened, branched or resumed) starts a VM only if the host
//! still keeps its reserve afterwards, counting the VM at the measured cost of the VMs this
//! service already runs (their mean PSS), not at a fixed guess. Past that, callers get 503
//! with the figures, well before the kernel's OOM killer would act.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use engine::sizing::{HostMemory, ProcessMemory};

/// How often the VMs' memory is measured again.
const REMEASURE: Duration = Duration::from_secs(5);
/// VMs read per measurement (spread over all of them).
const SAMPLE: usize = 64;
/// The least an idle session's VM was measured to cost (`farm bench density`, TCG, with
/// KSM); `max_sessions = "auto"` allows as many as memory could hold at this figure, and
/// the memory check then admits each at the measured cost.
pub const IDLE_SESSION_FLOOR_MIB: u64 = 16;

/// The cost of one more VM, as last measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    pub bytes: u64,
    /// How many VMs the mean is over; 0 when none ran and the fallback was used.
    pub sampled: usize,
}

impl Cost {
    fn basis(&self) -> String {
        match self.sampled {
            0 => "farm's estimate until a VM runs".to_string(),
            n => format!("mean PSS of {n} running VMs"),
        }
    }
}

/// Measures, at most every [`REMEASURE`], this process's QEMUs.
pub struct VmCost {
    fallback_bytes: u64,
    last: Mutex<Option<(Instant, Cost)>>,
}

impl VmCost {
    /// `fallback_bytes`: the cost assumed while no VM runs.
    pub fn new(fallback_bytes: u64) -> VmCost {
        VmCost {
            fallback_bytes,
            last: Mutex::new(None),
        }
    }

    pub fn current(&self) -> Cost {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, cost)) = *last {
            if at.elapsed() < REMEASURE {
                return cost;
            }
        }
        let pids = engine::sizing::live_pids();
        let step = (pids.len() / SAMPLE).max(1);
        let measured: Vec<u64> = pids
            .iter()
            .step_by(step)
            .filter_map(|&p| ProcessMemory::of(p))
            .map(|m| m.pss)
            .collect();
        let cost = match measured.len() {
            0 => Cost {
                bytes: self.fallback_bytes,
                sampled: 0,
            },
            n => Cost {
                bytes: measured.iter().sum::<u64>() / n as u64,
                sampled: n,
            },
        };
        *last = Some((Instant::now(), cost));
        cost
    }
}

/// The bytes of MemTotal the service keeps free.
pub fn reserve_bytes(host: &HostMemory, reserve_percent: u64) -> u64 {
    host.total / 100 * reserve_percent.min(100)
}

/// `serve.max_sessions = "auto"`: what memory could hold at the idle floor, past the reserve.
pub fn auto_max_sessions(host: &HostMemory, reserve_percent: u64) -> usize {
    let usable = host.total.saturating_sub(reserve_bytes(host, reserve_percent));
    ((usable >> 20) / IDLE_SESSION_FLOOR_MIB).max(1) as usize
}

/// Why the service refuses more work for now: the host's memory, with the figures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Pressure {
    #[error(
        "memory: the host has {} MiB available; a VM costs about {} MiB ({basis}) and the service keeps {} MiB ({reserve_percent}% of MemTotal, serve.memory_reserve_percent) free",
        available >> 20,
        cost >> 20,
        reserve >> 20
    )]
    NoRoom {
        available: u64,
        cost: u64,
        basis: String,
        reserve: u64,
        reserve_percent: u64,
    },
    #[error(
        "memory: the host has {} MiB available, under half the service's reserve ({} MiB); steps and commands wait until memory comes back (pause or delete sessions or sandboxes)",
        available >> 20,
        critical >> 20
    )]
    UnderHalfTheReserve { available: u64, critical: u64 },
}

/// Ok when one more VM at `cost` leaves the reserve free; else the reason, with figures.
pub fn check(host: &HostMemory, reserve_percent: u64, cost: Cost) -> Result<(), Pressure> {
    let reserve = reserve_bytes(host, reserve_percent);
    if host.available >= reserve.saturating_add(cost.bytes) {
        return Ok(());
    }
    Err(Pressure::NoRoom {
        available: host.available,
        cost: cost.bytes,
        basis: cost.basis(),
        reserve,
        reserve_percent,
    })
}

/// [`check_step`] on this host now, as the API answers it: 503 with `Retry-After` (a
/// session's step, and every sandbox command or process started, on any front door).
pub fn step_room(reserve_percent: u64) -> crate::error::ApiResult<()> {
    step_answer(HostMemory::probe(), reserve_percent)
}

fn step_answer(host: Option<HostMemory>, reserve_percent: u64) -> crate::error::ApiResult<()> {
    let Some(host) = host else { return Ok(()) };
    check_step(&host, reserve_percent).map_err(|why| crate::error::ApiError {
        retry_after: Some(5),
        ..crate::error::ApiError::new(crate::error::ErrorKind::Unavailable, why.to_string())
    })
}

/// Ok while the host has at least half the reserve available. Below that, a session's step
/// or a sandbox's command (which may grow its VM: new code to translate, pages written) waits:
/// VMs admitted earlier can still grow into the reserve, and this keeps them from growing into
/// the OOM killer. (Measured: 773 idle sandboxes admitted at the reserve, then one command in
/// each, took the host to 98 % of its memory before sandboxes' commands were held too.)
pub fn check_step(host: &HostMemory, reserve_percent: u64) -> Result<(), Pressure> {
    let critical = reserve_bytes(host, reserve_percent) / 2;
    if host.available >= critical {
        return Ok(());
    }
    Err(Pressure::UnderHalfTheReserve {
        available: host.available,
        critical,
    })
}

/// Says how many sessions and VMs the service may hold, and names a host limit that would
/// stop it short.
pub fn log_capacity(
    settings: &super::ServeSection,
    max_sessions: usize,
    counts: &engine::sizing::Counts,
    suites: usize,
) {
    tracing::info!("{}", counts.explanation);
    // VMs the service may hold at once: a host limit that would stop it short is named.
    tracing::info!(
        "max_sessions {max_sessions}{}",
        if settings.max_sessions == engine::config::Count::Auto {
            " (auto: memory, past the reserve, at an idle session's floor; each is admitted at the measured cost)"
        } else {
            ""
        }
    );
    let vms = (max_sessions + counts.concurrency * 2 + counts.warm_pool * suites.max(1)) as u64;
    for problem in engine::sizing::HostLimits::probe().problems(vms) {
        tracing::warn!(
            "{problem} (serve.max_sessions {max_sessions} and concurrency {} allow up to {vms} VMs)",
            counts.concurrency
        );
    }
}

/// `serve.max_sessions`, resolved (`auto`: what the host's memory holds past the reserve).
pub fn resolve_max_sessions(settings: &crate::ServeSection) -> usize {
    match settings.max_sessions {
        engine::config::Count::Fixed(n) => n,
        engine::config::Count::Auto => {
            let host_memory = engine::sizing::HostMemory::probe().unwrap_or_default();
            auto_max_sessions(&host_memory, settings.memory_reserve_percent)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_vm_is_admitted_only_above_the_reserve() {
        let cost = Cost {
            bytes: 40 << 20,
            sampled: 12,
        };
        let host = HostMemory {
            total: 24 * GIB,
            available: 20 * GIB,
        };
        assert_eq!(check(&host, 10, cost), Ok(()));
        // 2.4 GiB reserve: 2.43 GiB available leaves less than a VM above it.
        let tight = HostMemory {
            total: 24 * GIB,
            available: reserve_bytes(&host, 10) + (30 << 20),
        };
        let why = check(&tight, 10, cost).unwrap_err().to_string();
        assert!(
            why.contains("a VM costs about 40 MiB (mean PSS of 12 running VMs)"),
            "{why}"
        );
        assert!(why.contains("serve.memory_reserve_percent"), "{why}");
        assert_eq!(
            check(
                &tight,
                10,
                Cost {
                    bytes: 20 << 20,
                    sampled: 3
                }
            ),
            Ok(())
        );
        let first = check(
            &tight,
            10,
            Cost {
                bytes: 320 << 20,
                sampled: 0,
            },
        )
        .unwrap_err()
        .to_string();
        assert!(first.contains("farm's estimate until a VM runs"), "{first}");
    }

    #[test]
    fn a_command_under_half_the_reserve_is_a_503_to_retry() {
        let host = |available| HostMemory {
            total: 24 * GIB,
            available,
        };
        assert!(step_answer(Some(host(3 * GIB)), 10).is_ok());
        assert!(step_answer(None, 10).is_ok(), "no figures: no wait");
        let e = step_answer(Some(host(1100 << 20)), 10).unwrap_err();
        assert_eq!((e.kind, e.retry_after), (crate::error::ErrorKind::Unavailable, Some(5)));
        assert!(e.message.contains("commands wait"), "{}", e.message);
    }

    #[test]
    fn steps_wait_below_half_the_reserve() {
        let host = |available| HostMemory {
            total: 24 * GIB,
            available,
        };
        assert_eq!(check_step(&host(3 * GIB), 10), Ok(()));
        assert_eq!(check_step(&host(1300 << 20), 10), Ok(()));
        let why = check_step(&host(1100 << 20), 10).unwrap_err().to_string();
        assert!(
            why.contains("1100 MiB available") && why.contains("steps and commands wait"),
            "{why}"
        );
        assert_eq!(check_step(&host(0), 0), Ok(()), "no reserve, no wait");
    }

    #[test]
    fn auto_max_sessions_follows_memory() {
        let host = HostMemory {
            total: 24 * GIB,
            available: 23 * GIB,
        };
        // (24 GiB - 10 %) / 16 MiB.
        assert_eq!(auto_max_sessions(&host, 10), 1382);
        assert!(
            auto_max_sessions(
                &HostMemory {
                    total: 4 * GIB,
                    available: GIB
                },
                10
            ) < auto_max_sessions(&host, 10)
        );
        assert_eq!(
            auto_max_sessions(
                &HostMemory {
                    total: GIB,
                    available: GIB
                },
                100
            ),
            1
        );
    }

    #[test]
    fn with_no_vm_running_the_fallback_is_used() {
        // This test process starts no QEMU.
        let cost = VmCost::new(320 << 20).current();
        assert_eq!(
            cost,
            Cost {
                bytes: 320 << 20,
                sampled: 0
            }
        );
    }
}
