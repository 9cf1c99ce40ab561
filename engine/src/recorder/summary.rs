//! `summary.json`'s numbers: counts by status and trust level, mean reward, unbiased pass@k
//! and pass^k, per task and overall.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::row::{Outcome, Status, Timings};

/// `summary.json`, field by field as `docs/output.md` documents it. Maps are keyed by name
/// (`"passed"`, `"sound"`) or by k (`"1"`, `"2"`). Every field has a default, so summaries
/// written before a field existed still load.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    #[serde(default)]
    pub planned: usize,
    #[serde(default)]
    pub finished: usize,
    /// Over every row of the run.
    #[serde(flatten)]
    pub totals: Totals,
    #[serde(default)]
    pub tasks: BTreeMap<String, TaskSummary>,
    /// Where and with what the run was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
    /// This session's speed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub performance: Option<Performance>,
    /// A run `farm merge` made from shards: each shard's provenance and speed, and what was
    /// missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged: Option<Merged>,
}

/// The shards a merged run was made of.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Merged {
    pub shards: Vec<MergedShard>,
    /// Shards of the suite not given to the merge (`--allow-partial`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_shards: Vec<u32>,
    /// Shards whose run did not record every rollout it planned (`--allow-partial`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unfinished: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MergedShard {
    pub shard: crate::shard::Shard,
    pub dir: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub performance: Option<Performance>,
}

/// Counts, mean reward and pass@k of some rows: the run's, or one task's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Totals {
    pub counts: BTreeMap<String, usize>,
    pub trust: BTreeMap<String, usize>,
    pub mean_reward: Option<f64>,
    pub pass_at_k: BTreeMap<String, f64>,
    pub pass_hat_k: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskSummary {
    /// Rows of the task, any status.
    #[serde(default)]
    pub n: usize,
    #[serde(flatten)]
    pub totals: Totals,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub farm_version: String,
    #[serde(default)]
    pub accel: String,
    #[serde(default)]
    pub cores: usize,
    #[serde(default)]
    pub template_snapshot: String,
    /// For an image from a registry: the digest it resolved to, where from, and the
    /// reference an override replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pulled: Option<images::registry::Pulled>,
    /// The part of the suite the run holds (`farm run --shard`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<crate::shard::Shard>,
    /// What each Harbor task's environment was built from, by task id (images resolved,
    /// overrides, a `docker_image` that gave way to the Dockerfile and why).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub environments: std::collections::BTreeMap<String, crate::harbor::EnvironmentRecord>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Performance {
    pub rollouts: usize,
    pub concurrency: usize,
    pub wall_secs: f64,
    pub rollouts_per_sec: f64,
    pub fork: Option<PhaseTimes>,
    pub rollout: Option<PhaseTimes>,
    pub score: Option<PhaseTimes>,
    pub total: Option<PhaseTimes>,
    pub write_ms_total: f64,
    pub write_ms_per_rollout: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PhaseTimes {
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

impl Summary {
    /// Reads `DIR/summary.json`, if the run wrote one.
    pub fn load(dir: &std::path::Path) -> Option<Summary> {
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).ok()?).ok()
    }

    /// A count by status (0 when absent).
    pub fn count(&self, status: Status) -> usize {
        self.totals.counts.get(status.as_str()).copied().unwrap_or(0)
    }
}

fn counts(rs: &[&Outcome]) -> BTreeMap<String, usize> {
    let mut c: BTreeMap<String, usize> = Status::ALL.iter().map(|s| (s.to_string(), 0)).collect();
    for r in rs {
        *c.entry(r.status.to_string()).or_default() += 1;
    }
    c
}

/// How many verdicts of each trust level (rows without a verdict have none).
fn trust(rs: &[&Outcome]) -> BTreeMap<String, usize> {
    let mut c: BTreeMap<String, usize> = scorers::Trust::ALL.iter().map(|t| (t.to_string(), 0)).collect();
    for t in rs.iter().filter_map(|r| r.trust) {
        *c.entry(t.to_string()).or_default() += 1;
    }
    c
}

fn mean_reward(rs: &[&Outcome]) -> Option<f64> {
    let rewards: Vec<f64> = rs.iter().filter_map(|r| r.reward).collect();
    (!rewards.is_empty()).then(|| rewards.iter().sum::<f64>() / rewards.len() as f64)
}

/// Counts by status, mean reward, unbiased pass@k and pass^k per task and overall.
pub fn summary(rows: &[Outcome], samples: u32, planned: usize) -> Summary {
    let mut by_task: BTreeMap<&str, Vec<&Outcome>> = BTreeMap::new();
    for r in rows {
        by_task.entry(&r.task_id).or_default().push(r);
    }
    let max_k = samples.max(by_task.values().map(|v| v.len() as u32).max().unwrap_or(1));
    let mut tasks = BTreeMap::new();
    let mut pass_at: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    let mut pass_hat: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    for (task, rs) in &by_task {
        // Environment errors are not samples of the model: leave them out of n.
        let scored: Vec<&&Outcome> = rs.iter().filter(|r| r.status != Status::EnvError).collect();
        let n = scored.len() as u32;
        let c = scored.iter().filter(|r| r.status == Status::Passed).count() as u32;
        let mut totals = Totals {
            counts: counts(rs),
            trust: trust(rs),
            mean_reward: mean_reward(rs),
            ..Totals::default()
        };
        for k in (1..=max_k).filter(|k| *k <= n) {
            let (p, h) = (pass_at_k(n, c, k), pass_hat_k(n, c, k));
            totals.pass_at_k.insert(k.to_string(), p);
            totals.pass_hat_k.insert(k.to_string(), h);
            pass_at.entry(k).or_default().push(p);
            pass_hat.entry(k).or_default().push(h);
        }
        tasks.insert(task.to_string(), TaskSummary { n: rs.len(), totals });
    }
    let all: Vec<&Outcome> = rows.iter().collect();
    let avg = |m: &BTreeMap<u32, Vec<f64>>| -> BTreeMap<String, f64> {
        m.iter()
            .map(|(k, v)| (k.to_string(), v.iter().sum::<f64>() / v.len() as f64))
            .collect()
    };
    let totals = Totals {
        counts: counts(&all),
        trust: trust(&all),
        mean_reward: mean_reward(&all),
        pass_at_k: avg(&pass_at),
        pass_hat_k: avg(&pass_hat),
    };
    Summary {
        planned,
        finished: rows.len(),
        totals,
        tasks,
        provenance: None,
        performance: None,
        merged: None,
    }
}

/// Unbiased pass@k: 1 - C(n-c, k) / C(n, k).
pub fn pass_at_k(n: u32, c: u32, k: u32) -> f64 {
    if n - c < k {
        return 1.0;
    }
    1.0 - ((n - c - k + 1)..=(n - c))
        .zip((n - k + 1)..=n)
        .map(|(a, b)| a as f64 / b as f64)
        .product::<f64>()
}

/// pass^k: the chance that k samples drawn without replacement all pass, C(c, k) / C(n, k).
pub fn pass_hat_k(n: u32, c: u32, k: u32) -> f64 {
    if c < k {
        return 0.0;
    }
    ((c - k + 1)..=c)
        .zip((n - k + 1)..=n)
        .map(|(a, b)| a as f64 / b as f64)
        .product()
}

/// Throughput and per-phase times of the rollouts finished by this session (`write` is the
/// recorder's own time).
pub fn performance(
    rows: &[Outcome],
    wall: std::time::Duration,
    write: std::time::Duration,
    concurrency: usize,
) -> Performance {
    let phase = |f: fn(&Timings) -> f64| {
        let mut v: Vec<f64> = rows.iter().map(|r| f(&r.timings)).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        if v.is_empty() {
            return None;
        }
        let p = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Some(PhaseTimes {
            mean_ms: v.iter().sum::<f64>() / v.len() as f64,
            p50_ms: p(0.5),
            p99_ms: p(0.99),
        })
    };
    Performance {
        rollouts: rows.len(),
        concurrency,
        wall_secs: wall.as_secs_f64(),
        rollouts_per_sec: rows.len() as f64 / wall.as_secs_f64().max(1e-9),
        fork: phase(|t| t.fork_ms),
        rollout: phase(|t| t.rollout_ms),
        score: phase(|t| t.score_ms),
        total: phase(|t| t.total_ms),
        write_ms_total: write.as_secs_f64() * 1e3,
        write_ms_per_rollout: write.as_secs_f64() * 1e3 / rows.len().max(1) as f64,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::row::{Row, Step, StepKind};

    pub fn row(task: &str, sample: u32, status: &str) -> Row {
        Row {
            run_id: "r".into(),
            suite_name: "s".into(),
            suite_digest: "d".into(),
            task_digest: "t".into(),
            snapshot_id: "snap".into(),
            policy_name: "replay".into(),
            steps: vec![Step {
                exit_code: Some(0),
                ..Step::new(0, StepKind::Exec, "true")
            }],
            reward: (status != "env_error").then_some(if status == "passed" { 1.0 } else { 0.0 }),
            status: status.parse().unwrap(),
            farm_version: "0".into(),
            ..Row::blank(task, sample, 1)
        }
    }

    #[test]
    fn pass_at_k_matches_the_closed_form() {
        assert!((pass_at_k(10, 3, 1) - 0.3).abs() < 1e-12);
        assert_eq!(pass_at_k(5, 0, 3), 0.0);
        assert_eq!(pass_at_k(5, 3, 3), 1.0);
        // 1 - C(2,2)/C(4,2) = 1 - 1/6
        assert!((pass_at_k(4, 2, 2) - (1.0 - 1.0 / 6.0)).abs() < 1e-12);
        // C(2,2)/C(4,2) = 1/6
        assert!((pass_hat_k(4, 2, 2) - 1.0 / 6.0).abs() < 1e-12);
        assert_eq!(pass_hat_k(4, 4, 4), 1.0);
    }

    #[test]
    fn summary_counts_and_leaves_env_errors_out_of_pass_at_k() {
        for status in Status::ALL {
            assert_eq!(serde_json::to_value(status).unwrap(), status.as_str());
            assert_eq!(status.as_str().parse::<Status>(), Ok(status));
        }
        assert!("lost".parse::<Status>().is_err());
        let rows = [
            row("a", 0, "passed"),
            row("a", 1, "failed"),
            row("b", 0, "env_error"),
            row("b", 1, "passed"),
        ];
        let outcomes: Vec<Outcome> = rows.iter().map(Outcome::from).collect();
        let s = summary(&outcomes, 2, 4);
        assert_eq!(s.count(Status::Passed), 2);
        assert_eq!(s.count(Status::EnvError), 1);
        assert_eq!(s.tasks["a"].totals.pass_at_k["1"], 0.5);
        assert_eq!(s.tasks["b"].totals.pass_at_k["1"], 1.0);
        assert!(!s.tasks["b"].totals.pass_at_k.contains_key("2"));
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            (
                json["counts"]["passed"].as_u64(),
                json["tasks"]["a"]["pass_at_k"]["1"].as_f64()
            ),
            (Some(2), Some(0.5)),
            "the documented keys: {json}"
        );
        // What is written is what is read back.
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Summary>(&text).unwrap(), s);
        assert_eq!(
            serde_json::from_str::<Summary>("{}").unwrap(),
            Summary::default(),
            "an old or partial summary loads"
        );
    }
}
