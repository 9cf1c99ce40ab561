//! Run output: trajectory rows, the crash-safe journal, Parquet parts, the manifest and the
//! summary.
//!
//! ```text
//! DIR/
//!   manifest.json            run id, suite digest, parts written, journal bytes consumed
//!   journal.jsonl            every finished rollout, appended and fsynced as it ends
//!   trajectories/part-00000.parquet   rows (zstd), written atomically (temp, fsync, rename)
//!   summary.json             counts by status, mean reward, pass@k, pass^k
//! ```
//!
//! A finished rollout is durable once its journal line is synced. Parts are made from the
//! journal; the manifest (replaced atomically) is the commit point that says which journal
//! bytes are already in parts, so a crash at any moment loses only in-flight rollouts and a
//! resume never duplicates a row.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// One rollout, one row. Field by field in `docs/output.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub run_id: String,
    pub suite_name: String,
    pub suite_digest: String,
    pub task_id: String,
    pub task_digest: String,
    pub sample_index: u32,
    pub seed: u64,
    pub snapshot_id: String,
    pub policy_name: String,
    /// JSON object.
    pub policy_params: String,
    pub steps: Vec<Step>,
    /// JSON array of chat messages (empty for replay).
    pub messages: String,
    pub usage: Usage,
    pub reward: Option<f64>,
    pub status: Status,
    pub error: Option<String>,
    /// JSON object: what the verdict rests on.
    pub score_details: String,
    /// How far the verdict can be trusted: `sound` (the agent's code could not reach it) or
    /// `hardened` (it ran where the verdict is made); null when there is no verdict.
    #[serde(default)]
    pub trust: Option<scorers::Trust>,
    /// Why the verdict has that trust level.
    #[serde(default)]
    pub trust_reason: Option<String>,
    pub attempts: u32,
    pub timings: Timings,
    /// Milliseconds since the UNIX epoch.
    pub started_at_ms: i64,
    pub farm_version: String,
    /// `farm serve` only (null in `farm run`): the rollout's id, its group (one submitted
    /// item's `n` samples), the trainer's policy version and the item's metadata (JSON text).
    #[serde(default)]
    pub rollout_id: Option<String>,
    #[serde(default)]
    pub group_id: Option<String>,
    #[serde(default)]
    pub policy_version: Option<u64>,
    #[serde(default)]
    pub metadata: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub index: u32,
    /// exec | write_file | submit
    pub kind: String,
    pub text: String,
    pub stdout: String,
    pub stderr: String,
    pub exit_code: Option<i32>,
    pub started_at_ms: i64,
    pub duration_ms: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub total_tokens: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    pub fork_ms: f64,
    pub rollout_ms: f64,
    pub score_ms: f64,
    pub total_ms: f64,
}

/// How a rollout ended; written as `passed`, `failed`, `timeout` or `env_error`.
/// (The Parquet column is a plain string: see [`schema`].)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Scored, and the reward reached the pass threshold.
    Passed,
    /// Scored below the threshold, or the agent's own doing ended it (reward 0).
    Failed,
    /// The rollout or its tests ran past their limit (reward 0).
    Timeout,
    /// The farm, not the agent, failed: no reward (never a zero a trainer could mistake for
    /// a failure), left out of pass@k.
    EnvError,
}

impl Status {
    pub const ALL: [Status; 4] = [Status::Passed, Status::Failed, Status::Timeout, Status::EnvError];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Passed => "passed",
            Status::Failed => "failed",
            Status::Timeout => "timeout",
            Status::EnvError => "env_error",
        }
    }
}

impl std::str::FromStr for Status {
    type Err = String;

    fn from_str(text: &str) -> Result<Status, String> {
        Status::ALL.into_iter().find(|s| s.as_str() == text).ok_or_else(|| format!("expected passed, failed, timeout or env_error, got {text:?}"))
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Row {
    /// A row of task `task_id`, sample `sample_index`, before anything was recorded: status
    /// `env_error` with no reward, no steps, empty texts; callers fill in the rest.
    pub fn blank(task_id: &str, sample_index: u32, seed: u64) -> Row {
        Row {
            run_id: String::new(),
            suite_name: String::new(),
            suite_digest: String::new(),
            task_id: task_id.to_string(),
            task_digest: String::new(),
            sample_index,
            seed,
            snapshot_id: String::new(),
            policy_name: String::new(),
            policy_params: "{}".into(),
            steps: Vec::new(),
            messages: "[]".into(),
            usage: Usage::default(),
            reward: None,
            status: Status::EnvError,
            error: None,
            score_details: "{}".into(),
            trust: None,
            trust_reason: None,
            attempts: 1,
            timings: Timings::default(),
            started_at_ms: 0,
            farm_version: env!("CARGO_PKG_VERSION").to_string(),
            rollout_id: None,
            group_id: None,
            policy_version: None,
            metadata: None,
        }
    }

    /// What makes a row unique in its output folder: the rollout id (`farm serve`), else the
    /// task and sample (`farm run`).
    pub fn key(&self) -> String {
        match &self.rollout_id {
            Some(id) => id.clone(),
            None => plan_key(&self.task_id, self.sample_index),
        }
    }
}

/// The key of `farm run`'s rollout of `task`, sample `sample`.
pub fn plan_key(task: &str, sample: u32) -> String {
    format!("{task}\u{0}{sample}")
}

/// What the summary needs of a row; the writer keeps only this for the whole run, so memory
/// does not grow with the rollouts' output.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// [`Row::key`].
    pub key: String,
    pub task_id: String,
    pub task_digest: String,
    pub sample_index: u32,
    pub status: Status,
    pub reward: Option<f64>,
    pub trust: Option<scorers::Trust>,
    pub timings: Timings,
}

impl From<&Row> for Outcome {
    fn from(r: &Row) -> Outcome {
        Outcome {
            key: r.key(),
            task_id: r.task_id.clone(),
            task_digest: r.task_digest.clone(),
            sample_index: r.sample_index,
            status: r.status,
            reward: r.reward,
            trust: r.trust,
            timings: r.timings.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format_version: u32,
    pub run_id: String,
    pub suite_name: String,
    pub suite_digest: String,
    pub parts: Vec<PartRecord>,
    /// Bytes of the journal already written into parts.
    pub journal_bytes_in_parts: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartRecord {
    pub file: String,
    pub rows: usize,
}

/// Writes rows durably and turns them into Parquet parts.
pub struct OutputWriter {
    dir: PathBuf,
    manifest: Manifest,
    journal: std::fs::File,
    /// Rows in the journal not yet in a part.
    pending: Vec<Row>,
    journal_len: u64,
    rows_per_part: usize,
    schema: Arc<arrow_schema::Schema>,
    /// Every row's [`Row::key`] so far, in parts or pending.
    done: BTreeSet<String>,
    /// Where each row's line is in the journal (offset, length), in order: row `i` of the
    /// journal is `farm serve`'s cursor `i`.
    lines: Vec<(u64, u64)>,
    /// Every finished rollout of this run (for the summary), in parts or pending.
    all: Vec<Outcome>,
}

fn schema() -> Result<Arc<arrow_schema::Schema>> {
    use serde_arrow::schema::{SchemaLike, TracingOptions};
    let options = TracingOptions::default()
        .allow_null_fields(true)
        .strings_as_large_utf8(false)
        .sequence_as_large_list(false)
        // The status is an enum in Rust and a plain string column in the files.
        .overwrite("status", serde_json::json!({ "name": "status", "data_type": "Utf8" }))
        .context("the status column")?
        .overwrite("trust", serde_json::json!({ "name": "trust", "data_type": "Utf8", "nullable": true }))
        .context("the trust column")?;
    let fields = Vec::<arrow_schema::FieldRef>::from_type::<Row>(options).context("deriving the Parquet schema")?;
    Ok(Arc::new(arrow_schema::Schema::new(fields)))
}

impl OutputWriter {
    /// Opens `dir` for a run: a new one, or (with `resume`) the unfinished run of the same
    /// suite. Returns the writer and the keys already done.
    pub fn open(dir: &Path, run_id: &str, suite_name: &str, suite_digest: &str, resume: bool, rows_per_part: usize) -> Result<OutputWriter> {
        let manifest_path = dir.join("manifest.json");
        let existing = manifest_path.exists();
        if existing && !resume {
            bail!(
                "output folder {} already holds a run (manifest.json): pass --resume to finish it, or choose another --out",
                dir.display()
            );
        }
        std::fs::create_dir_all(dir.join("trajectories")).with_context(|| format!("creating {}", dir.display()))?;
        let manifest = if existing {
            let m: Manifest = serde_json::from_str(&std::fs::read_to_string(&manifest_path)?)
                .with_context(|| format!("{} is not a farm run manifest", manifest_path.display()))?;
            if m.suite_digest != suite_digest {
                bail!(
                    "{} was written by a different version of the suite (digest {} vs {}); resume needs the same suite file",
                    dir.display(),
                    &m.suite_digest[..12.min(m.suite_digest.len())],
                    &suite_digest[..12.min(suite_digest.len())]
                );
            }
            m
        } else {
            Manifest {
                format_version: 1,
                run_id: run_id.to_string(),
                suite_name: suite_name.to_string(),
                suite_digest: suite_digest.to_string(),
                parts: Vec::new(),
                journal_bytes_in_parts: 0,
            }
        };
        // Parts not in the manifest were written by a run that died before committing them:
        // their rows are still in the journal.
        let listed: BTreeSet<&str> = manifest.parts.iter().map(|p| p.file.as_str()).collect();
        for entry in std::fs::read_dir(dir.join("trajectories"))?.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let ours = name.starts_with("part-") && (name.ends_with(".parquet") || name.ends_with(".parquet.tmp"));
            if ours && !listed.contains(format!("trajectories/{name}").as_str()) {
                std::fs::remove_file(entry.path())?;
            }
        }
        let journal_path = dir.join("journal.jsonl");
        let (all, pending, lines, journal_len) = read_journal(&journal_path, manifest.journal_bytes_in_parts)?;
        if journal_len < manifest.journal_bytes_in_parts {
            bail!(
                "{}: journal.jsonl holds {journal_len} bytes but the manifest says {} are already in parts; \
                 the output folder was changed by hand: start a new run in another folder",
                dir.display(),
                manifest.journal_bytes_in_parts
            );
        }
        let journal = std::fs::OpenOptions::new().create(true).append(true).open(&journal_path)?;
        // Drop a torn last line (a crash mid-write) so new lines start clean.
        journal.set_len(journal_len)?;
        let done = all.iter().map(|o: &Outcome| o.key.clone()).collect();
        let writer = OutputWriter { dir: dir.to_path_buf(), manifest, journal, pending, journal_len, rows_per_part, schema: schema()?, done, lines, all };
        writer.save_manifest()?;
        Ok(writer)
    }

    /// The Parquet schema of rows.
    pub fn schema(&self) -> Arc<arrow_schema::Schema> {
        self.schema.clone()
    }

    pub fn run_id(&self) -> &str {
        &self.manifest.run_id
    }

    pub fn done(&self) -> &BTreeSet<String> {
        &self.done
    }

    /// Rows recorded so far (journal lines).
    pub fn rows(&self) -> usize {
        self.lines.len()
    }

    /// The journal lines of rows `from..from + max` (each a JSON row, without its newline).
    pub fn read_lines(&self, from: usize, max: usize) -> Result<Vec<Vec<u8>>> {
        read_lines_at(&self.journal_path(), &self.line_index(from, max, u64::MAX))
    }

    pub fn journal_path(&self) -> PathBuf {
        self.dir.join("journal.jsonl")
    }

    /// Where rows `from..from + max` are in the journal, stopping before `max_bytes` (one row
    /// at least); read them with [`read_lines_at`] without holding the writer.
    pub fn line_index(&self, from: usize, max: usize, max_bytes: u64) -> Vec<(u64, u64)> {
        let mut total = 0;
        let mut out = Vec::new();
        for &(offset, len) in self.lines.iter().skip(from).take(max) {
            if !out.is_empty() && total + len > max_bytes {
                break;
            }
            total += len;
            out.push((offset, len));
        }
        out
    }


    pub fn outcomes(&self) -> &[Outcome] {
        &self.all
    }

    /// Records a finished rollout durably; writes a part when enough rows are pending.
    pub fn append(&mut self, row: Row) -> Result<()> {
        if !self.done.insert(row.key()) {
            bail!("rollout {:?} sample {} was recorded twice", row.task_id, row.sample_index);
        }
        let mut line = serde_json::to_vec(&row)?;
        line.push(b'\n');
        if let Err(e) = self.journal.write_all(&line).and_then(|_| self.journal.sync_data()) {
            // Nothing half-written stays: the next row starts where this one would have.
            self.done.remove(&row.key());
            let _ = self.journal.set_len(self.journal_len);
            return Err(anyhow::Error::new(e).context("appending to journal.jsonl"));
        }
        self.lines.push((self.journal_len, line.len() as u64));
        self.journal_len += line.len() as u64;
        self.all.push(Outcome::from(&row));
        self.pending.push(row);
        if self.pending.len() >= self.rows_per_part {
            // The row is durable in the journal; a part that cannot be written now is
            // written by a later flush (or made from the journal on resume).
            if let Err(e) = self.flush() {
                eprintln!("farm: writing a Parquet part failed (the rows are safe in journal.jsonl): {e:#}");
            }
        }
        Ok(())
    }

    /// Writes pending rows as a Parquet part and commits it in the manifest.
    pub fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let name = format!("trajectories/part-{:05}.parquet", self.manifest.parts.len());
        let path = self.dir.join(&name);
        let tmp = self.dir.join(format!("{name}.tmp"));
        write_parquet(&tmp, &self.schema, &self.pending).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path)?;
        sync_dir(&self.dir.join("trajectories"));
        self.manifest.parts.push(PartRecord { file: name, rows: self.pending.len() });
        self.manifest.journal_bytes_in_parts = self.journal_len;
        self.save_manifest()?;
        self.pending.clear();
        Ok(())
    }

    fn save_manifest(&self) -> Result<()> {
        let tmp = self.dir.join("manifest.json.tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(serde_json::to_string_pretty(&self.manifest)?.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.dir.join("manifest.json"))?;
        sync_dir(&self.dir);
        Ok(())
    }

    pub fn write_summary(&self, summary: &serde_json::Value) -> Result<()> {
        let tmp = self.dir.join("summary.json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(summary)?)?;
        std::fs::rename(&tmp, self.dir.join("summary.json"))?;
        Ok(())
    }
}

/// Journal lines at (offset, length), each without its newline.
pub fn read_lines_at(journal: &Path, index: &[(u64, u64)]) -> Result<Vec<Vec<u8>>> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(journal)?;
    let mut out = Vec::with_capacity(index.len());
    for &(offset, len) in index {
        let mut line = vec![0u8; len as usize];
        file.read_exact_at(&mut line, offset)?;
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        out.push(line);
    }
    Ok(out)
}

/// Every row of the run in `dir`, in the order recorded: the Parquet parts the manifest
/// lists, then the journal's rows not yet in a part. Rows are handed to `each` one Arrow
/// batch at a time, so memory does not grow with the run.
pub fn read_rows(dir: &Path, mut each: impl FnMut(Row) -> Result<()>) -> Result<Manifest> {
    let manifest_path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&manifest_path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound if dir.is_dir() => anyhow::anyhow!("{}: not a farm run (no manifest.json)", dir.display()),
        std::io::ErrorKind::NotFound => anyhow::anyhow!("{}: no such folder", dir.display()),
        _ => anyhow::anyhow!("{}: {e}", manifest_path.display()),
    })?;
    let manifest: Manifest = serde_json::from_str(&text).with_context(|| format!("{} is not a farm run manifest", manifest_path.display()))?;
    for part in &manifest.parts {
        let path = dir.join(&part.file);
        let file = std::fs::File::open(&path).with_context(|| format!("{}: listed in the manifest", path.display()))?;
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.with_batch_size(1024).build())
            .with_context(|| format!("{}: not a Parquet file", path.display()))?;
        for batch in reader {
            let batch = batch.with_context(|| format!("reading {}", path.display()))?;
            let rows: Vec<Row> = serde_arrow::from_record_batch(&batch).with_context(|| format!("{}: rows do not match farm's schema", path.display()))?;
            for row in rows {
                each(row)?;
            }
        }
    }
    let (_, pending, _, _) = read_journal(&dir.join("journal.jsonl"), manifest.journal_bytes_in_parts)?;
    for row in pending {
        each(row)?;
    }
    Ok(manifest)
}

fn sync_dir(dir: &Path) {
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.sync_all();
    }
}

/// Reads the journal: the outcomes of all complete rows, the rows after `in_parts` bytes,
/// and the length up to the last complete line.
type Journal = (Vec<Outcome>, Vec<Row>, Vec<(u64, u64)>, u64);

fn read_journal(path: &Path, in_parts: u64) -> Result<Journal> {
    let Ok(file) = std::fs::File::open(path) else { return Ok((Vec::new(), Vec::new(), Vec::new(), 0)) };
    let mut reader = std::io::BufReader::new(file);
    let (mut all, mut pending, mut lines, mut offset) = (Vec::new(), Vec::new(), Vec::new(), 0u64);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 || line.last() != Some(&b'\n') {
            break; // end, or a torn last line
        }
        let row: Row = match serde_json::from_slice(&line) {
            Ok(row) => row,
            Err(_) => break,
        };
        all.push(Outcome::from(&row));
        if offset >= in_parts {
            pending.push(row);
        }
        lines.push((offset, n as u64));
        offset += n as u64;
    }
    Ok((all, pending, lines, offset))
}

fn write_parquet(path: &Path, schema: &Arc<arrow_schema::Schema>, rows: &[Row]) -> Result<()> {
    use parquet::basic::{Compression, ZstdLevel};
    use parquet::file::properties::WriterProperties;
    let batch = serde_arrow::to_record_batch(schema.fields(), &rows).context("converting rows to Arrow")?;
    if batch.schema().fields() != schema.fields() {
        bail!("row batch schema {:?} differs from the output schema {:?}", batch.schema(), schema);
    }
    let props = WriterProperties::builder().set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?)).build();
    let file = std::fs::File::create(path)?;
    let mut writer = parquet::arrow::ArrowWriter::try_new(file.try_clone()?, schema.clone(), Some(props))?;
    writer.write(&batch)?;
    writer.close()?;
    file.sync_all()?;
    Ok(())
}

/// Counts by status, mean reward, unbiased pass@k and pass^k per task and overall.
pub fn summary(rows: &[Outcome], samples: u32, planned: usize) -> serde_json::Value {
    let mut by_task: BTreeMap<&str, Vec<&Outcome>> = BTreeMap::new();
    for r in rows {
        by_task.entry(&r.task_id).or_default().push(r);
    }
    let counts = |rs: &[&Outcome]| -> BTreeMap<String, usize> {
        let mut c: BTreeMap<String, usize> = Status::ALL.iter().map(|s| (s.to_string(), 0)).collect();
        for r in rs {
            *c.entry(r.status.to_string()).or_default() += 1;
        }
        c
    };
    // How many verdicts of each trust level (rows without a verdict have none).
    let trust = |rs: &[&Outcome]| -> BTreeMap<&'static str, usize> {
        let mut c: BTreeMap<&'static str, usize> = [scorers::Trust::Sound, scorers::Trust::Hardened].iter().map(|t| (t.as_str(), 0)).collect();
        for t in rs.iter().filter_map(|r| r.trust) {
            *c.entry(t.as_str()).or_default() += 1;
        }
        c
    };
    let mean_reward = |rs: &[&Outcome]| {
        let rewards: Vec<f64> = rs.iter().filter_map(|r| r.reward).collect();
        if rewards.is_empty() {
            None
        } else {
            Some(rewards.iter().sum::<f64>() / rewards.len() as f64)
        }
    };
    let max_k = samples.max(by_task.values().map(|v| v.len() as u32).max().unwrap_or(1));
    let mut tasks = serde_json::Map::new();
    let mut pass_at: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    let mut pass_hat: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    for (task, rs) in &by_task {
        // Environment errors are not samples of the model: leave them out of n.
        let scored: Vec<&&Outcome> = rs.iter().filter(|r| r.status != Status::EnvError).collect();
        let n = scored.len() as u32;
        let c = scored.iter().filter(|r| r.status == Status::Passed).count() as u32;
        let mut at = serde_json::Map::new();
        let mut hat = serde_json::Map::new();
        for k in 1..=max_k {
            if k <= n {
                let p = pass_at_k(n, c, k);
                let h = pass_hat_k(n, c, k);
                at.insert(k.to_string(), p.into());
                hat.insert(k.to_string(), h.into());
                pass_at.entry(k).or_default().push(p);
                pass_hat.entry(k).or_default().push(h);
            }
        }
        tasks.insert(
            task.to_string(),
            serde_json::json!({ "n": rs.len(), "counts": counts(rs), "trust": trust(rs), "mean_reward": mean_reward(rs), "pass_at_k": at, "pass_hat_k": hat }),
        );
    }
    let all: Vec<&Outcome> = rows.iter().collect();
    let avg = |m: &BTreeMap<u32, Vec<f64>>| -> serde_json::Map<String, serde_json::Value> {
        m.iter().map(|(k, v)| (k.to_string(), (v.iter().sum::<f64>() / v.len() as f64).into())).collect()
    };
    serde_json::json!({
        "planned": planned,
        "finished": rows.len(),
        "counts": counts(&all),
        "trust": trust(&all),
        "mean_reward": mean_reward(&all),
        "pass_at_k": avg(&pass_at),
        "pass_hat_k": avg(&pass_hat),
        "tasks": tasks,
    })
}

/// Unbiased pass@k: 1 - C(n-c, k) / C(n, k).
pub fn pass_at_k(n: u32, c: u32, k: u32) -> f64 {
    if n - c < k {
        return 1.0;
    }
    1.0 - ((n - c - k + 1)..=(n - c)).zip((n - k + 1)..=n).map(|(a, b)| a as f64 / b as f64).product::<f64>()
}

/// pass^k: the chance that k samples drawn without replacement all pass, C(c, k) / C(n, k).
pub fn pass_hat_k(n: u32, c: u32, k: u32) -> f64 {
    if c < k {
        return 0.0;
    }
    ((c - k + 1)..=c).zip((n - k + 1)..=n).map(|(a, b)| a as f64 / b as f64).product()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(task: &str, sample: u32, status: &str) -> Row {
        Row {
            run_id: "r".into(),
            suite_name: "s".into(),
            suite_digest: "d".into(),
            task_digest: "t".into(),
            snapshot_id: "snap".into(),
            policy_name: "replay".into(),
            steps: vec![Step {
                index: 0,
                kind: "exec".into(),
                text: "true".into(),
                stdout: String::new(),
                stderr: String::new(),
                exit_code: Some(0),
                started_at_ms: 0,
                duration_ms: 1.0,
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
        let rows = [row("a", 0, "passed"), row("a", 1, "failed"), row("b", 0, "env_error"), row("b", 1, "passed")];
        let outcomes: Vec<Outcome> = rows.iter().map(Outcome::from).collect();
        let s = summary(&outcomes, 2, 4);
        assert_eq!(s["counts"]["passed"], 2);
        assert_eq!(s["counts"]["env_error"], 1);
        assert_eq!(s["tasks"]["a"]["pass_at_k"]["1"], 0.5);
        assert_eq!(s["tasks"]["b"]["pass_at_k"]["1"], 1.0);
        assert!(s["tasks"]["b"]["pass_at_k"].get("2").is_none());
    }

    #[test]
    fn journal_parts_and_resume_keep_every_row_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = OutputWriter::open(dir.path(), "run1", "s", "digest", false, 2).unwrap();
        for i in 0..3 {
            w.append(row("t", i, "passed")).unwrap();
        }
        // One part of 2 rows committed; row 3 only in the journal.
        assert_eq!(w.manifest.parts.len(), 1);
        drop(w);
        // A torn line, as if the process died mid-write.
        let mut j = std::fs::OpenOptions::new().append(true).open(dir.path().join("journal.jsonl")).unwrap();
        j.write_all(b"{\"run_id\":").unwrap();
        drop(j);
        assert!(OutputWriter::open(dir.path(), "run2", "s", "digest", false, 2).is_err(), "needs --resume");
        assert!(OutputWriter::open(dir.path(), "run2", "s", "other", true, 2).is_err(), "different suite");
        let mut w = OutputWriter::open(dir.path(), "run2", "s", "digest", true, 2).unwrap();
        assert_eq!(w.run_id(), "run1");
        assert_eq!(w.done().len(), 3);
        assert!(w.append(row("t", 1, "passed")).is_err(), "duplicate");
        w.append(row("t", 3, "failed")).unwrap();
        w.flush().unwrap();
        let total: usize = w.manifest.parts.iter().map(|p| p.rows).sum();
        assert_eq!(total, 4);
        // Rows by position (farm serve's cursor): the torn line is not one of them.
        assert_eq!(w.rows(), 4);
        let lines = w.read_lines(1, 10).unwrap();
        assert_eq!(lines.len(), 3);
        let samples: Vec<u32> = lines.iter().map(|l| serde_json::from_slice::<Row>(l).unwrap().sample_index).collect();
        assert_eq!(samples, [1, 2, 3]);
        // Read the parts back: four distinct keys.
        let mut keys = BTreeSet::new();
        for part in &w.manifest.parts {
            let file = std::fs::File::open(dir.path().join(&part.file)).unwrap();
            let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).unwrap().build().unwrap();
            for batch in reader {
                let rows: Vec<Row> = serde_arrow::from_record_batch(&batch.unwrap()).unwrap();
                for r in rows {
                    assert!(keys.insert(r.key()));
                }
            }
        }
        assert_eq!(keys.len(), 4);
        drop(w);
        // A journal shorter than what the manifest says is in parts: refused, not guessed at.
        let journal = std::fs::OpenOptions::new().write(true).open(dir.path().join("journal.jsonl")).unwrap();
        journal.set_len(10).unwrap();
        let err = OutputWriter::open(dir.path(), "run3", "s", "digest", true, 2).err().expect("a cut journal must be refused");
        assert!(err.to_string().contains("changed by hand"), "{err}");
    }
}
