//! How many rollouts run at once, and how many warm forks are kept, when the suite leaves
//! them to farm (`"auto"`, the default).
//!
//! - Concurrency: one rollout per core the process may use (its CPU affinity and cgroup
//!   quota, as `std::thread::available_parallelism` reports them). A replayed rollout keeps
//!   its core busy; a rollout driven by a live policy mostly waits for the endpoint, so
//!   there it is at least the policy's request concurrency. Either way no more than the
//!   available memory holds, counting each fork at its guest memory plus QEMU's own.
//! - Warm pool: off for replays, whose rollouts keep every core busy, so warming forks
//!   ahead would take the same CPU the rollouts need (lower latency, no more throughput).
//!   With a live policy the cores are mostly idle while rollouts wait for the endpoint, and
//!   a warm fork takes tens of milliseconds instead of a fresh fork's hundreds: one per core,
//!   within the same memory bound.

use crate::config::Count;

/// The host's memory, processes and settings as the machine layer measures them, for the
/// front-ends' admission and capacity figures (they reach the host through the engine, not
/// the machine layer).
pub use vmm::jail::missing_cgroups_note;
pub use vmm::ksm::{Ksm, KsmHost};
pub use vmm::memory::{HostMemory, ProcessMemory};
pub use vmm::process::{live_pids, HostLimits};
pub use vmm::AccelSetting;

/// What a fork costs besides its guest memory: QEMU itself and its translation buffer.
pub const QEMU_OVERHEAD_MIB: u64 = 64;

/// What farm may use on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Host {
    pub cores: usize,
    /// `MemAvailable`, when the kernel tells it.
    pub mem_available_mib: Option<u64>,
}

impl Host {
    pub fn probe() -> Host {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let mem_available_mib = vmm::memory::HostMemory::probe()
            .filter(|m| m.total > 0)
            .map(|m| m.available >> 20);
        Host {
            cores,
            mem_available_mib,
        }
    }
}

/// The numbers a run uses, and how they were chosen (for its log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counts {
    pub concurrency: usize,
    pub warm_pool: usize,
    pub explanation: String,
}

/// `live_requests`: the request concurrency of a live policy (None for a replay).
pub fn resolve(
    concurrency: Count,
    warm_pool: Count,
    live_requests: Option<usize>,
    guest_mib: u32,
    host: &Host,
) -> Counts {
    let per_fork = guest_mib as u64 + QEMU_OVERHEAD_MIB;
    let fits = host.mem_available_mib.map(|m| (m / per_fork).max(1) as usize);
    let mut why = Vec::new();
    let concurrency = match concurrency {
        Count::Fixed(n) => n.max(1),
        Count::Auto => {
            let wanted = match live_requests {
                None => host.cores,
                Some(requests) => host.cores.max(requests),
            };
            let chosen = fits.map_or(wanted, |f| wanted.min(f)).max(1);
            let basis = match live_requests {
                None => format!("{} cores", host.cores),
                Some(requests) => format!("{} cores, {requests} policy requests at once", host.cores),
            };
            if chosen < wanted {
                why.push(format!(
                    "concurrency {chosen} (auto: {basis}, memory for {chosen} forks of {per_fork} MiB)"
                ));
            } else {
                why.push(format!("concurrency {chosen} (auto: {basis})"));
            }
            chosen
        }
    };
    let warm_pool = match warm_pool {
        Count::Fixed(n) => n,
        Count::Auto => match live_requests {
            None => {
                why.push("warm pool off (auto: replayed rollouts keep the cores busy)".into());
                0
            }
            Some(_) => {
                let room = fits.map_or(usize::MAX, |f| f.saturating_sub(concurrency));
                let chosen = host.cores.min(concurrency).min(room);
                why.push(format!(
                    "warm pool {chosen} (auto: rollouts of a live policy leave cores idle)"
                ));
                chosen
            }
        },
    };
    Counts {
        concurrency,
        warm_pool,
        explanation: why.join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(cores: usize, mib: Option<u64>) -> Host {
        Host {
            cores,
            mem_available_mib: mib,
        }
    }

    #[test]
    fn auto_concurrency_is_one_rollout_per_core_within_memory() {
        let c = resolve(Count::Auto, Count::Auto, None, 256, &host(64, Some(64 << 10)));
        assert_eq!((c.concurrency, c.warm_pool), (64, 0), "{}", c.explanation);
        let c = resolve(Count::Auto, Count::Auto, None, 256, &host(2, None));
        assert_eq!(c.concurrency, 2);
        // 64 cores, 3 GiB free: ten forks of 320 MiB fit.
        let c = resolve(Count::Auto, Count::Auto, None, 256, &host(64, Some(3200)));
        assert_eq!(c.concurrency, 10);
        assert!(c.explanation.contains("memory for 10 forks"), "{}", c.explanation);
        // Never zero, even with no memory to speak of.
        assert_eq!(
            resolve(Count::Auto, Count::Auto, None, 256, &host(4, Some(10))).concurrency,
            1
        );
    }

    #[test]
    fn a_live_policy_runs_at_least_its_requests_and_gets_a_pool() {
        let c = resolve(Count::Auto, Count::Auto, Some(8), 256, &host(2, Some(24 << 10)));
        assert_eq!((c.concurrency, c.warm_pool), (8, 2), "{}", c.explanation);
        let c = resolve(Count::Auto, Count::Auto, Some(4), 256, &host(16, Some(24 << 10)));
        assert_eq!((c.concurrency, c.warm_pool), (16, 16));
        // The pool only takes memory the rollouts leave.
        let c = resolve(Count::Auto, Count::Auto, Some(4), 256, &host(16, Some(320 * 18)));
        assert_eq!((c.concurrency, c.warm_pool), (16, 2));
    }

    #[test]
    fn fixed_numbers_are_kept() {
        let c = resolve(Count::Fixed(3), Count::Fixed(5), None, 256, &host(64, Some(1 << 20)));
        assert_eq!((c.concurrency, c.warm_pool), (3, 5));
        assert_eq!(c.explanation, "");
        assert_eq!(
            resolve(Count::Fixed(0), Count::Fixed(0), Some(4), 256, &host(2, None)).concurrency,
            1
        );
    }

    #[test]
    fn the_host_probe_reads_this_machine() {
        let h = Host::probe();
        assert!(h.cores >= 1);
        assert!(h.mem_available_mib.is_some_and(|m| m > 0));
    }
}
