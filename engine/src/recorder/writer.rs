//! The run folder's writer: journal lines (fsynced), Parquet parts and the manifest. It does
//! blocking file-system work, so only the recorder's own thread holds one
//! ([`super::Recorder`]).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::chain;
use super::files::{self, io, Manifest, OutputError, PartRecord, Plan, FORMAT_VERSION};
use crate::row::{Outcome, Row};

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
    /// The journal's hash chain so far (its last line's).
    last_chain: String,
}

/// Which run an output folder is for.
#[derive(Debug, Clone)]
pub struct RunIdentity {
    pub run_id: String,
    pub suite_name: String,
    pub suite_digest: String,
    /// The part of the suite the run holds (None: all of it).
    pub shard: Option<crate::shard::Shard>,
}

impl OutputWriter {
    /// Opens `dir` for a run: a new one, or (with `resume`) the unfinished run of the same
    /// suite, whose run id it keeps. A torn last journal line is cut; any other line that is
    /// not a row stops the open with an error naming it, and nothing is changed.
    pub fn open(
        dir: &Path,
        run: &RunIdentity,
        resume: bool,
        rows_per_part: usize,
    ) -> Result<OutputWriter, OutputError> {
        let manifest = manifest_to_open(dir, run, resume)?;
        let journal_path = dir.join("journal.jsonl");
        // Read everything before changing anything: a bad line leaves the folder untouched.
        let journal = files::read_journal(&journal_path, manifest.journal_bytes_in_parts)?;
        if journal.extent.good_len < manifest.journal_bytes_in_parts {
            return Err(OutputError::ShortJournal {
                dir: dir.to_path_buf(),
                journal: journal.extent.good_len,
                in_parts: manifest.journal_bytes_in_parts,
            });
        }
        std::fs::create_dir_all(dir.join("trajectories")).map_err(io("creating", dir))?;
        remove_uncommitted_parts(dir, &manifest)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&journal_path)
            .map_err(io("opening", &journal_path))?;
        // Cut a torn last line (a crash mid-append) so new lines start clean.
        if journal.extent.torn_bytes > 0 {
            file.set_len(journal.extent.good_len)
                .map_err(io("truncating the torn last line of", &journal_path))?;
        }
        let done = journal.all.iter().map(|o| o.key.clone()).collect();
        let writer = OutputWriter {
            dir: dir.to_path_buf(),
            manifest,
            journal: file,
            pending: journal.pending,
            journal_len: journal.extent.good_len,
            rows_per_part,
            schema: files::schema(),
            done,
            lines: journal.lines,
            all: journal.all,
            last_chain: journal.last_chain,
        };
        writer.manifest.save(dir)?;
        Ok(writer)
    }

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

    pub fn journal_path(&self) -> PathBuf {
        self.dir.join("journal.jsonl")
    }

    /// Where each row is in the journal, in order.
    pub fn lines(&self) -> &[(u64, u64)] {
        &self.lines
    }

    pub fn outcomes(&self) -> &[Outcome] {
        &self.all
    }

    /// `row`'s journal line (with its newline), chained after `previous`; sets the row's
    /// chain and returns the line and the new chain.
    fn sealed(previous: &str, row: &mut Row) -> (Vec<u8>, String) {
        row.chain = None;
        let content = serde_json::to_vec(&*row).expect("rows serialize");
        let (mut line, chain) = chain::seal(previous, &content);
        line.push(b'\n');
        row.chain = Some(chain.clone());
        (line, chain)
    }

    /// Records a finished rollout durably; writes a part when enough rows are pending.
    /// Returns the row's position (its cursor).
    pub fn append(&mut self, mut row: Row) -> Result<usize, OutputError> {
        let key = row.key();
        if !self.done.insert(key.clone()) {
            return Err(OutputError::Duplicate { key });
        }
        if let Err(e) = self.store_attachments(&row) {
            self.done.remove(&key);
            return Err(e);
        }
        let (line, chain) = Self::sealed(&self.last_chain, &mut row);
        let path = self.journal_path();
        if let Err(e) = self.journal.write_all(&line).and_then(|_| self.journal.sync_data()) {
            // Nothing half-written stays: the next row starts where this one would have.
            self.done.remove(&key);
            let _ = self.journal.set_len(self.journal_len);
            return Err(OutputError::Io {
                what: "appending to",
                path,
                source: e,
            });
        }
        self.last_chain = chain;
        self.lines.push((self.journal_len, line.len() as u64));
        self.journal_len += line.len() as u64;
        self.all.push(Outcome::from(&row));
        self.pending.push(row);
        if self.pending.len() >= self.rows_per_part {
            // The row is durable in the journal; a part that cannot be written now is
            // written by a later flush (or made from the journal on resume).
            if let Err(e) = self.flush() {
                tracing::warn!("writing a Parquet part failed (the rows are safe in journal.jsonl): {e}");
            }
        }
        Ok(self.lines.len() - 1)
    }

    /// Records rows as [`append`](Self::append) does, with one fsync for all of them: all
    /// are recorded, or none (a duplicate or a failed write leaves the journal as it was).
    /// Returns the first row's cursor.
    pub fn append_batch(&mut self, mut rows: Vec<Row>) -> Result<usize, OutputError> {
        let first = self.lines.len();
        let mut keys = Vec::with_capacity(rows.len());
        for row in &rows {
            let key = row.key();
            if !self.done.insert(key.clone()) {
                for k in &keys {
                    self.done.remove(k);
                }
                return Err(OutputError::Duplicate { key });
            }
            keys.push(key);
        }
        let mut buffer = Vec::new();
        let mut lengths = Vec::with_capacity(rows.len());
        let mut chain = self.last_chain.clone();
        for row in &mut rows {
            let (line, next) = Self::sealed(&chain, row);
            buffer.extend_from_slice(&line);
            lengths.push(line.len() as u64);
            chain = next;
        }
        if let Err(e) = self.journal.write_all(&buffer).and_then(|_| self.journal.sync_data()) {
            for k in &keys {
                self.done.remove(k);
            }
            let _ = self.journal.set_len(self.journal_len);
            return Err(OutputError::Io {
                what: "appending to",
                path: self.journal_path(),
                source: e,
            });
        }
        self.last_chain = chain;
        for (row, len) in rows.into_iter().zip(lengths) {
            self.lines.push((self.journal_len, len));
            self.journal_len += len;
            self.all.push(Outcome::from(&row));
            self.pending.push(row);
            if self.pending.len() >= self.rows_per_part {
                if let Err(e) = self.flush() {
                    tracing::warn!("writing a Parquet part failed (the rows are safe in journal.jsonl): {e}");
                }
            }
        }
        Ok(first)
    }

    /// Writes pending rows as a Parquet part and commits it in the manifest.
    pub fn flush(&mut self) -> Result<(), OutputError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let name = format!("trajectories/part-{:05}.parquet", self.manifest.parts.len());
        let path = self.dir.join(&name);
        let tmp = self.dir.join(format!("{name}.tmp"));
        files::write_parquet(&tmp, &self.schema, &self.pending)?;
        let sha256 = files::sha256_file(&tmp)?;
        std::fs::rename(&tmp, &path).map_err(io("renaming", &tmp))?;
        files::sync_dir(&self.dir.join("trajectories"));
        self.manifest.parts.push(PartRecord {
            file: name,
            rows: self.pending.len(),
            sha256: Some(sha256),
        });
        self.manifest.journal_bytes_in_parts = self.journal_len;
        self.manifest.save(&self.dir)?;
        self.pending.clear();
        Ok(())
    }

    /// Writes a row's attachments under `artifacts/<its folder>/`, before its journal line
    /// (a crash between the two leaves files that the row, recorded again, overwrites). Each
    /// path must be plain and relative; nothing is written outside the folder.
    fn store_attachments(&self, row: &Row) -> Result<(), OutputError> {
        if row.attachments.is_empty() {
            return Ok(());
        }
        let folder = self.dir.join("artifacts").join(row.artifacts_folder());
        if folder.exists() {
            std::fs::remove_dir_all(&folder).map_err(io("replacing", &folder))?;
        }
        for attachment in &row.attachments {
            let plain = !attachment.path.is_empty()
                && attachment
                    .path
                    .split('/')
                    .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\\'));
            if !plain {
                return Err(OutputError::Io {
                    what: "storing an attachment (its path is not plain) in",
                    path: folder.clone(),
                    source: std::io::Error::other(format!("{:?}", attachment.path)),
                });
            }
            let path = folder.join(&attachment.path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
            }
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(io("writing", &path))?;
            file.write_all(&attachment.bytes).map_err(io("writing", &path))?;
        }
        Ok(())
    }

    /// Writes `plan.json` (what the run plans) and records it in the manifest.
    pub fn record_plan(&mut self, plan: &Plan) -> Result<(), OutputError> {
        self.manifest.plan = Some(plan.save(&self.dir)?);
        self.manifest.save(&self.dir)
    }

    /// Replaces `summary.json` atomically.
    pub fn write_summary(&self, summary: &super::summary::Summary) -> Result<(), OutputError> {
        let tmp = self.dir.join("summary.json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(summary).expect("JSON")).map_err(io("writing", &tmp))?;
        std::fs::rename(&tmp, self.dir.join("summary.json")).map_err(io("replacing", &self.dir.join("summary.json")))
    }

    #[cfg(test)]
    pub(crate) fn manifest(&self) -> &Manifest {
        &self.manifest
    }
}

/// The manifest `dir` is opened with: the unfinished run's (with `resume`, and only when it
/// is of the same suite and shard), in this farm's format, or a new run's.
fn manifest_to_open(dir: &Path, run: &RunIdentity, resume: bool) -> Result<Manifest, OutputError> {
    let existing = dir.join("manifest.json").exists();
    if existing && !resume {
        return Err(OutputError::HoldsARun(dir.to_path_buf()));
    }
    Ok(if existing {
        let m = Manifest::load(dir)?;
        if m.suite_digest != run.suite_digest {
            let short = |d: &str| d[..12.min(d.len())].to_string();
            return Err(OutputError::OtherSuite {
                dir: dir.to_path_buf(),
                recorded: short(&m.suite_digest),
                now: short(&run.suite_digest),
            });
        }
        if m.shard != run.shard {
            return Err(OutputError::OtherShard {
                dir: dir.to_path_buf(),
                recorded: m.shard,
                now: run.shard,
            });
        }
        // A format-1 run continues in this farm's format.
        Manifest {
            format_version: FORMAT_VERSION,
            ..m
        }
    } else {
        Manifest {
            format_version: FORMAT_VERSION,
            run_id: run.run_id.clone(),
            suite_name: run.suite_name.clone(),
            suite_digest: run.suite_digest.clone(),
            parts: Vec::new(),
            journal_bytes_in_parts: 0,
            shard: run.shard,
            plan: None,
        }
    })
}

/// Removes the parts the manifest does not list.
fn remove_uncommitted_parts(dir: &Path, manifest: &Manifest) -> Result<(), OutputError> {
    // Parts not in the manifest were written by a run that died before committing them:
    // their rows are still in the journal.
    let listed: BTreeSet<&str> = manifest.parts.iter().map(|p| p.file.as_str()).collect();
    let trajectories = dir.join("trajectories");
    for entry in std::fs::read_dir(&trajectories)
        .map_err(io("listing", &trajectories))?
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().to_string();
        let ours = name.starts_with("part-") && (name.ends_with(".parquet") || name.ends_with(".parquet.tmp"));
        if ours && !listed.contains(format!("trajectories/{name}").as_str()) {
            std::fs::remove_file(entry.path()).map_err(io("removing", &entry.path()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recorder::summary::tests::row;

    fn run(id: &str, digest: &str) -> RunIdentity {
        RunIdentity {
            run_id: id.into(),
            suite_name: "s".into(),
            suite_digest: digest.into(),
            shard: None,
        }
    }

    #[test]
    fn a_batch_is_recorded_whole_or_not_at_all_and_a_shard_must_match_on_resume() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = OutputWriter::open(dir.path(), &run("run1", "digest"), false, 2).unwrap();
        assert_eq!(
            w.append_batch(vec![
                row("a", 0, "passed"),
                row("a", 1, "failed"),
                row("b", 0, "passed")
            ])
            .unwrap(),
            0
        );
        assert_eq!((w.rows(), w.manifest().parts.len()), (3, 1));
        let before = std::fs::read(dir.path().join("journal.jsonl")).unwrap();
        // A duplicate anywhere in the batch: nothing of it is recorded.
        assert!(matches!(
            w.append_batch(vec![row("c", 0, "passed"), row("a", 1, "passed")]),
            Err(OutputError::Duplicate { .. })
        ));
        assert_eq!(std::fs::read(dir.path().join("journal.jsonl")).unwrap(), before);
        assert_eq!(
            w.append_batch(vec![row("c", 0, "passed")]).unwrap(),
            3,
            "c was not left marked as recorded"
        );
        drop(w);
        let shard = |index| RunIdentity {
            shard: Some(crate::shard::Shard { index, count: 2 }),
            ..run("run2", "digest")
        };
        assert!(
            matches!(
                OutputWriter::open(dir.path(), &shard(0), true, 2),
                Err(OutputError::OtherShard { .. })
            ),
            "a whole run is no shard"
        );
        let other = tempfile::tempdir().unwrap();
        drop(OutputWriter::open(other.path(), &shard(0), false, 2).unwrap());
        assert!(matches!(
            OutputWriter::open(other.path(), &shard(1), true, 2),
            Err(OutputError::OtherShard { .. })
        ));
        assert!(OutputWriter::open(other.path(), &shard(0), true, 2).is_ok());
    }

    #[test]
    fn journal_parts_and_resume_keep_every_row_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = OutputWriter::open(dir.path(), &run("run1", "digest"), false, 2).unwrap();
        for i in 0..3 {
            w.append(row("t", i, "passed")).unwrap();
        }
        // One part of 2 rows committed; row 3 only in the journal.
        assert_eq!(w.manifest().parts.len(), 1);
        drop(w);
        // A torn line, as if the process died mid-write.
        let mut j = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("journal.jsonl"))
            .unwrap();
        j.write_all(b"{\"run_id\":").unwrap();
        drop(j);
        assert!(
            OutputWriter::open(dir.path(), &run("run2", "digest"), false, 2).is_err(),
            "needs --resume"
        );
        assert!(
            OutputWriter::open(dir.path(), &run("run2", "other"), true, 2).is_err(),
            "different suite"
        );
        let mut w = OutputWriter::open(dir.path(), &run("run2", "digest"), true, 2).unwrap();
        assert_eq!(w.run_id(), "run1");
        assert_eq!(w.done().len(), 3);
        assert!(w.append(row("t", 1, "passed")).is_err(), "duplicate");
        assert_eq!(w.append(row("t", 3, "failed")).unwrap(), 3, "the row's cursor");
        w.flush().unwrap();
        let total: usize = w.manifest().parts.iter().map(|p| p.rows).sum();
        assert_eq!(total, 4);
        // Rows by position (farm serve's cursor): the torn line is not one of them.
        assert_eq!(w.rows(), 4);
        let lines = files::read_lines_at(&w.journal_path(), &w.lines()[1..]).unwrap();
        let samples: Vec<u32> = lines
            .iter()
            .map(|l| serde_json::from_slice::<Row>(l).unwrap().sample_index)
            .collect();
        assert_eq!(samples, [1, 2, 3]);
        // Read everything back: four distinct keys, as the report reads them.
        let mut keys = BTreeSet::new();
        files::read_rows(dir.path(), |r: Row| -> Result<(), OutputError> {
            assert!(keys.insert(r.key()));
            Ok(())
        })
        .unwrap();
        assert_eq!(keys.len(), 4);
        drop(w);
        // A journal shorter than what the manifest says is in parts: refused, not guessed at.
        let journal = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("journal.jsonl"))
            .unwrap();
        journal.set_len(10).unwrap();
        let err = OutputWriter::open(dir.path(), &run("run3", "digest"), true, 2)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("changed by hand"), "{err}");
    }

    /// A corrupt line anywhere but at the end stops a resume with the file and line, and
    /// leaves the folder as it was; `repair` moves the line aside and the resume goes on
    /// with every other row.
    #[test]
    fn a_corrupt_journal_line_stops_resume_until_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = OutputWriter::open(dir.path(), &run("run1", "digest"), false, 100).unwrap();
        for i in 0..5 {
            w.append(row("t", i, "passed")).unwrap();
        }
        drop(w);
        let path = dir.path().join("journal.jsonl");
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        let second = lines[1].replacen('{', "{{oops", 1);
        lines[1] = &second;
        let corrupt = format!("{}\n", lines.join("\n"));
        std::fs::write(&path, &corrupt).unwrap();
        let err = OutputWriter::open(dir.path(), &run("run2", "digest"), true, 100)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("journal.jsonl:2: not a record") && err.contains("farm repair"),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), corrupt, "nothing changed");
        let repaired = files::repair(dir.path(), |_| true).unwrap();
        assert_eq!(repaired[0].bad_lines, [2]);
        let w = OutputWriter::open(dir.path(), &run("run2", "digest"), true, 100).unwrap();
        assert_eq!(w.rows(), 4, "every other row is kept");
        // The kept lines are chained again, over the gap.
        let (mut previous, mut lines) = (String::new(), 0);
        for line in std::fs::read(&path).unwrap().split_inclusive(|b| *b == b'\n') {
            previous = chain::verify(&previous, line).unwrap();
            lines += 1;
        }
        assert_eq!(lines, 4);
        assert!(
            !w.done().contains(&row("t", 1, "passed").key()),
            "the quarantined rollout runs again"
        );
        assert!(std::fs::read_to_string(dir.path().join("journal.jsonl.quarantine"))
            .unwrap()
            .contains("{oops"));
    }

    #[test]
    fn a_manifest_of_another_format_is_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        drop(OutputWriter::open(dir.path(), &run("run1", "digest"), false, 100).unwrap());
        let path = dir.path().join("manifest.json");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("\"format_version\": 2", "\"format_version\": 7")).unwrap();
        let err = OutputWriter::open(dir.path(), &run("run2", "digest"), true, 100)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("format 7") && err.contains("newer"), "{err}");
        std::fs::write(&path, text.replace("\"format_version\": 2", "\"format_version\": 0")).unwrap();
        let err = OutputWriter::open(dir.path(), &run("run2", "digest"), true, 100)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("format 0") && err.contains("older farm"), "{err}");
        // Format 1 (before part checksums and plans) is read, and resumed in format 2.
        std::fs::write(&path, text.replace("\"format_version\": 2", "\"format_version\": 1")).unwrap();
        drop(OutputWriter::open(dir.path(), &run("run2", "digest"), true, 100).unwrap());
        assert_eq!(Manifest::load(dir.path()).unwrap().format_version, FORMAT_VERSION);
    }
}
