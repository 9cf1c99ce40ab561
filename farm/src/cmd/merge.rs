//! `farm merge OUT SHARD_DIR...`: the run folders of a suite's shards (`farm run --shard I/N`)
//! into one run folder that every reader understands. Rows are copied through the same
//! recorder that wrote them; the summary and pass@k are computed again from all of them, as
//! a single run of the suite would have them.
//!
//! A merge checks what the shards say about themselves instead of trusting it: each shard's
//! parts against their recorded SHA-256, its journal's hash chain, its parts against its
//! journal, each row's suite digest and (task, sample) against the shard's own plan, and the
//! rows it read against the rollouts the shard planned (see
//! [`engine::recorder::files::read_rows_verified`]). That finds mix-ups and careless edits,
//! not a forger who rewrites a whole shard folder.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use engine::recorder::files::Manifest;
use engine::recorder::summary::{Merged, MergedShard, Provenance, Summary};
use engine::recorder::{Recorder, RecorderOptions, RunIdentity, SummaryInputs};
use engine::row::Row;
use engine::shard::Shard;

#[derive(Args)]
pub struct MergeArgs {
    /// The merged run folder (it must not hold a run yet).
    out: PathBuf,
    /// The shards' run folders.
    #[arg(required = true)]
    shards: Vec<PathBuf>,
    /// Merge even when shards are missing or incomplete (fewer rows than they planned, a torn
    /// last journal line); the summary lists what is missing (`merged.missing_shards`,
    /// `merged.unfinished`).
    #[arg(long)]
    allow_partial: bool,
}

/// Rows recorded with one fsync: the merge is staged and only renamed into place once
/// complete, so a row-by-row fsync would buy nothing.
const BATCH: usize = 2048;

/// One shard's folder, as read.
struct ShardRun {
    dir: PathBuf,
    shard: Shard,
    manifest: Manifest,
    summary: Option<Summary>,
}

fn read_shard(dir: &Path) -> Result<ShardRun> {
    let manifest = Manifest::load(dir)?;
    let Some(shard) = manifest.shard else {
        bail!("{} is not a shard: it was not run with --shard I/N", dir.display());
    };
    let summary = match std::fs::read_to_string(dir.join("summary.json")) {
        Ok(text) => Some(
            serde_json::from_str(&text)
                .with_context(|| format!("{}: summary.json is not a farm summary", dir.display()))?,
        ),
        Err(_) => None,
    };
    Ok(ShardRun {
        dir: dir.to_path_buf(),
        shard,
        manifest,
        summary,
    })
}

pub async fn run(args: MergeArgs) -> Result<i32> {
    let mut shards = args.shards.iter().map(|d| read_shard(d)).collect::<Result<Vec<_>>>()?;
    shards.sort_by_key(|s| s.shard.index);
    let first = &shards[0];
    let mut seen: HashMap<u32, &Path> = HashMap::new();
    for s in &shards {
        if s.manifest.suite_digest != first.manifest.suite_digest {
            bail!(
                "{} is a shard of another suite than {} (suite digest {} vs {})",
                s.dir.display(),
                first.dir.display(),
                &s.manifest.suite_digest[..12.min(s.manifest.suite_digest.len())],
                &first.manifest.suite_digest[..12.min(first.manifest.suite_digest.len())]
            );
        }
        if s.shard.count != first.shard.count {
            bail!(
                "{} is shard {} but {} is shard {}: the shards of one run share N",
                s.dir.display(),
                s.shard,
                first.dir.display(),
                first.shard
            );
        }
        if let Some(other) = seen.insert(s.shard.index, &s.dir) {
            bail!("{} and {} are both shard {}", other.display(), s.dir.display(), s.shard);
        }
    }
    let count = first.shard.count;
    let missing_shards: Vec<u32> = (0..count).filter(|i| !seen.contains_key(i)).collect();

    // The merge is written beside OUT and renamed into place when complete: a merge that
    // stops (an overlap or a bad row found late, an incomplete shard, a full disk, Ctrl-C)
    // leaves no half-merged run.
    if std::fs::read_dir(&args.out).is_ok_and(|mut entries| entries.next().is_some()) {
        bail!(
            "{} is not empty: farm merge writes a new run folder",
            args.out.display()
        );
    }
    let parent = args
        .out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let name = args
        .out
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "merged".into());
    let staging = tempfile::Builder::new()
        .prefix(&format!(".{name}.merging-"))
        .tempdir_in(parent)
        .with_context(|| format!("creating a staging folder in {}", parent.display()))?;
    let summary = write_merged(staging.path(), &shards, count, missing_shards, args.allow_partial).await?;
    let _ = std::fs::remove_dir(&args.out); // empty, checked above
    std::fs::rename(staging.path(), &args.out)
        .with_context(|| format!("moving the merged run into {}", args.out.display()))?;
    std::mem::forget(staging); // renamed: nothing left to remove
    let by_status: BTreeMap<&String, &usize> = summary.totals.counts.iter().collect();
    crate::ui::outln!(
        "merged {} shard(s) of {count} into {}: {} rows ({})",
        shards.len(),
        args.out.display(),
        summary.finished,
        by_status
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(0)
}

/// What one shard gave the merge.
struct ShardRead {
    rows: usize,
    planned: usize,
    torn_bytes: u64,
}

/// Streams one shard's rows, checked, into `recorder`; `owner` says which shard each
/// (task, sample) came from so far.
async fn copy_shard(
    recorder: &Recorder,
    s: &ShardRun,
    count: u32,
    owner: &mut HashMap<String, u32>,
) -> Result<ShardRead> {
    // Rows stream from a blocking reader, a batch at a time: memory does not grow with the run.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Row>(1024);
    let (dir, digest, shard) = (s.dir.clone(), s.manifest.suite_digest.clone(), s.shard);
    let reader = tokio::task::spawn_blocking(move || {
        engine::recorder::files::read_rows_verified::<anyhow::Error>(&dir, |plan, row| {
            if row.suite_digest != digest {
                bail!(
                    "{}: task {:?} sample {} has suite digest {}, not its shard's {}: a row of another run",
                    dir.display(),
                    row.task_id,
                    row.sample_index,
                    &row.suite_digest[..12.min(row.suite_digest.len())],
                    &digest[..12.min(digest.len())]
                );
            }
            if !plan.has(&row.task_id, row.sample_index) {
                bail!(
                    "{}: task {:?} sample {} is not a rollout shard {shard} planned (plan.json): a row of another shard or run",
                    dir.display(),
                    row.task_id,
                    row.sample_index
                );
            }
            tx.blocking_send(row).map_err(|_| anyhow!("the merge stopped"))
        })
    });
    let mut batch = Vec::with_capacity(BATCH);
    let mut rows = 0;
    while let Some(row) = rx.recv().await {
        if let Some(other) = owner.insert(row.key(), s.shard.index) {
            bail!(
                "task {:?} sample {} is in shard {other}/{count} and in shard {} ({}): the shards overlap",
                row.task_id,
                row.sample_index,
                s.shard,
                s.dir.display()
            );
        }
        rows += 1;
        batch.push(row);
        if batch.len() == BATCH {
            recorder.append_batch(std::mem::take(&mut batch)).await?;
        }
    }
    if !batch.is_empty() {
        recorder.append_batch(batch).await?;
    }
    let verified = reader
        .await?
        .with_context(|| format!("reading the rows of shard {} ({})", s.shard, s.dir.display()))?;
    Ok(ShardRead {
        rows,
        planned: verified.plan.rollouts(),
        torn_bytes: verified.torn_bytes,
    })
}

/// Copies every shard's rows into `recorder`, a shard at a time; returns the rollouts they
/// planned and what each that is incomplete lacks.
async fn copy_shards(recorder: &Recorder, shards: &[ShardRun], count: u32) -> Result<(usize, Vec<String>)> {
    let mut owner: HashMap<String, u32> = HashMap::new();
    let (mut unfinished, mut planned) = (Vec::new(), 0);
    for s in shards {
        let read = copy_shard(recorder, s, count, &mut owner).await?;
        planned += read.planned;
        // Counted here, from the rows read: a shard's own summary could say anything.
        if read.rows < read.planned {
            unfinished.push(format!(
                "shard {} ({}): {} of {} planned rollouts recorded",
                s.shard,
                s.dir.display(),
                read.rows,
                read.planned
            ));
        }
        if read.torn_bytes > 0 {
            unfinished.push(format!(
                "shard {} ({}): journal.jsonl ends with a torn line of {} bytes (an append that never finished)",
                s.shard,
                s.dir.display(),
                read.torn_bytes
            ));
        }
    }
    Ok((planned, unfinished))
}

/// The shards' provenances as one: each text field's distinct values, cores summed, the
/// environments of all.
fn merged_provenance(summaries: &[&Summary]) -> Provenance {
    let provenances: Vec<&Provenance> = summaries.iter().filter_map(|s| s.provenance.as_ref()).collect();
    let distinct = |field: fn(&Provenance) -> &str| -> String {
        let mut values: Vec<&str> = provenances.iter().map(|p| field(p)).filter(|v| !v.is_empty()).collect();
        values.sort();
        values.dedup();
        values.join(", ")
    };
    Provenance {
        host: distinct(|p| &p.host),
        farm_version: distinct(|p| &p.farm_version),
        accel: distinct(|p| &p.accel),
        cores: provenances.iter().map(|p| p.cores).sum(),
        template_snapshot: distinct(|p| &p.template_snapshot),
        image_pulled: provenances.iter().find_map(|p| p.image_pulled.clone()),
        shard: None,
        environments: provenances.iter().flat_map(|p| p.environments.clone()).collect(),
    }
}

/// Copies every shard's rows into a new run in `dir` and writes its summary; refuses
/// incomplete shards unless `allow_partial`, and then lists them.
async fn write_merged(
    dir: &Path,
    shards: &[ShardRun],
    count: u32,
    missing_shards: Vec<u32>,
    allow_partial: bool,
) -> Result<Summary> {
    let first = &shards[0];
    let identity = RunIdentity {
        run_id: crate::run::new_run_id(),
        suite_name: first.manifest.suite_name.clone(),
        suite_digest: first.manifest.suite_digest.clone(),
        shard: None,
    };
    let options = RecorderOptions {
        rows_per_part: 4096,
        resume: false,
        requests: None,
    };
    let (recorder, _) = Recorder::open(dir, identity, options).await?;
    let (planned, unfinished) = copy_shards(&recorder, shards, count).await?;
    if !allow_partial && (!missing_shards.is_empty() || !unfinished.is_empty()) {
        let mut text = String::from("the shards are not complete (merge anyway with --allow-partial):");
        if !missing_shards.is_empty() {
            let missing: Vec<String> = missing_shards.iter().map(|i| format!("{i}/{count}")).collect();
            text.push_str(&format!("\n  missing shards: {}", missing.join(", ")));
        }
        for u in &unfinished {
            text.push_str(&format!("\n  {u}"));
        }
        bail!("{text}");
    }
    let summaries: Vec<&Summary> = shards.iter().filter_map(|s| s.summary.as_ref()).collect();
    let samples = summaries
        .iter()
        .flat_map(|s| s.totals.pass_at_k.keys())
        .filter_map(|k| k.parse::<u32>().ok())
        .max()
        .unwrap_or(1);
    let merged = Merged {
        shards: shards
            .iter()
            .map(|s| MergedShard {
                shard: s.shard,
                dir: s.dir.display().to_string(),
                provenance: s.summary.as_ref().and_then(|sum| sum.provenance.clone()),
                performance: s.summary.as_ref().and_then(|sum| sum.performance.clone()),
            })
            .collect(),
        missing_shards,
        unfinished,
    };
    let wall = summaries
        .iter()
        .filter_map(|s| s.performance.as_ref())
        .map(|p| p.wall_secs)
        .fold(0.0, f64::max);
    let inputs = SummaryInputs {
        samples,
        planned,
        provenance: merged_provenance(&summaries),
        concurrency: summaries
            .iter()
            .filter_map(|s| s.performance.as_ref())
            .map(|p| p.concurrency)
            .sum(),
        wall: Duration::from_secs_f64(wall),
        merged: Some(merged),
    };
    Ok(recorder.summarise(inputs).await?)
}
