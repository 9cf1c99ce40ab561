//! Task folders:
//!
//! ```text
//! DATASET/
//!   <task>/
//!     instruction.md   required: what the agent is asked to do
//!     task.toml        optional: id, test_command, test_user, expected_answer,
//!                      answer_match, require_reward_file (default true), metadata
//!     files/           copied into /workspace before setup
//!     setup.sh         run in /workspace when the task snapshot is made
//!     tests/           hidden tests, written to /opt/farm-tests in the scoring VM only
//!     solution/        the reference solution: written to /opt/farm-solution, then
//!                      solve.sh (if present) runs in /workspace; answer.txt is the answer
//! ```

use std::path::Path;

use serde::Deserialize;

use crate::{AnswerMatch, DatasetError, Solution, Task, TaskFile, TestUser, SOLUTION_DIR, TESTS_DIR};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskToml {
    id: Option<String>,
    test_command: Option<String>,
    #[serde(default)]
    test_user: TestUser,
    expected_answer: Option<String>,
    #[serde(default)]
    answer_match: AnswerMatch,
    #[serde(default = "crate::table::yes")]
    require_reward_file: bool,
    #[serde(default)]
    metadata: toml::Table,
    /// Unit tests (the `test_*.py` files of `tests/`) run through farm's boundary, with
    /// these workspace modules as proxies: `[unit_tests] modules = ["solution"]`.
    unit_tests: Option<UnitTestsToml>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UnitTestsToml {
    #[serde(default = "default_modules")]
    modules: Vec<String>,
}

fn default_modules() -> Vec<String> {
    vec!["solution".into()]
}

/// Most bytes read from one task folder (files, tests, solution together).
const MAX_TASK_BYTES: u64 = 64 << 20;

pub fn load_task_dirs(root: &Path) -> Result<Vec<Task>, DatasetError> {
    task_folders(root)?.iter().map(|dir| load_task_dir(dir)).collect()
}

/// The folders of a dataset folder, in name order.
pub(crate) fn task_folders(root: &Path) -> Result<Vec<std::path::PathBuf>, DatasetError> {
    let read_dir = std::fs::read_dir(root).map_err(|source| DatasetError::Read {
        path: root.to_path_buf(),
        source,
    })?;
    let mut dirs: Vec<_> = read_dir.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    dirs.sort();
    Ok(dirs)
}

fn load_task_dir(dir: &Path) -> Result<Task, DatasetError> {
    let invalid = |message: String| DatasetError::Invalid {
        path: dir.to_path_buf(),
        message,
    };
    let instruction_path = dir.join("instruction.md");
    let instruction = std::fs::read_to_string(&instruction_path)
        .map_err(|e| invalid(format!("instruction.md: {e} (every task folder needs one)")))?;
    let config: TaskToml = match std::fs::read_to_string(dir.join("task.toml")) {
        Ok(text) => toml::from_str(&text).map_err(|e| invalid(format!("task.toml: {e}")))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => toml::from_str("").expect("every key has a default"),
        Err(e) => return Err(invalid(format!("task.toml: {e}"))),
    };
    let mut budget = MAX_TASK_BYTES;
    let mut files = read_tree(&dir.join("files"), &mut budget).map_err(|e| invalid(format!("files/: {e}")))?;
    let mut tests = read_tree(&dir.join("tests"), &mut budget).map_err(|e| invalid(format!("tests/: {e}")))?;
    let solution_files =
        read_tree(&dir.join("solution"), &mut budget).map_err(|e| invalid(format!("solution/: {e}")))?;
    let setup = setup_script(dir, &mut files).map_err(|e| invalid(format!("setup.sh: {e}")))?;
    let (harness, test_user) = match config.unit_tests {
        Some(_) if config.test_command.is_some() => {
            return Err(invalid(
                "task.toml: unit_tests and test_command are alternatives: give one".into(),
            ))
        }
        Some(units) => (
            Some(
                crate::table::unit_tests_harness(units.modules, &mut tests)
                    .map_err(|e| invalid(format!("task.toml: {e}")))?,
            ),
            TestUser::Root,
        ),
        None => (None, config.test_user),
    };
    let test_command = match config.test_command {
        _ if harness.is_some() => None,
        Some(c) => Some(c),
        None if tests.iter().any(|t| t.path == "run.sh") => Some(format!("sh {TESTS_DIR}/run.sh")),
        None if config.expected_answer.is_some() => None,
        None if tests.is_empty() => None,
        None => {
            return Err(invalid(
                "tests/ has no run.sh and task.toml sets no test_command".into(),
            ))
        }
    };
    let solution = reference_solution(solution_files);
    let id = config.id.unwrap_or_else(|| {
        dir.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    let metadata = serde_json::to_value(&config.metadata).unwrap_or(serde_json::Value::Null);
    Ok(Task {
        id,
        instruction,
        files,
        setup,
        tests,
        test_command,
        test_user,
        harness,
        solution,
        expected_answer: config.expected_answer,
        answer_match: config.answer_match,
        completion_file: None,
        completion_prefix: String::new(),
        require_reward_file: config.require_reward_file,
        metadata,
        harbor: None,
    })
}

/// The setup commands: when the folder has a setup.sh, it goes into the workspace with the
/// files (pushed onto `files`), and the one command runs it and removes it.
fn setup_script(dir: &Path, files: &mut Vec<TaskFile>) -> std::io::Result<Vec<String>> {
    let setup = match std::fs::read_to_string(dir.join("setup.sh")) {
        Ok(_) => vec![format!(
            "sh {}/.farm-setup.sh && rm -f {}/.farm-setup.sh",
            crate::WORKSPACE,
            crate::WORKSPACE
        )],
        Err(_) => Vec::new(),
    };
    if !setup.is_empty() {
        let script = std::fs::read(dir.join("setup.sh"))?;
        files.push(TaskFile {
            path: ".farm-setup.sh".into(),
            contents: script,
            mode: 0o755,
        });
    }
    Ok(setup)
}

/// The reference solution from the files of `solution/` (none when it is empty): they go
/// under [`SOLUTION_DIR`], solve.sh (if present) is its command, answer.txt its answer.
fn reference_solution(solution_files: Vec<TaskFile>) -> Option<Solution> {
    if solution_files.is_empty() {
        return None;
    }
    let answer = solution_files
        .iter()
        .find(|f| f.path == "answer.txt")
        .map(|f| String::from_utf8_lossy(&f.contents).trim().to_string());
    let has_script = solution_files.iter().any(|f| f.path == "solve.sh");
    Some(Solution {
        files: solution_files
            .into_iter()
            .map(|f| TaskFile {
                path: format!("{SOLUTION_DIR}/{}", f.path),
                ..f
            })
            .collect(),
        commands: if has_script {
            vec![format!("sh {SOLUTION_DIR}/solve.sh")]
        } else {
            Vec::new()
        },
        answer,
    })
}

/// Reads every regular file under `dir` (relative paths, modes kept); a missing folder is empty.
pub(crate) fn read_tree(dir: &Path, budget: &mut u64) -> std::io::Result<Vec<TaskFile>> {
    let mut out = Vec::new();
    if dir.is_dir() {
        walk(dir, dir, budget, &mut out)?;
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn walk(root: &Path, dir: &Path, budget: &mut u64, out: &mut Vec<TaskFile>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_dir() {
            walk(root, &entry.path(), budget, out)?;
        } else if meta.is_file() {
            if meta.len() > *budget {
                return Err(std::io::Error::other(format!(
                    "task files exceed {} MiB",
                    MAX_TASK_BYTES >> 20
                )));
            }
            *budget -= meta.len();
            let rel = entry
                .path()
                .strip_prefix(root)
                .expect("under root")
                .to_string_lossy()
                .into_owned();
            out.push(TaskFile {
                path: rel,
                contents: std::fs::read(entry.path())?,
                mode: meta.permissions().mode() & 0o777,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    use crate::{load, Format};

    #[test]
    fn a_task_folder_becomes_a_task() {
        let root = tempfile::tempdir().unwrap();
        let t = root.path().join("add");
        for d in ["files", "tests", "solution"] {
            std::fs::create_dir_all(t.join(d)).unwrap();
        }
        std::fs::write(t.join("instruction.md"), "Write add().").unwrap();
        std::fs::write(t.join("files/add.py"), "def add(a, b):\n    pass\n").unwrap();
        std::fs::write(t.join("setup.sh"), "echo ready > marker").unwrap();
        std::fs::write(
            t.join("tests/run.sh"),
            "python3 -c 'from add import add; assert add(1,2)==3'",
        )
        .unwrap();
        std::fs::write(
            t.join("solution/solve.sh"),
            "printf 'def add(a, b):\\n    return a + b\\n' > add.py",
        )
        .unwrap();
        std::fs::write(t.join("task.toml"), "[metadata]\ndifficulty = \"easy\"\n").unwrap();
        let tasks = load(root.path(), Format::TaskDirs).unwrap();
        let task = &tasks[0];
        assert_eq!(task.id, "add");
        assert_eq!(task.test_command.as_deref(), Some("sh /opt/farm-tests/run.sh"));
        assert!(task.needs_snapshot());
        assert_eq!(task.setup.len(), 1);
        let solution = task.solution.as_ref().unwrap();
        assert_eq!(solution.commands, ["sh /opt/farm-solution/solve.sh"]);
        assert_eq!(task.metadata["difficulty"], "easy");
    }

    #[test]
    fn a_folder_without_instruction_is_named_in_the_error() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("broken")).unwrap();
        let err = load(root.path(), Format::TaskDirs).unwrap_err().to_string();
        assert!(err.contains("broken") && err.contains("instruction.md"), "{err}");
    }
}
