//! What each sandbox uses: now (its VM's CPU, memory, disk and network, read from the host)
//! and over its life in this process (every VM it has had: a pause, a resume or a reset by a
//! fresh fork starts another). `GET /v1/sandboxes/{id}/metrics` answers with both, and the
//! Prometheus output sums them by tenant (`farm_tenant_sandbox_usage`), so a leak or a
//! runaway shows.

use std::collections::HashMap;

use engine::book::Kind;
use engine::session::VmUsage;

use super::{SandboxId, Sandboxes};
use crate::error::ApiResult;
use crate::wire::{SandboxMetrics, UsageLife, UsageNow};

/// A sandbox's use over its life: the VMs it had before this one, and this one as last seen.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spent {
    /// Summed over the VMs it no longer has.
    past_cpu_seconds: f64,
    past_network_out: u64,
    past_network_in: u64,
    /// Its VM now, as last read.
    last: Option<VmUsage>,
    peak_memory_bytes: u64,
    peak_disk_bytes: u64,
}

impl Spent {
    /// Takes in a reading of its VM (None: it has none now). A reading of another VM than
    /// the last one closes the last one's account.
    pub fn observe(&mut self, now: Option<VmUsage>) {
        if let Some(last) = self.last {
            if now.is_none_or(|n| n.pid != last.pid) {
                self.past_cpu_seconds += last.cpu_seconds;
                self.past_network_out += last.network_bytes_out;
                self.past_network_in += last.network_bytes_in;
            }
        }
        if let Some(n) = now {
            self.peak_memory_bytes = self.peak_memory_bytes.max(n.memory_bytes);
            self.peak_disk_bytes = self.peak_disk_bytes.max(n.disk_bytes);
        }
        self.last = now;
    }

    pub fn life(&self) -> UsageLife {
        let last = self.last.unwrap_or_default();
        UsageLife {
            cpu_seconds: self.past_cpu_seconds + last.cpu_seconds,
            network_bytes_out: self.past_network_out + last.network_bytes_out,
            network_bytes_in: self.past_network_in + last.network_bytes_in,
            peak_memory_bytes: self.peak_memory_bytes,
            peak_disk_bytes: self.peak_disk_bytes,
        }
    }

    pub fn now(&self) -> Option<UsageNow> {
        self.last.map(|n| UsageNow {
            cpu_seconds: n.cpu_seconds,
            memory_bytes: n.memory_bytes,
            private_dirty_bytes: n.private_dirty_bytes,
            disk_bytes: n.disk_bytes,
            network_bytes_out: n.network_bytes_out,
            network_bytes_in: n.network_bytes_in,
        })
    }
}

impl Sandboxes {
    /// `GET /v1/sandboxes/{id}/metrics`.
    pub async fn metrics(&self, id: &SandboxId) -> ApiResult<SandboxMetrics> {
        let sandbox = self.get(id)?;
        let mut open = sandbox.lock().await;
        let reading = open.run.usage();
        let state = super::view(&open).state;
        let facts = open.sandbox_mut();
        facts.spent.observe(reading);
        Ok(SandboxMetrics {
            sandbox: id.to_string(),
            state,
            now: facts.spent.now(),
            life: facts.spent.life(),
        })
    }

    /// Reads every sandbox whose lock is free, and sets `farm_tenant_sandbox_usage` to the
    /// sums by tenant.
    pub(super) fn observe_all(&self) {
        let all = self.forks().all_with(Kind::Sandbox, |_| true);
        let mut sums: HashMap<tenants::TenantId, UsageLife> = HashMap::new();
        let mut memory: HashMap<tenants::TenantId, u64> = HashMap::new();
        for (id, sandbox) in all {
            let Ok(mut open) = sandbox.try_lock() else { continue };
            let reading = open.run.usage();
            let facts = open.sandbox_mut();
            facts.spent.observe(reading);
            let Some(owner) = self.owner_of(&id) else { continue };
            let life = facts.spent.life();
            let sum = sums.entry(owner).or_default();
            sum.cpu_seconds += life.cpu_seconds;
            sum.network_bytes_out += life.network_bytes_out;
            sum.network_bytes_in += life.network_bytes_in;
            sum.peak_disk_bytes += reading.map_or(0, |r| r.disk_bytes);
            *memory.entry(owner).or_default() += reading.map_or(0, |r| r.memory_bytes);
        }
        let gauge = &engine::metrics::get().tenant_sandbox_usage;
        gauge.reset();
        for (tenant, sum) in sums {
            let name = self.events.tenant_name(tenant);
            let set = |measure: &str, value: f64| gauge.with_label_values(&[name.as_str(), measure]).set(value);
            set("cpu_seconds", sum.cpu_seconds);
            set("memory_bytes", memory.get(&tenant).copied().unwrap_or(0) as f64);
            set("disk_bytes", sum.peak_disk_bytes as f64);
            set("network_bytes_out", sum.network_bytes_out as f64);
            set("network_bytes_in", sum.network_bytes_in as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(pid: u32, cpu: f64, out: u64, memory: u64) -> VmUsage {
        VmUsage {
            pid,
            cpu_seconds: cpu,
            memory_bytes: memory,
            network_bytes_out: out,
            ..Default::default()
        }
    }

    #[test]
    fn a_sandbox_counts_every_vm_it_had() {
        let mut spent = Spent::default();
        spent.observe(Some(vm(10, 1.0, 100, 50)));
        spent.observe(Some(vm(10, 2.5, 300, 40)));
        assert_eq!(spent.life().cpu_seconds, 2.5, "the same VM, read again");
        spent.observe(None);
        assert!(spent.now().is_none(), "paused: no VM now");
        assert_eq!(spent.life().cpu_seconds, 2.5);
        spent.observe(Some(vm(11, 0.5, 10, 70)));
        let life = spent.life();
        assert_eq!((life.cpu_seconds, life.network_bytes_out), (3.0, 310));
        assert_eq!(life.peak_memory_bytes, 70);
        spent.observe(Some(vm(12, 0.25, 0, 10)));
        assert_eq!(
            spent.life().cpu_seconds,
            3.25,
            "a VM replaced without a pause (a fresh fork)"
        );
    }
}
