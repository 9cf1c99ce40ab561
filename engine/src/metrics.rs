//! Prometheus metrics of the engine: what `farm run --metrics-listen` and `farm serve`'s
//! `GET /metrics` expose (the HTTP side is the front-ends').
//!
//! One registry for the process. Labels are bounded sets (statuses, phases, roles, HTTP
//! codes): never a task or rollout id, so a long service cannot grow the series without end.

use std::sync::LazyLock;

use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

pub struct Metrics {
    registry: Registry,
    /// Rollouts recorded, by status.
    pub rollouts: IntCounterVec,
    /// Verdicts recorded, by trust level (`sound`, `hardened`).
    pub verdicts: IntCounterVec,
    /// Rewards of scored rollouts.
    pub reward: Histogram,
    /// Seconds per phase: fork, agent, score.
    pub phase_seconds: HistogramVec,
    /// Rollouts running now.
    pub in_flight: IntGauge,
    /// Rollouts admitted and waiting for a slot.
    pub queue_depth: IntGauge,
    /// VMs running now, by role: rollout, scoring, session.
    pub vms: IntGaugeVec,
    /// Forks served from the warm pool.
    pub warm_pool_hits: IntCounter,
    /// Warm forks ready now.
    pub warm_ready: IntGauge,
    /// Idle VMs taken again by a reset in place (`[rollouts] reuse`), by outcome: `reset`,
    /// or `failed` (a new fork instead).
    pub vm_resets: IntCounterVec,
    /// Policy endpoint requests, by HTTP status code (or `error` when none came back).
    pub policy_requests: IntCounterVec,
    /// Live sessions of `farm serve`.
    pub sessions_live: IntGauge,
    /// Paused sessions of `farm serve`, and the disk they take.
    pub sessions_paused: IntGauge,
    pub paused_bytes: IntGauge,
    /// Sandboxes of `farm serve`'s sandbox API (paused ones included).
    pub sandboxes: IntGauge,
    /// Requests to `farm serve`, by tenant and class of answer (`2xx`, `4xx`, `5xx`).
    pub tenant_requests: IntCounterVec,
    /// Requests refused over a quota, by tenant and quota.
    pub tenant_refusals: IntCounterVec,
    /// Seconds a tenant's rollouts waited in the queue for a slot.
    pub tenant_admission_wait: HistogramVec,
    /// A tenant's sessions and sandboxes, by state (`live`, `paused`), as of the last scrape.
    pub tenant_forks: IntGaugeVec,
    /// What a tenant's sandboxes use, by measure: `cpu_seconds`, `network_bytes_out` and
    /// `network_bytes_in` over their lives; `memory_bytes` and `disk_bytes` now.
    pub tenant_sandbox_usage: GaugeVec,
}

/// Every metric's name starts with `farm_`.
const PREFIX: &str = "farm";

static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics::new().expect("metric definitions are valid"));

/// A counter by tenant and one more label.
fn tenant_metric(name: &str, help: &str, label: &str) -> prometheus::Result<IntCounterVec> {
    IntCounterVec::new(Opts::new(name, help), &["tenant", label])
}

/// The process's metrics.
pub fn get() -> &'static Metrics {
    &METRICS
}

impl Metrics {
    // Long: every metric's definition and registration, side by side in one place.
    fn new() -> prometheus::Result<Metrics> {
        let registry = Registry::new_custom(Some(PREFIX.into()), None)?;
        let m = Metrics {
            registry,
            rollouts: IntCounterVec::new(
                Opts::new("rollouts_total", "Rollouts recorded, by status."),
                &["status"],
            )?,
            verdicts: IntCounterVec::new(
                Opts::new("verdicts_total", "Verdicts recorded, by how far they can be trusted."),
                &["trust"],
            )?,
            reward: Histogram::with_opts(
                HistogramOpts::new("reward", "Rewards of scored rollouts.")
                    .buckets(vec![0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]),
            )?,
            phase_seconds: HistogramVec::new(
                HistogramOpts::new("phase_seconds", "Seconds per rollout phase.")
                    .buckets(vec![0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0]),
                &["phase"],
            )?,
            in_flight: IntGauge::new("rollouts_in_flight", "Rollouts running now.")?,
            queue_depth: IntGauge::new("queue_depth", "Rollouts admitted and waiting for a slot.")?,
            vms: IntGaugeVec::new(Opts::new("vms", "VMs running now, by role."), &["role"])?,
            warm_pool_hits: IntCounter::new("warm_pool_hits_total", "Forks served from the warm pool.")?,
            warm_ready: IntGauge::new("warm_pool_ready", "Warm forks ready now.")?,
            vm_resets: IntCounterVec::new(
                Opts::new(
                    "vm_resets_total",
                    "Idle VMs reset in place for another use, by outcome.",
                ),
                &["outcome"],
            )?,
            policy_requests: IntCounterVec::new(
                Opts::new(
                    "policy_requests_total",
                    "Policy endpoint requests, by HTTP status code.",
                ),
                &["code"],
            )?,
            sessions_live: IntGauge::new("sessions_live", "Live sessions of farm serve.")?,
            sandboxes: IntGauge::new(
                "sandboxes",
                "Sandboxes of farm serve's sandbox API (paused ones included).",
            )?,
            sessions_paused: IntGauge::new(
                "sessions_paused",
                "Paused sessions of farm serve (saved to disk, no VM).",
            )?,
            paused_bytes: IntGauge::new("paused_bytes", "Disk bytes the paused sessions take.")?,
            tenant_requests: tenant_metric(
                "tenant_requests_total",
                "Requests to farm serve, by tenant and class of answer.",
                "class",
            )?,
            tenant_refusals: tenant_metric(
                "tenant_quota_refusals_total",
                "Requests refused over a quota, by tenant and quota.",
                "quota",
            )?,
            tenant_admission_wait: HistogramVec::new(
                HistogramOpts::new(
                    "tenant_admission_wait_seconds",
                    "Seconds a tenant's rollouts waited in the queue for a slot.",
                )
                .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0]),
                &["tenant"],
            )?,
            tenant_forks: IntGaugeVec::new(
                Opts::new("tenant_forks", "A tenant's sessions and sandboxes, by state."),
                &["tenant", "state"],
            )?,
            tenant_sandbox_usage: GaugeVec::new(
                Opts::new("tenant_sandbox_usage", "What a tenant's sandboxes use, by measure."),
                &["tenant", "measure"],
            )?,
        };
        let registry = &m.registry;
        registry.register(Box::new(m.rollouts.clone()))?;
        registry.register(Box::new(m.verdicts.clone()))?;
        registry.register(Box::new(m.reward.clone()))?;
        registry.register(Box::new(m.phase_seconds.clone()))?;
        registry.register(Box::new(m.in_flight.clone()))?;
        registry.register(Box::new(m.queue_depth.clone()))?;
        registry.register(Box::new(m.vms.clone()))?;
        registry.register(Box::new(m.warm_pool_hits.clone()))?;
        registry.register(Box::new(m.warm_ready.clone()))?;
        registry.register(Box::new(m.vm_resets.clone()))?;
        registry.register(Box::new(m.policy_requests.clone()))?;
        registry.register(Box::new(m.sessions_live.clone()))?;
        registry.register(Box::new(m.sessions_paused.clone()))?;
        registry.register(Box::new(m.paused_bytes.clone()))?;
        registry.register(Box::new(m.sandboxes.clone()))?;
        for tenant in [&m.tenant_requests, &m.tenant_refusals] {
            registry.register(Box::new(tenant.clone()))?;
        }
        registry.register(Box::new(m.tenant_admission_wait.clone()))?;
        registry.register(Box::new(m.tenant_forks.clone()))?;
        registry.register(Box::new(m.tenant_sandbox_usage.clone()))?;
        m.show_every_series();
        Ok(m)
    }

    /// Every status, trust level, role, outcome and phase shows from the start (0), so
    /// dashboards need no special case.
    fn show_every_series(&self) {
        for status in crate::row::Status::ALL {
            self.rollouts.with_label_values(&[status.as_str()]);
        }
        for trust in scorers::Trust::ALL {
            self.verdicts.with_label_values(&[trust.as_str()]);
        }
        for role in Role::ALL {
            self.vms.with_label_values(&[role.as_str()]);
        }
        for outcome in ["reset", "failed"] {
            self.vm_resets.with_label_values(&[outcome]);
        }
        for phase in ["fork", "agent", "score"] {
            self.phase_seconds.with_label_values(&[phase]);
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// The names of every metric farm exports (histograms without their `_bucket`, `_sum`
    /// and `_count` suffixes).
    pub fn names(&self) -> Vec<String> {
        use prometheus::core::Collector;
        let collectors: [&dyn Collector; 19] = [
            &self.rollouts,
            &self.verdicts,
            &self.reward,
            &self.phase_seconds,
            &self.in_flight,
            &self.queue_depth,
            &self.vms,
            &self.warm_pool_hits,
            &self.warm_ready,
            &self.vm_resets,
            &self.policy_requests,
            &self.sessions_live,
            &self.sessions_paused,
            &self.paused_bytes,
            &self.sandboxes,
            &self.tenant_requests,
            &self.tenant_refusals,
            &self.tenant_admission_wait,
            &self.tenant_forks,
        ];
        collectors
            .iter()
            .flat_map(|c| c.desc())
            .map(|d| format!("{PREFIX}_{}", d.fq_name))
            .collect()
    }

    /// Counts a recorded row: its status, reward and phase times.
    pub fn record(&self, row: &crate::row::Row) {
        self.rollouts.with_label_values(&[row.status.as_str()]).inc();
        if let Some(trust) = row.trust {
            self.verdicts.with_label_values(&[trust.as_str()]).inc();
        }
        if let Some(r) = row.reward {
            self.reward.observe(r);
        }
        let t = &row.timings;
        for (phase, ms) in [("fork", t.fork_ms), ("agent", t.rollout_ms), ("score", t.score_ms)] {
            if ms > 0.0 {
                self.phase_seconds.with_label_values(&[phase]).observe(ms / 1e3);
            }
        }
    }
}

/// What a VM is for.
#[derive(Debug, Clone, Copy)]
pub enum Role {
    Rollout,
    Scoring,
    Session,
    /// A sandbox of `farm serve`'s sandbox API.
    Sandbox,
}

impl Role {
    const ALL: [Role; 4] = [Role::Rollout, Role::Scoring, Role::Session, Role::Sandbox];

    fn as_str(self) -> &'static str {
        match self {
            Role::Rollout => "rollout",
            Role::Scoring => "scoring",
            Role::Session => "session",
            Role::Sandbox => "sandbox",
        }
    }
}

/// Counts one VM of a role while it lives.
pub struct VmGauge(Role);

impl VmGauge {
    pub fn new(role: Role) -> VmGauge {
        get().vms.with_label_values(&[role.as_str()]).inc();
        VmGauge(role)
    }
}

impl Drop for VmGauge {
    fn drop(&mut self) {
        get().vms.with_label_values(&[self.0.as_str()]).dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grafana_dashboard_queries_only_metrics_farm_exports() {
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("../../configs/grafana/farm.json")).expect("the dashboard is JSON");
        let names = get().names();
        assert!(
            names.contains(&"farm_rollouts_total".to_string()) && names.contains(&"farm_phase_seconds".to_string()),
            "{names:?}"
        );
        let panels = dashboard["panels"].as_array().expect("panels");
        assert!(panels.len() >= 5);
        let mut queried = std::collections::BTreeSet::new();
        for panel in panels {
            let targets = panel["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "panel {} has no query", panel["title"]);
            for target in targets {
                let expr = target["expr"].as_str().expect("expr");
                let mut rest = expr;
                let mut found = false;
                while let Some(i) = rest.find("farm_") {
                    let name: String = rest[i..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    let base = ["_bucket", "_sum", "_count"]
                        .iter()
                        .fold(name.clone(), |n, s| n.strip_suffix(s).map(String::from).unwrap_or(n));
                    assert!(
                        names.contains(&base),
                        "panel {} queries {name}, which farm does not export ({names:?})",
                        panel["title"]
                    );
                    queried.insert(base);
                    found = true;
                    rest = &rest[i + name.len()..];
                }
                assert!(found, "panel {} query {expr:?} names no farm metric", panel["title"]);
            }
        }
        // The panels: rollouts by status, reward, phase latency, VMs by role, queue depth.
        for wanted in [
            "farm_rollouts_total",
            "farm_reward",
            "farm_phase_seconds",
            "farm_vms",
            "farm_queue_depth",
        ] {
            assert!(queried.contains(wanted), "no panel shows {wanted}");
        }
    }
}
