//! The recorder: the one owner of every write of a run folder. The journal (fsynced), the
//! Parquet parts, the manifest, `summary.json`, `farm serve`'s `requests.jsonl` and the
//! row metrics are all written by one thread of its own, fed by a channel; callers on the
//! async runtime await a reply and never block on the file system, and no lock is held
//! across I/O (readers copy a row's position under a short lock, then read the journal
//! themselves, off the runtime).
//!
//! Files and formats: [`files`]. Reading journals safely: [`journal`]. Rows: [`row`].

pub mod chain;
pub mod files;
pub mod journal;
pub mod summary;
mod writer;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};

pub use crate::row::*;
pub use files::{read_lines_at, read_rows, Manifest, OutputError, Plan};
use writer::OutputWriter;
pub use writer::RunIdentity;

/// A new run's id: `run-` and 48 bits of a digest of the time and the process.
pub fn new_run_id() -> String {
    use sha2::{Digest, Sha256};
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let digest = Sha256::digest(format!("{nanos}-{}", std::process::id()).as_bytes());
    format!(
        "run-{}",
        digest.iter().take(6).map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// How a recorder is opened.
#[derive(Debug, Clone)]
pub struct RecorderOptions {
    /// Rows per Parquet part (a part is also written on `flush`).
    pub rows_per_part: usize,
    /// Finish the unfinished run in the folder (`--resume`, and every `farm serve` start).
    pub resume: bool,
    /// `farm serve`'s request journal: appended to through [`Recorder::journal_request`],
    /// cut at `.1` bytes (its reader found a torn last line there).
    pub requests: Option<(PathBuf, u64)>,
}

/// What the folder held when the recorder opened it.
#[derive(Debug, Clone)]
pub struct Opened {
    pub run_id: String,
    /// Every recorded row's [`Row::key`].
    pub done: BTreeSet<String>,
    /// Every recorded row's outcome, in order (a row's index is its cursor).
    pub outcomes: Vec<Outcome>,
}

/// What a summary adds to the counts: where the run was made, and this session's speed.
#[derive(Debug, Clone)]
pub struct SummaryInputs {
    pub samples: u32,
    pub planned: usize,
    pub provenance: summary::Provenance,
    pub concurrency: usize,
    /// Wall time of this session's rollouts.
    pub wall: Duration,
    /// For `farm merge`: the shards the run was made of.
    pub merged: Option<summary::Merged>,
}

enum Command {
    Append(Box<Row>, oneshot::Sender<Result<usize, OutputError>>),
    AppendBatch(Vec<Row>, oneshot::Sender<Result<usize, OutputError>>),
    Request(Vec<u8>, oneshot::Sender<Result<(), OutputError>>),
    Flush(oneshot::Sender<Result<(), OutputError>>),
    Plan(Plan, oneshot::Sender<Result<(), OutputError>>),
    Summary(
        Box<SummaryInputs>,
        oneshot::Sender<Result<summary::Summary, OutputError>>,
    ),
}

/// State readers share with the recorder's thread.
struct Shared {
    /// Where each row's line is in the journal: copied under this short lock, read without it.
    lines: Mutex<Vec<(u64, u64)>>,
    rows: watch::Sender<usize>,
}

/// The handle callers use; the thread ends when the last handle is dropped, after flushing.
pub struct Recorder {
    commands: std::sync::mpsc::Sender<Command>,
    shared: Arc<Shared>,
    journal: PathBuf,
    schema: Arc<arrow_schema::Schema>,
    run_id: String,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The recorder's thread is gone (it panicked): nothing more can be recorded.
fn gone() -> OutputError {
    OutputError::Io {
        what: "recording in",
        path: PathBuf::from("the run folder"),
        source: std::io::Error::other("the recorder's thread is gone"),
    }
}

impl Recorder {
    /// Opens `dir` (see [`OutputWriter::open`]) on a blocking thread, and starts the
    /// recorder's own thread.
    pub async fn open(
        dir: &Path,
        run: RunIdentity,
        options: RecorderOptions,
    ) -> Result<(Recorder, Opened), OutputError> {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || Recorder::open_blocking(&dir, &run, options))
            .await
            .map_err(|_| gone())?
    }

    fn open_blocking(
        dir: &Path,
        run: &RunIdentity,
        options: RecorderOptions,
    ) -> Result<(Recorder, Opened), OutputError> {
        let writer = OutputWriter::open(dir, run, options.resume, options.rows_per_part)?;
        let requests = match &options.requests {
            Some((path, good_len)) => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(files::io("opening", path))?;
                file.set_len(*good_len)
                    .map_err(files::io("cutting the torn last line of", path))?;
                Some((path.clone(), file))
            }
            None => None,
        };
        let opened = Opened {
            run_id: writer.run_id().to_string(),
            done: writer.done().clone(),
            outcomes: writer.outcomes().to_vec(),
        };
        let (rows, _) = watch::channel(writer.rows());
        let shared = Arc::new(Shared {
            lines: Mutex::new(writer.lines().to_vec()),
            rows,
        });
        let (commands, inbox) = std::sync::mpsc::channel();
        let recorder = Recorder {
            commands,
            shared: shared.clone(),
            journal: writer.journal_path(),
            schema: writer.schema(),
            run_id: writer.run_id().to_string(),
            thread: Mutex::new(None),
        };
        let thread = std::thread::Builder::new()
            .name("farm-recorder".into())
            .spawn(move || run_thread(writer, requests, inbox, shared))
            .map_err(files::io("starting the recorder thread for", dir))?;
        *recorder.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(thread);
        Ok((recorder, opened))
    }

    async fn ask<T>(
        &self,
        command: impl FnOnce(oneshot::Sender<Result<T, OutputError>>) -> Command,
    ) -> Result<T, OutputError> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(command(reply)).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    /// Records a finished rollout durably (journal line fsynced, a part when enough are
    /// pending, its metrics); returns its cursor.
    pub async fn append(&self, row: Row) -> Result<usize, OutputError> {
        self.ask(|reply| Command::Append(Box::new(row), reply)).await
    }

    /// Records many rows with one fsync (`farm merge`): all of them, or none. Returns the
    /// first one's cursor.
    pub async fn append_batch(&self, rows: Vec<Row>) -> Result<usize, OutputError> {
        self.ask(|reply| Command::AppendBatch(rows, reply)).await
    }

    /// Appends a line to `farm serve`'s request journal, fsynced.
    pub async fn journal_request(&self, record: &impl serde::Serialize) -> Result<(), OutputError> {
        let mut line = serde_json::to_vec(record).expect("records serialize");
        line.push(b'\n');
        self.ask(|reply| Command::Request(line, reply)).await
    }

    /// Writes pending rows into a Parquet part.
    pub async fn flush(&self) -> Result<(), OutputError> {
        self.ask(Command::Flush).await
    }

    /// Records what the run plans (`plan.json`), which `farm merge` counts rows against.
    pub async fn record_plan(&self, plan: Plan) -> Result<(), OutputError> {
        self.ask(|reply| Command::Plan(plan, reply)).await
    }

    /// Flushes, then writes and returns `summary.json`: counts over every row of the run,
    /// plus `inputs`' provenance and this session's performance.
    pub async fn summarise(&self, inputs: SummaryInputs) -> Result<summary::Summary, OutputError> {
        self.ask(|reply| Command::Summary(Box::new(inputs), reply)).await
    }

    /// Rows recorded so far.
    pub fn rows(&self) -> usize {
        *self.shared.rows.borrow()
    }

    /// Watches the number of rows recorded (for long polls).
    pub fn subscribe(&self) -> watch::Receiver<usize> {
        self.shared.rows.subscribe()
    }

    /// The journal lines of rows `from..from + max`, at most `max_bytes` of them (one row at
    /// least), read off the async runtime.
    pub async fn read_lines(&self, from: usize, max: usize, max_bytes: u64) -> Result<Vec<Vec<u8>>, OutputError> {
        let index: Vec<(u64, u64)> = {
            let lines = self.shared.lines.lock().unwrap_or_else(|p| p.into_inner());
            let mut total = 0;
            let mut out = Vec::new();
            for &(offset, len) in lines.iter().skip(from).take(max) {
                if !out.is_empty() && total + len > max_bytes {
                    break;
                }
                total += len;
                out.push((offset, len));
            }
            out
        };
        let journal = self.journal.clone();
        tokio::task::spawn_blocking(move || read_lines_at(&journal, &index))
            .await
            .map_err(|_| gone())?
    }

    pub fn schema(&self) -> Arc<arrow_schema::Schema> {
        self.schema.clone()
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        // Closing the channel ends the thread, which flushes first; wait for it so the
        // last part is on disk when the owner goes.
        let (dead, _) = std::sync::mpsc::channel();
        self.commands = dead;
        if let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

/// The recorder's thread: every write of the run folder happens here, in order.
fn run_thread(
    mut writer: OutputWriter,
    mut requests: Option<(PathBuf, std::fs::File)>,
    inbox: std::sync::mpsc::Receiver<Command>,
    shared: Arc<Shared>,
) {
    let opened_rows = writer.rows();
    let mut write_time = Duration::ZERO;
    for command in inbox {
        let started = Instant::now();
        match command {
            Command::Append(row, reply) => {
                let row = *row;
                crate::metrics::get().record(&row);
                let result = writer.append(row);
                if result.is_ok() {
                    let line = *writer.lines().last().expect("just appended");
                    shared.lines.lock().unwrap_or_else(|p| p.into_inner()).push(line);
                    // send_replace: the count is kept even when no reader waits right now.
                    shared.rows.send_replace(writer.rows());
                }
                let _ = reply.send(result);
            }
            Command::AppendBatch(rows, reply) => {
                for row in &rows {
                    crate::metrics::get().record(row);
                }
                let count = rows.len();
                let result = writer.append_batch(rows);
                if result.is_ok() {
                    let all = writer.lines();
                    shared
                        .lines
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend_from_slice(&all[all.len() - count..]);
                    shared.rows.send_replace(writer.rows());
                }
                let _ = reply.send(result);
            }
            Command::Request(line, reply) => {
                let _ = reply.send(append_request(&mut requests, &line));
            }
            Command::Flush(reply) => {
                let _ = reply.send(writer.flush());
            }
            Command::Plan(plan, reply) => {
                let _ = reply.send(writer.record_plan(&plan));
            }
            Command::Summary(inputs, reply) => {
                let _ = reply.send(write_summary(&mut writer, &inputs, opened_rows, write_time, started));
            }
        }
        write_time += started.elapsed();
    }
    if let Err(e) = writer.flush() {
        tracing::warn!("writing the last Parquet part failed (the rows are safe in journal.jsonl): {e}");
    }
}

/// Appends a line to `farm serve`'s request journal, synced before the answer.
fn append_request(requests: &mut Option<(PathBuf, std::fs::File)>, line: &[u8]) -> Result<(), OutputError> {
    match requests {
        Some((path, file)) => file
            .write_all(line)
            .and_then(|_| file.sync_data())
            .map_err(files::io("appending to", path)),
        None => Err(OutputError::Io {
            what: "appending to",
            path: PathBuf::from("requests.jsonl"),
            source: std::io::Error::other("this recorder keeps no request journal"),
        }),
    }
}

/// Flushes, then writes `summary.json` over every row; the performance is this session's
/// (the rows after the `opened_rows` the folder held, and the thread's write time so far,
/// this command's since `started` included).
fn write_summary(
    writer: &mut OutputWriter,
    inputs: &SummaryInputs,
    opened_rows: usize,
    write_time: Duration,
    started: Instant,
) -> Result<summary::Summary, OutputError> {
    writer.flush().and_then(|()| {
        let this_session = &writer.outcomes()[opened_rows.min(writer.outcomes().len())..];
        let mut value = summary::summary(writer.outcomes(), inputs.samples, inputs.planned);
        value.provenance = Some(inputs.provenance.clone());
        value.performance = Some(summary::performance(
            this_session,
            inputs.wall,
            write_time + started.elapsed(),
            inputs.concurrency,
        ));
        value.merged = inputs.merged.clone();
        writer.write_summary(&value).map(|()| value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recorder::summary::tests::row;

    /// A part written by a farm before the VM columns (`rollout_vm`, `scoring_vm`,
    /// `reset_error`) still reads, those fields null: `--resume` and `farm merge` of older
    /// runs keep working.
    #[test]
    fn parts_without_the_vm_columns_still_read() {
        let schema = files::schema();
        let rows = vec![row("t", 0, "passed")];
        let batch = serde_arrow::to_record_batch(schema.fields(), &rows).unwrap();
        let kept: Vec<usize> = (0..schema.fields().len())
            .filter(|&i| !["rollout_vm", "scoring_vm", "reset_error"].contains(&schema.field(i).name().as_str()))
            .collect();
        let older = batch.project(&kept).unwrap();
        assert_eq!(older.num_columns() + 3, batch.num_columns());
        let read: Vec<Row> = serde_arrow::from_record_batch(&older).unwrap();
        assert_eq!(read.len(), 1);
        assert_eq!(
            (read[0].rollout_vm, read[0].scoring_vm, read[0].reset_error.clone()),
            (None, None, None)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rows_are_recorded_in_order_and_read_back_off_the_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunIdentity {
            run_id: "run1".into(),
            suite_name: "s".into(),
            suite_digest: "d".into(),
            shard: None,
        };
        let requests = dir.path().join("requests.jsonl");
        let options = RecorderOptions {
            rows_per_part: 2,
            resume: false,
            requests: Some((requests.clone(), 0)),
        };
        let (recorder, opened) = Recorder::open(dir.path(), run.clone(), options.clone()).await.unwrap();
        assert!(opened.done.is_empty());
        let mut watch = recorder.subscribe();
        for i in 0..3 {
            assert_eq!(recorder.append(row("t", i, "passed")).await.unwrap(), i as usize);
        }
        watch.changed().await.unwrap();
        assert_eq!(*watch.borrow(), 3);
        assert!(
            recorder.append(row("t", 1, "passed")).await.is_err(),
            "a row is recorded once"
        );
        let lines = recorder.read_lines(1, 10, u64::MAX).await.unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            recorder.read_lines(0, 10, 1).await.unwrap().len(),
            1,
            "at least one row, whatever the byte cap"
        );
        recorder
            .journal_request(&serde_json::json!({"kind": "test"}))
            .await
            .unwrap();
        let provenance = summary::Provenance {
            host: "h".into(),
            ..Default::default()
        };
        let inputs = SummaryInputs {
            samples: 1,
            planned: 3,
            provenance,
            concurrency: 1,
            wall: Duration::from_secs(1),
            merged: None,
        };
        let summary = recorder.summarise(inputs).await.unwrap();
        assert_eq!((summary.finished, summary.provenance.unwrap().host.as_str()), (3, "h"));
        assert_eq!(summary.performance.unwrap().rollouts, 3);
        assert_eq!(
            summary::Summary::load(dir.path()).unwrap().finished,
            3,
            "summary.json reads back"
        );
        drop(recorder);
        assert_eq!(std::fs::read_to_string(&requests).unwrap(), "{\"kind\":\"test\"}\n");
        // Everything is in parts once the recorder is gone.
        let manifest = Manifest::load(dir.path()).unwrap();
        assert_eq!(manifest.parts.iter().map(|p| p.rows).sum::<usize>(), 3);
        let (again, opened) = Recorder::open(
            dir.path(),
            run,
            RecorderOptions {
                resume: true,
                ..options
            },
        )
        .await
        .unwrap();
        assert_eq!((opened.done.len(), again.rows()), (3, 3));
    }
}
