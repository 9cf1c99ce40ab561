//! A run folder's files, read and written:
//!
//! ```text
//! DIR/
//!   manifest.json            format version, run id, suite digest, parts written (rows, SHA-256),
//!                            journal bytes in parts, the plan's size and SHA-256
//!   plan.json                the rollouts the run plans: each task's number of samples
//!   journal.jsonl            every finished rollout, appended and fsynced as it ends, each line
//!                            ending with its hash chain ([`super::chain`])
//!   trajectories/part-00000.parquet   rows (zstd), written atomically (temp, fsync, rename)
//!   summary.json             counts by status and trust, mean reward, pass@k, pass^k
//! ```
//!
//! A finished rollout is durable once its journal line is synced. Parts are made from the
//! journal; the manifest (replaced atomically) is the commit point that says which journal
//! bytes are already in parts, so a crash at any moment loses only in-flight rollouts and a
//! resume never duplicates a row.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::journal::{self, JournalError};
use crate::row::{Outcome, Row};

/// The manifest format this farm writes. Format 1 (no part checksums, no plan) is still read,
/// and a resumed format-1 run continues in format 2; any other version is refused with a
/// message that says which.
pub const FORMAT_VERSION: u32 = 2;
const READS: [u32; 2] = [1, 2];

/// Why a run folder could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("{}: no such folder", .0.display())]
    NoFolder(PathBuf),
    #[error("{}: not a farm run (no manifest.json)", .0.display())]
    NotARun(PathBuf),
    #[error("{}: not a farm run manifest: {message}", path.display())]
    BadManifest { path: PathBuf, message: String },
    #[error(
        "{}: a run of manifest format {found}, which this farm ({}) does not read (it reads format {FORMAT_VERSION}): {}",
        path.display(),
        env!("CARGO_PKG_VERSION"),
        if *.found > FORMAT_VERSION { "use the farm that wrote it, or a newer one" } else { "it was written by an older farm; finish it with that farm, or start a new run" }
    )]
    FormatVersion { path: PathBuf, found: u32 },
    #[error("output folder {} already holds a run (manifest.json): pass --resume to finish it, or choose another --out", .0.display())]
    HoldsARun(PathBuf),
    #[error("{} was written by a different version of the suite (digest {recorded} vs {now}); resume needs the same suite file", dir.display())]
    OtherSuite {
        dir: PathBuf,
        recorded: String,
        now: String,
    },
    #[error("{} holds shard {} of the suite, not {}; resume a shard with its own --shard", dir.display(), recorded.map(|s| s.to_string()).unwrap_or_else(|| "none (the whole suite)".into()), now.map(|s| s.to_string()).unwrap_or_else(|| "the whole suite".into()))]
    OtherShard {
        dir: PathBuf,
        recorded: Option<crate::shard::Shard>,
        now: Option<crate::shard::Shard>,
    },
    #[error(
        "{}: journal.jsonl holds {journal} bytes but the manifest says {in_parts} are already in parts; the output folder was changed by hand: start a new run in another folder",
        dir.display()
    )]
    ShortJournal { dir: PathBuf, journal: u64, in_parts: u64 },
    #[error("rollout {key:?} was recorded twice")]
    Duplicate { key: String },
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("{what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    Parquet { path: PathBuf, message: String },
    #[error("{} changed after it was written: {what}", path.display())]
    Changed { path: PathBuf, what: &'static str },
    #[error("{}:{line}: {error}", path.display())]
    Chain {
        path: PathBuf,
        line: usize,
        error: super::chain::ChainError,
    },
    #[error(
        "{}: the parts hold {part_rows} rows, but the journal has {journal_rows} lines before the point the manifest says is in parts: a part was removed or replaced",
        dir.display()
    )]
    PartsAndJournal {
        dir: PathBuf,
        part_rows: usize,
        journal_rows: usize,
    },
    #[error("{}: written by a farm whose runs cannot be checked (manifest format {found}, without part checksums or a plan): run it again with this farm", dir.display())]
    Unverifiable { dir: PathBuf, found: u32 },
}

pub(crate) fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> OutputError {
    let path = path.to_path_buf();
    move |source| OutputError::Io { what, path, source }
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
    /// The part of the suite this run holds (`farm run --shard I/N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<crate::shard::Shard>,
    /// `plan.json`: how many rollouts it plans and its SHA-256 (`farm run`; none in `farm serve`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartRecord {
    pub file: String,
    pub rows: usize,
    /// The file's SHA-256 when it was committed (none in format 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanRecord {
    pub rollouts: usize,
    pub sha256: String,
}

/// `plan.json`: the rollouts a run plans, each task's number of samples (`0..samples`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub tasks: std::collections::BTreeMap<String, u32>,
}

impl Plan {
    pub fn rollouts(&self) -> usize {
        self.tasks.values().map(|n| *n as usize).sum()
    }

    /// Whether the plan has sample `sample` of `task`.
    pub fn has(&self, task: &str, sample: u32) -> bool {
        self.tasks.get(task).is_some_and(|n| sample < *n)
    }

    /// Writes `DIR/plan.json` atomically; returns its record for the manifest.
    pub fn save(&self, dir: &Path) -> Result<PlanRecord, OutputError> {
        let text = serde_json::to_vec_pretty(self).expect("a plan serializes");
        let tmp = dir.join("plan.json.tmp");
        let mut f = std::fs::File::create(&tmp).map_err(io("writing", &tmp))?;
        f.write_all(&text)
            .and_then(|_| f.sync_all())
            .map_err(io("writing", &tmp))?;
        std::fs::rename(&tmp, dir.join("plan.json")).map_err(io("replacing", &dir.join("plan.json")))?;
        Ok(PlanRecord {
            rollouts: self.rollouts(),
            sha256: sha256_hex(&text),
        })
    }

    /// Reads `DIR/plan.json` and checks it against its record.
    pub fn load(dir: &Path, record: &PlanRecord) -> Result<Plan, OutputError> {
        let path = dir.join("plan.json");
        let text = std::fs::read(&path).map_err(io("reading", &path))?;
        if sha256_hex(&text) != record.sha256 {
            return Err(OutputError::Changed {
                path,
                what: "its SHA-256 is not the one the manifest recorded",
            });
        }
        let plan: Plan = serde_json::from_slice(&text).map_err(|e| OutputError::BadManifest {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if plan.rollouts() != record.rollouts {
            return Err(OutputError::Changed {
                path,
                what: "its rollouts are not the number the manifest recorded",
            });
        }
        Ok(plan)
    }
}

/// SHA-256, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(bytes))
}

/// A file's SHA-256, hex, read in pieces.
pub fn sha256_file(path: &Path) -> Result<String, OutputError> {
    use sha2::Digest;
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(io("reading", path))?;
    let mut hash = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io("reading", path))?;
        if n == 0 {
            return Ok(format!("{:x}", hash.finalize()));
        }
        hash.update(&buf[..n]);
    }
}

impl Manifest {
    /// Reads `DIR/manifest.json`, refusing a format this farm does not read.
    pub fn load(dir: &Path) -> Result<Manifest, OutputError> {
        let path = dir.join("manifest.json");
        let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound if dir.is_dir() => OutputError::NotARun(dir.to_path_buf()),
            std::io::ErrorKind::NotFound => OutputError::NoFolder(dir.to_path_buf()),
            _ => OutputError::Io {
                what: "reading",
                path: path.clone(),
                source: e,
            },
        })?;
        // The version first, on its own: a newer format may have fields this farm does not know.
        #[derive(Deserialize)]
        struct Version {
            format_version: u32,
        }
        let version: Version = serde_json::from_str(&text).map_err(|e| OutputError::BadManifest {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if !READS.contains(&version.format_version) {
            return Err(OutputError::FormatVersion {
                path,
                found: version.format_version,
            });
        }
        serde_json::from_str(&text).map_err(|e| OutputError::BadManifest {
            path,
            message: e.to_string(),
        })
    }

    /// Replaces `DIR/manifest.json` atomically.
    pub fn save(&self, dir: &Path) -> Result<(), OutputError> {
        let tmp = dir.join("manifest.json.tmp");
        let text = serde_json::to_string_pretty(self).expect("a manifest serializes");
        let mut f = std::fs::File::create(&tmp).map_err(io("writing", &tmp))?;
        f.write_all(text.as_bytes())
            .and_then(|_| f.sync_all())
            .map_err(io("writing", &tmp))?;
        std::fs::rename(&tmp, dir.join("manifest.json")).map_err(io("replacing", &dir.join("manifest.json")))?;
        sync_dir(dir);
        Ok(())
    }
}

/// The Parquet schema of rows, derived from [`Row`].
pub fn schema() -> Arc<arrow_schema::Schema> {
    use serde_arrow::schema::{SchemaLike, TracingOptions};
    // The enums are plain string columns in the files.
    let utf8 =
        |name: &str, nullable: bool| serde_json::json!({ "name": name, "data_type": "Utf8", "nullable": nullable });
    let options = TracingOptions::default()
        .allow_null_fields(true)
        .strings_as_large_utf8(false)
        .sequence_as_large_list(false)
        .overwrite("status", utf8("status", false))
        .and_then(|o| o.overwrite("trust", utf8("trust", true)))
        .and_then(|o| o.overwrite("rollout_vm", utf8("rollout_vm", true)))
        .and_then(|o| o.overwrite("scoring_vm", utf8("scoring_vm", true)))
        .and_then(|o| o.overwrite("steps.element.kind", utf8("kind", false)))
        .expect("the overwritten columns exist");
    let fields = Vec::<arrow_schema::FieldRef>::from_type::<Row>(options).expect("rows have an Arrow schema");
    Arc::new(arrow_schema::Schema::new(fields))
}

/// Writes `rows` as one zstd Parquet file at `path`, synced.
pub fn write_parquet(path: &Path, schema: &Arc<arrow_schema::Schema>, rows: &[Row]) -> Result<(), OutputError> {
    use parquet::basic::{Compression, ZstdLevel};
    use parquet::file::properties::WriterProperties;
    let parquet_error = |message: String| OutputError::Parquet {
        path: path.to_path_buf(),
        message,
    };
    let batch = serde_arrow::to_record_batch(schema.fields(), &rows)
        .map_err(|e| parquet_error(format!("converting rows to Arrow: {e}")))?;
    if batch.schema().fields() != schema.fields() {
        return Err(parquet_error(format!(
            "a row batch's schema {:?} differs from the output schema {:?}",
            batch.schema(),
            schema
        )));
    }
    let level = ZstdLevel::try_new(3).expect("3 is a zstd level");
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(level))
        .build();
    let file = std::fs::File::create(path).map_err(io("creating", path))?;
    let clone = file.try_clone().map_err(io("opening", path))?;
    let mut writer = parquet::arrow::ArrowWriter::try_new(clone, schema.clone(), Some(props))
        .map_err(|e| parquet_error(e.to_string()))?;
    writer.write(&batch).map_err(|e| parquet_error(e.to_string()))?;
    writer.close().map_err(|e| parquet_error(e.to_string()))?;
    file.sync_all().map_err(io("syncing", path))
}

/// Journal lines at (offset, length), each without its newline.
pub fn read_lines_at(journal: &Path, index: &[(u64, u64)]) -> Result<Vec<Vec<u8>>, OutputError> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(journal).map_err(io("opening", journal))?;
    let mut out = Vec::with_capacity(index.len());
    for &(offset, len) in index {
        let mut line = vec![0u8; len as usize];
        file.read_exact_at(&mut line, offset).map_err(io("reading", journal))?;
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
pub fn read_rows<E: From<OutputError>>(dir: &Path, mut each: impl FnMut(Row) -> Result<(), E>) -> Result<Manifest, E> {
    let manifest = Manifest::load(dir)?;
    for part in &manifest.parts {
        let path = dir.join(&part.file);
        let parquet_error = |message: String| OutputError::Parquet {
            path: path.clone(),
            message,
        };
        let file = std::fs::File::open(&path).map_err(|e| parquet_error(format!("listed in the manifest: {e}")))?;
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.with_batch_size(1024).build())
            .map_err(|e| parquet_error(format!("not a Parquet file: {e}")))?;
        for batch in reader {
            let batch = batch.map_err(|e| parquet_error(e.to_string()))?;
            let rows: Vec<Row> = serde_arrow::from_record_batch(&batch)
                .map_err(|e| parquet_error(format!("rows do not match farm's schema: {e}")))?;
            for row in rows {
                each(row)?;
            }
        }
    }
    let journal = read_journal(&dir.join("journal.jsonl"), manifest.journal_bytes_in_parts)?;
    for row in journal.pending {
        each(row)?;
    }
    Ok(manifest)
}

/// What [`read_rows_verified`] found besides the rows.
#[derive(Debug, Clone)]
pub struct Verified {
    pub manifest: Manifest,
    /// What the run planned.
    pub plan: Plan,
    /// Bytes of a torn last journal line (an append that never finished; 0: none).
    pub torn_bytes: u64,
}

/// Every row of the run in `dir`, as [`read_rows`] gives them, after checking what a run
/// folder records about itself: the manifest is of a format with checksums, `plan.json`
/// matches its record, each committed part matches its SHA-256 and row count, every
/// journal line's hash chain holds ([`super::chain`]), and the parts hold as many rows as
/// the journal lines they were made from. Errors name the file (and line).
pub fn read_rows_verified<E: From<OutputError>>(
    dir: &Path,
    mut each: impl FnMut(&Plan, Row) -> Result<(), E>,
) -> Result<Verified, E> {
    let manifest = Manifest::load(dir)?;
    let Some(record) = manifest.plan.as_ref().filter(|_| manifest.format_version >= 2) else {
        return Err(OutputError::Unverifiable {
            dir: dir.to_path_buf(),
            found: manifest.format_version,
        }
        .into());
    };
    let plan = Plan::load(dir, record)?;
    for part in &manifest.parts {
        let path = dir.join(&part.file);
        let Some(recorded) = &part.sha256 else {
            return Err(OutputError::Unverifiable {
                dir: dir.to_path_buf(),
                found: 1,
            }
            .into());
        };
        if sha256_file(&path)? != *recorded {
            return Err(OutputError::Changed {
                path,
                what: "its SHA-256 is not the one the manifest recorded",
            }
            .into());
        }
    }
    let journal = dir.join("journal.jsonl");
    let (mut previous, mut number, mut before_parts) = (String::new(), 0usize, 0usize);
    let mut broken = None;
    let extent = journal::for_each_line(&journal, |offset, line| -> Result<(), super::chain::ChainError> {
        number += 1;
        previous = super::chain::verify(&previous, line).inspect_err(|e| broken = Some((number, e.clone())))?;
        if offset < manifest.journal_bytes_in_parts {
            before_parts += 1;
        }
        Ok(())
    })
    .map_err(|e| match (e, broken.take()) {
        (JournalError::BadLine { path, .. }, Some((line, error))) => OutputError::Chain { path, line, error },
        (other, _) => OutputError::from(other),
    })?;
    let part_rows: usize = manifest.parts.iter().map(|p| p.rows).sum();
    if part_rows != before_parts {
        return Err(OutputError::PartsAndJournal {
            dir: dir.to_path_buf(),
            part_rows,
            journal_rows: before_parts,
        }
        .into());
    }
    read_rows(dir, |row| each(&plan, row))?;
    Ok(Verified {
        manifest,
        plan,
        torn_bytes: extent.torn_bytes,
    })
}

pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.sync_all();
    }
}

/// What the journal holds: every row's outcome and line, the rows after the bytes already
/// in parts, and where its complete lines end.
pub struct Journal {
    pub all: Vec<Outcome>,
    pub pending: Vec<Row>,
    pub lines: Vec<(u64, u64)>,
    pub extent: journal::Extent,
    /// The chain of the last line (empty when there is none, or it has none).
    pub last_chain: String,
}

/// Reads the journal; a line that is not a row (other than a torn last one) is an error
/// naming the file and line, and nothing is dropped.
pub fn read_journal(path: &Path, in_parts: u64) -> Result<Journal, OutputError> {
    let (mut all, mut pending, mut lines) = (Vec::new(), Vec::new(), Vec::new());
    let mut last_chain = String::new();
    let extent = journal::for_each_line(path, |offset, line| -> Result<(), serde_json::Error> {
        let row: Row = serde_json::from_slice(line)?;
        all.push(Outcome::from(&row));
        last_chain = row.chain.clone().unwrap_or_default();
        if offset >= in_parts {
            pending.push(row);
        }
        lines.push((offset, line.len() as u64));
        Ok(())
    })?;
    Ok(Journal {
        all,
        pending,
        lines,
        extent,
        last_chain,
    })
}

/// `farm repair DIR`: moves journal lines that are not rows (and requests that are not
/// records) into side files, keeps the rest, and keeps the manifest's count of journal
/// bytes in parts true.
pub fn repair(dir: &Path, request_valid: impl Fn(&[u8]) -> bool) -> Result<Vec<journal::Repaired>, OutputError> {
    let mut manifest = Manifest::load(dir)?;
    let path = dir.join("journal.jsonl");
    let journal = journal::repair(&path, |line| serde_json::from_slice::<Row>(line).is_ok())?;
    if !journal.bad_lines.is_empty() {
        // The lines kept close over the gap: their hash chain is made again (same lengths).
        super::chain::reseal(&path).map_err(io("resealing the hash chain of", &path))?;
    }
    let new_in_parts = journal.new_offset(manifest.journal_bytes_in_parts);
    if new_in_parts != manifest.journal_bytes_in_parts {
        manifest.journal_bytes_in_parts = new_in_parts;
        manifest.save(dir)?;
    }
    let mut done = vec![journal];
    let requests = dir.join("requests.jsonl");
    if requests.exists() {
        done.push(journal::repair(&requests, request_valid)?);
    }
    Ok(done)
}
