//! `farm report RUN_DIR...`: a static HTML report of one run or several side by side.
//!
//! The report is `index.html` (leaderboard, per-task table with the runs' differences,
//! SVG charts drawn here, provenance) plus one page per run and task under `tasks/` with
//! every rollout of that task (steps, messages, answer, score details). Rows are read one
//! Arrow batch at a time with the writer's schema code ([`engine::recorder::read_rows`]);
//! only per-task counts and fixed-size histograms stay in memory, and each rollout's detail
//! is appended to its task's page as it is read, so the cost grows linearly with the rows.
//! The HTML comes from `maud` templates, which escape every string spliced into them, so
//! nothing a rollout produced can become markup; the pages load nothing from the network.
//!
//! Files: `page.rs` (the page shell and text helpers), `index.rs` (the front page),
//! `rollout.rs` (task pages), `svg.rs` (charts).

mod index;
mod page;
mod rollout;
mod svg;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Deserialize;

use engine::recorder::summary::{pass_at_k, pass_hat_k, Summary};
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
pub const PHASE_BINS_MS: [f64; 9] = [
    10.0, 30.0, 100.0, 300.0, 1_000.0, 3_000.0, 10_000.0, 30_000.0, 100_000.0,
];

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
    /// What each Harbor task's environment was built from (summary.json's provenance).
    pub environments: BTreeMap<String, engine::harbor::EnvironmentRecord>,
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
    /// Counts one rollout in; returns its task's page. The run's policy, suite and id are
    /// taken from its first row (the manifest's suite and id replace them when read).
    pub fn add(&mut self, index: usize, row: &Row) -> &TaskStats {
        if self.rows == 0 {
            self.policy_name = row.policy_name.clone();
            self.policy_params = row.policy_params.clone();
            self.model = serde_json::from_str::<PolicyParams>(&row.policy_params)
                .ok()
                .and_then(|p| p.model)
                .unwrap_or_default();
            self.run_id = row.run_id.clone();
            self.suite_name = row.suite_name.clone();
        }
        self.rows += 1;
        self.suite_digests.insert(row.suite_digest.clone());
        self.farm_versions.insert(row.farm_version.clone());
        if !row.snapshot_id.is_empty() {
            self.snapshot_ids.insert(row.snapshot_id.clone());
        }
        *self.counts.entry(row.status).or_default() += 1;
        if let Some(trust) = row.trust {
            *self.trust.entry(trust).or_default() += 1;
        }
        if let Some(r) = row.reward {
            self.reward_bins[((r.clamp(0.0, 1.0) * 10.0) as usize).min(9)] += 1;
        }
        let t = &row.timings;
        for (i, ms) in [t.fork_ms, t.rollout_ms, t.score_ms].into_iter().enumerate() {
            if ms > 0.0 {
                let bin = PHASE_BINS_MS
                    .iter()
                    .position(|b| ms < *b)
                    .unwrap_or(PHASE_BINS_MS.len());
                self.phase_bins[i][bin] += 1;
            }
        }
        self.ends_ms.push(row.started_at_ms as f64 + t.total_ms);
        self.first_start_ms = Some(
            self.first_start_ms
                .map_or(row.started_at_ms, |f| f.min(row.started_at_ms)),
        );
        let task_number = self.tasks.len();
        let stats = self.tasks.entry(row.task_id.clone()).or_insert_with(|| TaskStats {
            page: format!("tasks/r{index}-t{task_number}.html"),
            ..Default::default()
        });
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
        stats
    }

    /// Unbiased pass@k averaged over tasks with at least k scored rollouts.
    pub fn pass_at(&self, k: u32, hat: bool) -> Option<f64> {
        let values: Vec<f64> = self
            .tasks
            .values()
            .filter(|t| t.scored >= k)
            .map(|t| {
                if hat {
                    pass_hat_k(t.scored, t.passed, k)
                } else {
                    pass_at_k(t.scored, t.passed, k)
                }
            })
            .collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    }

    /// The largest k any task supports.
    pub fn max_k(&self) -> u32 {
        self.tasks.values().map(|t| t.scored).max().unwrap_or(0)
    }

    /// Mean reward over rewarded rollouts (as summary.json's `mean_reward`).
    pub fn mean_reward(&self) -> Option<f64> {
        let (sum, n) = self
            .tasks
            .values()
            .fold((0.0, 0u32), |(s, n), t| (s + t.reward_sum, n + t.rewarded));
        (n > 0).then(|| sum / n as f64)
    }

    /// A 95 % bootstrap interval of the mean reward, resampling tasks (2,000 resamples,
    /// a fixed seed: the same run gives the same interval).
    pub fn reward_interval(&self) -> Option<(f64, f64)> {
        let tasks: Vec<(f64, u32)> = self
            .tasks
            .values()
            .filter(|t| t.rewarded > 0)
            .map(|t| (t.reward_sum, t.rewarded))
            .collect();
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
        Some((
            means[(0.025 * means.len() as f64) as usize],
            means[((0.975 * means.len() as f64) as usize).min(means.len() - 1)],
        ))
    }

    pub fn env_error_rate(&self) -> f64 {
        *self.counts.get(&Status::EnvError).unwrap_or(&0) as f64 / self.rows.max(1) as f64
    }

    /// Rollouts per second: from summary.json, or from the rows' own times.
    pub fn rate(&self) -> Option<f64> {
        self.rollouts_per_sec
            .or_else(|| self.span_secs().map(|s| self.rows as f64 / s.max(1e-3)))
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
    /// Pages whose start is written.
    opened: HashSet<String>,
}

impl Pages {
    fn append(&mut self, page: &str, run_label: &str, task: &str, digest: &str, html: &str) -> Result<()> {
        let path = self.dir.join(page);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("writing {}", path.display()))?;
        if self.opened.insert(page.to_string()) {
            file.write_all(rollout::task_page_start(run_label, task, digest).as_bytes())?;
        }
        file.write_all(html.as_bytes())
            .with_context(|| format!("writing {}", path.display()))
    }

    fn close_all(&self) -> Result<()> {
        for page in &self.opened {
            let path = self.dir.join(page);
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .with_context(|| format!("writing {}", path.display()))?;
            file.write_all(rollout::PAGE_END.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    }
}

/// What the report reads of `policy_params`.
#[derive(Deserialize)]
struct PolicyParams {
    model: Option<String>,
}

/// A run's summary.json, when it wrote one (the engine's own type: every field may be
/// missing, so a summary of an older farm, or of an unfinished run, still loads). One that
/// does not read is named and left out: the rows' own times stand in for its numbers.
fn read_summary(dir: &Path) -> Summary {
    let path = dir.join("summary.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Summary::default();
    };
    serde_json::from_str(&text).unwrap_or_else(|e| {
        eprintln!("farm: {}: {e}; using the rows' own times instead", path.display());
        Summary::default()
    })
}

/// A run's label: its folder's name, numbered when an earlier run has the same.
fn label(index: usize, dir: &Path, earlier: &[RunStats]) -> String {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string());
    if earlier.iter().any(|r| r.label == name) {
        format!("{name} ({})", index + 1)
    } else {
        name
    }
}

/// Reads a run, writing its rollouts into task pages under `pages`.
fn read_run(index: usize, dir: &Path, label: String, pages: &mut Pages) -> Result<RunStats> {
    if !dir.exists() {
        bail!("{}: no such folder", dir.display());
    }
    let mut run = RunStats {
        dir: dir.to_path_buf(),
        label,
        host: "unknown".into(),
        ..Default::default()
    };
    let manifest = engine::recorder::read_rows(dir, |row: Row| -> Result<()> {
        let task = run.add(index, &row);
        let (page, digest) = (task.page.clone(), task.digest.clone());
        pages.append(&page, &run.label, &row.task_id, &digest, &rollout::rollout(&row))
    })?;
    run.run_id = manifest.run_id.clone();
    run.suite_name = manifest.suite_name.clone();
    let summary = read_summary(dir);
    if let Some(performance) = summary.performance {
        run.rollouts_per_sec = Some(performance.rollouts_per_sec);
        run.wall_secs = Some(performance.wall_secs);
    }
    if let Some(provenance) = summary.provenance {
        if !provenance.host.is_empty() {
            run.host = provenance.host;
        }
        run.environments = provenance.environments;
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
    let mut pages = Pages {
        dir: out.clone(),
        opened: HashSet::new(),
    };
    let mut runs = Vec::new();
    for (i, dir) in args.runs.iter().enumerate() {
        let run = read_run(i, dir, label(i, dir, &runs), &mut pages).context("report")?;
        eprintln!(
            "farm: read {} ({} rollouts, {} tasks)",
            dir.display(),
            run.rows,
            run.tasks.len()
        );
        runs.push(run);
    }
    pages.close_all()?;
    let index = out.join("index.html");
    std::fs::write(&index, index::index(&runs)).with_context(|| format!("writing {}", index.display()))?;
    eprintln!(
        "farm: report written to {} in {:.1} s",
        index.display(),
        started.elapsed().as_secs_f64()
    );
    crate::ui::outln!("{}", index.display());
    if args.open {
        if let Err(e) = std::process::Command::new("xdg-open").arg(&index).spawn() {
            eprintln!(
                "farm: could not open a browser ({e}); open {} yourself",
                index.display()
            );
        }
    }
    Ok(0)
}
