//! What the benchmarks share: their template, percentiles, rounding, the report's printing,
//! and the check of the host's limits before VMs are held alive.

use anyhow::{bail, Context, Result};
use serde_json::json;

/// The template snapshot of `image` the benchmarks fork from (built once, then cached).
pub(crate) async fn bench_template(forker: &snapshotter::Forker, image: &str) -> Result<snapshotter::Snapshot> {
    let store = snapshotter::SnapshotStore::default_location();
    let template = snapshotter::TemplateConfig::of_image(image);
    let quiet = |_: &str| {};
    let snapshot = snapshotter::build_template(
        &store,
        forker,
        &template,
        std::path::Path::new("."),
        &format!("bench-{image}"),
        &quiet,
    )
    .await
    .context("building the benchmark template")?
    .snapshot;
    Ok(snapshot)
}

/// p50 and p99 of milliseconds (nearest rank).
pub(crate) fn percentiles(samples: &[f64]) -> serde_json::Value {
    if samples.is_empty() {
        return json!(null);
    }
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = |p: f64| s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
    json!({ "p50": round(rank(0.50)), "p99": round(rank(0.99)), "min": round(s[0]), "max": round(s[s.len() - 1]), "n": s.len() })
}

pub(crate) fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

pub(crate) fn print_report(report: &serde_json::Value, as_json: bool) {
    if as_json {
        crate::ui::outln!("{report}");
        return;
    }
    if let Some(map) = report.as_object() {
        for (k, v) in map {
            crate::ui::outln!("{k:<40} {v}");
        }
    }
}

/// Refuses, before anything starts, a host whose limits cannot hold `vms` VMs, naming each
/// limit with the setting that lifts it.
pub(crate) fn check_host_limits(vms: usize, flag: &str) -> Result<()> {
    let problems = vmm::process::HostLimits::probe().problems(vms as u64);
    if !problems.is_empty() {
        bail!(
            "this host cannot hold {vms} forks alive ({flag}):\n  {}",
            problems.join("\n  ")
        );
    }
    Ok(())
}
