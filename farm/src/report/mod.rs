//! `farm report RUN_DIR...`: a static HTML report of one run or several side by side.
//!
//! The report is `index.html` (leaderboard, per-task table with the runs' differences,
//! SVG charts drawn here, provenance) plus one page per run and task under `tasks/` with
//! every rollout of that task (steps, messages, answer, score details). Rows are read one
//! Arrow batch at a time with the writer's schema code ([`engine::recorder::read_rows`]);
//! only per-task counts and fixed-size histograms stay in memory, and each rollout's detail
//! is appended to its task's page as it is read, so the cost grows linearly with the rows.
//! Everything a rollout produced is HTML-escaped; the pages load nothing from the network.

mod render;
mod svg;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;

use engine::recorder::summary::{pass_at_k, pass_hat_k};
use engine::row::{Row, Status};

#[derive(Args)]
pub struct ReportArgs {
    /// Output folders of `farm run` or `farm serve` (one or more, shown side by side).
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// Where to write the report.
    #[arg(long, default_value = "report")]
    out: PathBuf,
    /// Open the report in a browser (xdg-open) when it is written.
    #[arg(long)]
    open: bool,
}

/// Phase-time histogram bins, upper bounds in milliseconds (the last bin is open).
pub const PHASE_BINS_MS: [f64; 9] = [10.0, 30.0, 100.0, 300.0, 1_000.0, 3_000.0, 10_000.0, 30_000.0, 100_000.0];

/// What a report keeps of one task of one run.
#[derive(Debug, Default, Clone)]
pub struct TaskStats {
    /// Rollouts, any status.
    pub rollouts: u32,
    /// Scored rollouts (not `env_error`): pass@k's n.
    pub scored: u32,
    pub passed: u32,
    pub reward_sum: f64,
    pub rewarded: u32,
    /// Verdicts whose trust level is `hardened` (the agent's code could reach them).
    pub hardened: u32,
    pub digest: String,
    /// This task's page of rollouts (`tasks/...html`), relative to the report.
    pub page: String,
}

/// One run, summarised.
#[derive(Debug, Default)]
pub struct RunStats {
    pub dir: PathBuf,
    pub label: String,
    pub run_id: String,
    pub suite_name: String,
    pub suite_digests: BTreeSet<String>,
    pub policy_name: String,
    pub policy_params: String,
    pub model: String,
    pub farm_versions: BTreeSet<String>,
    pub snapshot_ids: BTreeSet<String>,
    pub host: String,
    pub tasks: BTreeMap<String, TaskStats>,
    pub counts: BTreeMap<Status, u64>,
    /// Verdicts by trust level.
    pub trust: BTreeMap<scorers::Trust, u64>,
    pub rows: u64,
    /// Rewards in 10 bins of 0.1 (1.0 in the last).
    pub reward_bins: [u64; 10],
    /// fork, agent, score: counts per [`PHASE_BINS_MS`] bin (+1 open bin).
    pub phase_bins: [[u64; 10]; 3],
    /// When each rollout ended, milliseconds since the UNIX epoch.
    pub ends_ms: Vec<f64>,
    pub first_start_ms: Option<i64>,
    /// From summary.json when the run wrote one.
    pub rollouts_per_sec: Option<f64>,
    pub wall_secs: Option<f64>,
}

impl RunStats {
    /// Unbiased pass@k averaged over tasks with at least k scored rollouts.
    pub fn pass_at(&self, k: u32, hat: bool) -> Option<f64> {
        let values: Vec<f64> = self
            .tasks
            .values()
            .filter(|t| t.scored >= k)
            .map(|t| if hat { pass_hat_k(t.scored, t.passed, k) } else { pass_at_k(t.scored, t.passed, k) })
            .collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    }

    /// The largest k any task supports.
    pub fn max_k(&self) -> u32 {
        self.tasks.values().map(|t| t.scored).max().unwrap_or(0)
    }

    /// Mean reward over rewarded rollouts (as summary.json's `mean_reward`).
    pub fn mean_reward(&self) -> Option<f64> {
        let (sum, n) = self.tasks.values().fold((0.0, 0u32), |(s, n), t| (s + t.reward_sum, n + t.rewarded));
        (n > 0).then(|| sum / n as f64)
    }

    /// A 95 % bootstrap interval of the mean reward, resampling tasks (2,000 resamples,
    /// a fixed seed: the same run gives the same interval).
    pub fn reward_interval(&self) -> Option<(f64, f64)> {
        let tasks: Vec<(f64, u32)> = self.tasks.values().filter(|t| t.rewarded > 0).map(|t| (t.reward_sum, t.rewarded)).collect();
        if tasks.is_empty() {
            return None;
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut means: Vec<f64> = (0..2000)
            .map(|_| {
                let (mut sum, mut n) = (0.0, 0u64);
                for _ in 0..tasks.len() {
                    let (s, c) = tasks[(next() % tasks.len() as u64) as usize];
                    sum += s;
                    n += c as u64;
                }
                sum / n as f64
            })
            .collect();
        means.sort_by(|a, b| a.total_cmp(b));
        Some((means[(0.025 * means.len() as f64) as usize], means[((0.975 * means.len() as f64) as usize).min(means.len() - 1)]))
    }

    pub fn env_error_rate(&self) -> f64 {
        *self.counts.get(&Status::EnvError).unwrap_or(&0) as f64 / self.rows.max(1) as f64
    }

    /// Rollouts per second: from summary.json, or from the rows' own times.
    pub fn rate(&self) -> Option<f64> {
        self.rollouts_per_sec.or_else(|| self.span_secs().map(|s| self.rows as f64 / s.max(1e-3)))
    }

    /// Wall time: from summary.json, or first start to last end.
    pub fn wall(&self) -> Option<f64> {
        self.wall_secs.or_else(|| self.span_secs())
    }

    fn span_secs(&self) -> Option<f64> {
        let first = self.first_start_ms? as f64;
        let last = self.ends_ms.iter().cloned().fold(f64::NAN, f64::max);
        last.is_finite().then(|| (last - first) / 1e3)
    }
}

/// Appends rollouts to their task pages as they are read.
struct Pages {
    dir: PathBuf,
    /// page file -> whether its header is written.
    opened: HashMap<String, ()>,
}

impl Pages {
    fn append(&mut self, page: &str, run: &RunStats, task: &str, digest: &str, html: &str) -> Result<()> {
        let path = self.dir.join(page);
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path).with_context(|| format!("writing {}", path.display()))?;
        if self.opened.insert(page.to_string(), ()).is_none() {
            file.write_all(render::task_page_head(&run.label, task, digest).as_bytes())?;
        }
        file.write_all(html.as_bytes())?;
        Ok(())
    }

    fn close_all(&self) -> Result<()> {
        for page in self.opened.keys() {
            let mut file = std::fs::OpenOptions::new().append(true).open(self.dir.join(page))?;
            file.write_all(render::task_page_tail().as_bytes())?;
        }
        Ok(())
    }
}

/// Reads a run, writing its rollouts into task pages under `pages`.
fn read_run(index: usize, dir: &Path, pages: &mut Pages) -> Result<RunStats> {
    if !dir.exists() {
        bail!("{}: no such folder", dir.display());
    }
    let label = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| dir.display().to_string());
    let mut run = RunStats { dir: dir.to_path_buf(), label, host: "unknown".into(), ..Default::default() };
    let mut task_index: HashMap<String, usize> = HashMap::new();
    let manifest = engine::recorder::read_rows(dir, |row: Row| -> Result<()> {
        if run.rows == 0 {
            run.policy_name = row.policy_name.clone();
            run.policy_params = row.policy_params.clone();
            run.model = serde_json::from_str::<serde_json::Value>(&row.policy_params).ok().and_then(|p| p.get("model").and_then(|m| m.as_str()).map(String::from)).unwrap_or_default();
        }
        run.rows += 1;
        run.suite_digests.insert(row.suite_digest.clone());
        run.farm_versions.insert(row.farm_version.clone());
        if !row.snapshot_id.is_empty() {
            run.snapshot_ids.insert(row.snapshot_id.clone());
        }
        *run.counts.entry(row.status).or_default() += 1;
        if let Some(trust) = row.trust {
            *run.trust.entry(trust).or_default() += 1;
        }
        if let Some(r) = row.reward {
            run.reward_bins[((r.clamp(0.0, 1.0) * 10.0) as usize).min(9)] += 1;
        }
        let t = &row.timings;
        for (i, ms) in [t.fork_ms, t.rollout_ms, t.score_ms].into_iter().enumerate() {
            if ms > 0.0 {
                let bin = PHASE_BINS_MS.iter().position(|b| ms < *b).unwrap_or(PHASE_BINS_MS.len());
                run.phase_bins[i][bin] += 1;
            }
        }
        run.ends_ms.push(row.started_at_ms as f64 + t.total_ms);
        run.first_start_ms = Some(run.first_start_ms.map_or(row.started_at_ms, |f| f.min(row.started_at_ms)));
        let next = task_index.len();
        let n = *task_index.entry(row.task_id.clone()).or_insert(next);
        let stats = run.tasks.entry(row.task_id.clone()).or_default();
        stats.rollouts += 1;
        if row.status != Status::EnvError {
            stats.scored += 1;
        }
        if row.status == Status::Passed {
            stats.passed += 1;
        }
        if let Some(r) = row.reward {
            stats.reward_sum += r;
            stats.rewarded += 1;
        }
        if row.trust == Some(scorers::Trust::Hardened) {
            stats.hardened += 1;
        }
        stats.digest = row.task_digest.clone();
        stats.page = format!("tasks/r{index}-t{n}.html");
        let page = stats.page.clone();
        let digest = stats.digest.clone();
        pages.append(&page, &run, &row.task_id, &digest, &render::rollout(&row))
    })?;
    run.run_id = manifest.run_id.clone();
    run.suite_name = manifest.suite_name.clone();
    if let Ok(text) = std::fs::read_to_string(dir.join("summary.json")) {
        if let Ok(summary) = serde_json::from_str::<serde_json::Value>(&text) {
            run.rollouts_per_sec = summary["performance"]["rollouts_per_sec"].as_f64();
            run.wall_secs = summary["performance"]["wall_secs"].as_f64();
            if let Some(host) = summary["provenance"]["host"].as_str() {
                run.host = host.to_string();
            }
        }
    }
    Ok(run)
}

pub async fn run(args: ReportArgs) -> Result<i32> {
    let out = &args.out;
    let tasks_dir = out.join("tasks");
    if tasks_dir.exists() {
        std::fs::remove_dir_all(&tasks_dir).with_context(|| format!("clearing {}", tasks_dir.display()))?;
    }
    std::fs::create_dir_all(&tasks_dir).with_context(|| format!("creating {}", tasks_dir.display()))?;
    let started = std::time::Instant::now();
    let mut pages = Pages { dir: out.clone(), opened: HashMap::new() };
    let mut runs = Vec::new();
    for (i, dir) in args.runs.iter().enumerate() {
        let mut run = read_run(i, dir, &mut pages).context("report")?;
        if runs.iter().any(|r: &RunStats| r.label == run.label) {
            run.label = format!("{} ({})", run.label, i + 1);
        }
        eprintln!("farm: read {} ({} rollouts, {} tasks)", dir.display(), run.rows, run.tasks.len());
        runs.push(run);
    }
    pages.close_all()?;
    let index = out.join("index.html");
    std::fs::write(&index, render::index(&runs)).with_context(|| format!("writing {}", index.display()))?;
    eprintln!("farm: report written to {} in {:.1} s", index.display(), started.elapsed().as_secs_f64());
    crate::outln!("{}", index.display());
    if args.open {
        if let Err(e) = std::process::Command::new("xdg-open").arg(&index).spawn() {
            eprintln!("farm: could not open a browser ({e}); open {} yourself", index.display());
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_at_k_mean_reward_and_its_interval() {
        let mut run = RunStats::default();
        run.tasks.insert("a".into(), TaskStats { rollouts: 2, scored: 2, passed: 1, reward_sum: 1.0, rewarded: 2, ..Default::default() });
        run.tasks.insert("b".into(), TaskStats { rollouts: 2, scored: 2, passed: 2, reward_sum: 2.0, rewarded: 2, ..Default::default() });
        assert_eq!(run.pass_at(1, false), Some(0.75));
        assert_eq!(run.pass_at(2, false), Some(1.0));
        assert_eq!(run.pass_at(2, true), Some(0.5));
        assert_eq!(run.pass_at(3, false), None);
        assert_eq!(run.mean_reward(), Some(0.75));
        let (low, high) = run.reward_interval().unwrap();
        assert!((0.5..=0.75).contains(&low) && (0.75..=1.0).contains(&high), "{low} {high}");
        assert_eq!(run.reward_interval(), Some((low, high)), "the same run gives the same interval");
    }
}
