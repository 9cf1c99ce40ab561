//! Task tables (JSONL, Parquet) and the HumanEval format.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::{AnswerMatch, DatasetError, Harness, Solution, Task, TaskFile, TestUser, HARNESS_DIR};

/// One row of a task table. In JSONL every field is native JSON; in Parquet the columns
/// `files`, `setup`, `tests`, `solution`, `answer_match` and `metadata` hold JSON text.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskRow {
    pub id: String,
    #[serde(default)]
    pub instruction: String,
    /// Workspace path -> text.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    #[serde(default)]
    pub setup: Vec<String>,
    /// Test path (under /opt/farm-tests) -> text.
    #[serde(default)]
    pub tests: BTreeMap<String, String>,
    #[serde(default)]
    pub test_command: Option<String>,
    #[serde(default)]
    pub test_user: TestUser,
    /// Tests that call the candidate's function through farm's function-call harness
    /// (instead of a test command).
    #[serde(default)]
    pub function_call: Option<FunctionCallRow>,
    /// Unit tests (the `test_*.py` files of `tests`) run through farm's boundary: the
    /// modules named here are proxies of the candidate's (instead of a test command).
    #[serde(default)]
    pub unit_tests: Option<UnitTestsRow>,
    #[serde(default)]
    pub solution: Option<SolutionRow>,
    #[serde(default)]
    pub expected_answer: Option<String>,
    #[serde(default)]
    pub answer_match: AnswerMatch,
    #[serde(default = "yes")]
    pub require_reward_file: bool,
    #[serde(default)]
    pub metadata: serde_json::Value,
}

pub(crate) fn yes() -> bool {
    true
}

/// Function-call tests: `check(candidate)` from `test` is called with a proxy of
/// `entry_point` from the workspace file `<module>.py`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionCallRow {
    #[serde(default = "default_module")]
    pub module: String,
    pub entry_point: String,
    /// Source that defines `check(candidate)`.
    pub test: String,
    /// Trusted source run in the checker before the tests (imports, helpers they call).
    #[serde(default)]
    pub prompt: String,
}

fn default_module() -> String {
    "solution".into()
}

/// Unit tests through the boundary: `modules` are the workspace files (`<module>.py`) the
/// tests import, each a proxy of the candidate's module.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnitTestsRow {
    #[serde(default = "default_modules")]
    pub modules: Vec<String>,
}

fn default_modules() -> Vec<String> {
    vec![default_module()]
}

/// Why a task's row (or `task.toml`) does not make a task.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowError {
    #[error("{0}")]
    Json(String),
    #[error("function_call, unit_tests and test_command are alternatives: give one")]
    Alternatives,
    #[error("{key} {module:?} must be a Python module name (the file is MODULE.py in the workspace)")]
    Module { key: &'static str, module: String },
    #[error("unit_tests.modules must name at least one module")]
    NoModules,
    #[error("unit tests need at least one test file (test_*.py or *_test.py) directly in tests")]
    NoTestFile,
    #[error("tests may not hold {0} (farm writes it)")]
    Reserved(&'static str),
    #[error("the task has an empty id")]
    EmptyId,
    #[error("task {id:?}: file path {file:?} must be relative and stay inside its folder")]
    PathOutside { id: String, file: String },
}

/// Checks a unit-test task's modules and test files, and adds the harness to its tests.
pub(crate) fn unit_tests_harness(modules: Vec<String>, tests: &mut Vec<TaskFile>) -> Result<Harness, RowError> {
    if modules.is_empty() {
        return Err(RowError::NoModules);
    }
    if let Some(bad) = modules.iter().find(|m| !crate::valid_module_name(m)) {
        return Err(RowError::Module {
            key: "unit_tests.modules:",
            module: bad.clone(),
        });
    }
    if !tests.iter().any(|t| crate::is_unit_test_file(&t.path)) {
        return Err(RowError::NoTestFile);
    }
    if tests.iter().any(|t| t.path.starts_with(crate::HARNESS_DIR)) {
        return Err(RowError::Reserved(crate::HARNESS_DIR));
    }
    tests.extend(crate::harness_files());
    Ok(Harness::UnitTests { modules })
}

/// The hidden test files of a function-call task: the harness and the problem it reads.
pub(crate) fn function_call_tests(prompt: &str, test: &str, entry_point: &str) -> Vec<TaskFile> {
    let problem = serde_json::json!({ "prompt": prompt, "test": test, "entry_point": entry_point });
    let mut files = crate::harness_files();
    files.push(TaskFile::text("problem.json", problem.to_string()));
    files
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SolutionRow {
    /// Path (relative: in the workspace) -> text.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    #[serde(default)]
    pub commands: Vec<String>,
    #[serde(default)]
    pub answer: Option<String>,
}

impl TaskRow {
    /// The task, or why the row is inconsistent.
    pub fn into_task(self) -> Result<Task, RowError> {
        let files = |m: BTreeMap<String, String>| m.into_iter().map(|(p, c)| TaskFile::text(p, c)).collect::<Vec<_>>();
        let mut tests = files(self.tests);
        let alternatives = [
            self.function_call.is_some(),
            self.unit_tests.is_some(),
            self.test_command.is_some(),
        ];
        if alternatives.iter().filter(|given| **given).count() > 1 {
            return Err(RowError::Alternatives);
        }
        if let Some(units) = self.unit_tests {
            let harness = unit_tests_harness(units.modules, &mut tests)?;
            let row = TaskRow {
                tests: BTreeMap::new(),
                function_call: None,
                unit_tests: None,
                ..self
            };
            return Ok(row.task(tests, Some(harness), TestUser::Root));
        }
        let (harness, test_user) = match self.function_call {
            Some(call) => {
                if !crate::valid_module_name(&call.module) {
                    return Err(RowError::Module {
                        key: "function_call.module",
                        module: call.module,
                    });
                }
                if tests.iter().any(|t| t.path.starts_with(HARNESS_DIR)) {
                    return Err(RowError::Reserved(HARNESS_DIR));
                }
                if tests.iter().any(|t| t.path == "problem.json") {
                    return Err(RowError::Reserved("problem.json"));
                }
                tests.extend(function_call_tests(&call.prompt, &call.test, &call.entry_point));
                (
                    Some(Harness::FunctionCall {
                        module: call.module,
                        entry_point: call.entry_point,
                    }),
                    TestUser::Root,
                )
            }
            None => (None, self.test_user),
        };
        let row = TaskRow {
            tests: BTreeMap::new(),
            function_call: None,
            unit_tests: None,
            ..self
        };
        Ok(row.task(tests, harness, test_user))
    }

    fn task(self, tests: Vec<TaskFile>, harness: Option<Harness>, test_user: TestUser) -> Task {
        let files = |m: BTreeMap<String, String>| m.into_iter().map(|(p, c)| TaskFile::text(p, c)).collect::<Vec<_>>();
        let row = self;
        Task {
            id: row.id,
            instruction: row.instruction,
            files: files(row.files),
            setup: row.setup,
            tests,
            test_command: row.test_command,
            test_user,
            harness,
            solution: row.solution.map(|s| Solution {
                files: files(s.files),
                commands: s.commands,
                answer: s.answer,
            }),
            expected_answer: row.expected_answer,
            answer_match: row.answer_match,
            completion_file: None,
            completion_prefix: String::new(),
            require_reward_file: row.require_reward_file,
            metadata: row.metadata,
            harbor: None,
        }
    }
}

fn read(path: &Path) -> Result<String, DatasetError> {
    std::fs::read_to_string(path).map_err(|source| DatasetError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses each non-empty line of a JSONL file as `T`.
fn jsonl<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Vec<(usize, T)>, DatasetError> {
    let text = read(path)?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let row = serde_json::from_str(line).map_err(|e| DatasetError::Line {
            path: path.to_path_buf(),
            line: i + 1,
            message: e.to_string(),
        })?;
        rows.push((i + 1, row));
    }
    Ok(rows)
}

pub fn load_jsonl(path: &Path) -> Result<Vec<Task>, DatasetError> {
    jsonl::<TaskRow>(path)?
        .into_iter()
        .map(|(line, row)| {
            row.into_task().map_err(|e| DatasetError::Line {
                path: path.to_path_buf(),
                line,
                message: e.to_string(),
            })
        })
        .collect()
}

/// A HumanEval problem.
#[derive(Debug, Deserialize)]
struct HumanEvalRow {
    task_id: String,
    prompt: String,
    canonical_solution: String,
    test: String,
    entry_point: String,
}

pub fn load_humaneval(path: &Path) -> Result<Vec<Task>, DatasetError> {
    let rows = jsonl::<serde_json::Value>(path)?;
    let mut tasks = Vec::new();
    for (line, value) in rows {
        let row: HumanEvalRow = serde_json::from_value(value).map_err(|e| DatasetError::Line {
            path: path.to_path_buf(),
            line,
            message: format!("{e} (HumanEval rows have task_id, prompt, canonical_solution, test, entry_point)"),
        })?;
        tasks.push(humaneval_task(row));
    }
    Ok(tasks)
}

fn humaneval_task(row: HumanEvalRow) -> Task {
    // The tests run in farm's function-call harness: check() in a trusted process, the
    // candidate's module in an unprivileged one, only plain data between them.
    Task {
        instruction: format!(
            "Complete the Python function below. Write the whole module (the prompt followed by \
             your completion) to /workspace/solution.py.\n\n{}",
            row.prompt
        ),
        files: vec![TaskFile::text("solution.py", row.prompt.clone())],
        setup: Vec::new(),
        tests: function_call_tests(&row.prompt, &row.test, &row.entry_point),
        test_command: None,
        test_user: TestUser::Root,
        harness: Some(Harness::FunctionCall {
            module: "solution".into(),
            entry_point: row.entry_point.clone(),
        }),
        solution: Some(Solution {
            files: vec![TaskFile::text(
                "solution.py",
                format!("{}{}", row.prompt, row.canonical_solution),
            )],
            commands: Vec::new(),
            answer: None,
        }),
        expected_answer: None,
        answer_match: AnswerMatch::Exact,
        completion_file: Some("solution.py".into()),
        completion_prefix: row.prompt,
        require_reward_file: true,
        metadata: serde_json::json!({ "entry_point": row.entry_point }),
        harbor: None,
        id: row.task_id,
    }
}

/// Parquet columns, all text (complex ones JSON-encoded).
#[derive(Debug, Deserialize)]
struct ParquetRow {
    id: String,
    #[serde(default)]
    instruction: Option<String>,
    #[serde(default)]
    files: Option<String>,
    #[serde(default)]
    setup: Option<String>,
    #[serde(default)]
    tests: Option<String>,
    #[serde(default)]
    test_command: Option<String>,
    #[serde(default)]
    test_user: Option<String>,
    #[serde(default)]
    solution: Option<String>,
    #[serde(default)]
    expected_answer: Option<String>,
    #[serde(default)]
    answer_match: Option<String>,
    #[serde(default)]
    function_call: Option<String>,
    #[serde(default)]
    require_reward_file: Option<bool>,
    #[serde(default)]
    metadata: Option<String>,
}

pub fn load_parquet(path: &Path) -> Result<Vec<Task>, DatasetError> {
    let invalid = |message: String| DatasetError::Invalid {
        path: path.to_path_buf(),
        message,
    };
    let file = std::fs::File::open(path).map_err(|source| DatasetError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| invalid(format!("not a Parquet file: {e}")))?
        .build()
        .map_err(|e| invalid(e.to_string()))?;
    let mut tasks = Vec::new();
    let mut row_number = 0usize;
    for batch in reader {
        let batch = batch.map_err(|e| invalid(e.to_string()))?;
        let rows: Vec<ParquetRow> = serde_arrow::from_record_batch(&batch)
            .map_err(|e| invalid(format!("columns do not match the task table (id, instruction, files, setup, tests, test_command, solution, expected_answer, answer_match, metadata as strings): {e}")))?;
        for row in rows {
            row_number += 1;
            let line = row_number;
            let field = |name: &str, text: Option<String>| -> Result<serde_json::Value, DatasetError> {
                match text {
                    None => Ok(serde_json::Value::Null),
                    Some(t) => serde_json::from_str(&t).map_err(|e| DatasetError::Line {
                        path: path.to_path_buf(),
                        line,
                        message: format!("column {name} is not valid JSON: {e}"),
                    }),
                }
            };
            let mut object = serde_json::Map::new();
            object.insert("id".into(), row.id.into());
            if let Some(i) = row.instruction {
                object.insert("instruction".into(), i.into());
            }
            for (name, text) in [
                ("files", row.files),
                ("setup", row.setup),
                ("tests", row.tests),
                ("solution", row.solution),
                ("answer_match", row.answer_match),
                ("function_call", row.function_call),
                ("metadata", row.metadata),
            ] {
                let value = field(name, text)?;
                if !value.is_null() {
                    object.insert(name.into(), value);
                }
            }
            if let Some(c) = row.test_command {
                object.insert("test_command".into(), c.into());
            }
            if let Some(a) = row.expected_answer {
                object.insert("expected_answer".into(), a.into());
            }
            if let Some(u) = row.test_user {
                object.insert("test_user".into(), u.into());
            }
            if let Some(r) = row.require_reward_file {
                object.insert("require_reward_file".into(), r.into());
            }
            let task_row: TaskRow =
                serde_json::from_value(serde_json::Value::Object(object)).map_err(|e| DatasetError::Line {
                    path: path.to_path_buf(),
                    line,
                    message: e.to_string(),
                })?;
            tasks.push(task_row.into_task().map_err(|e| DatasetError::Line {
                path: path.to_path_buf(),
                line,
                message: e.to_string(),
            })?);
        }
    }
    Ok(tasks)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{load, Format};

    pub fn sample_task() -> Task {
        humaneval_task(HumanEvalRow {
            task_id: "t/0".into(),
            prompt: "def f(x):\n".into(),
            canonical_solution: "    return x\n".into(),
            test: "def check(c):\n    assert c(1) == 1\n".into(),
            entry_point: "f".into(),
        })
    }

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn humaneval_rows_become_tasks_with_hidden_tests() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            "he.jsonl",
            r#"{"task_id":"X/1","prompt":"def f():\n","canonical_solution":"    return 1\n","test":"def check(c):\n    assert c() == 1\n","entry_point":"f"}"#,
        );
        let tasks = load(&p, Format::Humaneval).unwrap();
        assert_eq!(tasks.len(), 1);
        let t = &tasks[0];
        assert_eq!(t.id, "X/1");
        assert_eq!(t.tests[0].path, crate::HARNESS_TEST_FILE);
        let problem = t.tests.iter().find(|f| f.path == "problem.json").unwrap();
        let problem: serde_json::Value = serde_json::from_slice(&problem.contents).unwrap();
        assert_eq!(problem["entry_point"], "f");
        assert!(problem["test"].as_str().unwrap().contains("def check(c)"));
        assert_eq!(
            t.solution.as_ref().unwrap().files[0].contents,
            b"def f():\n    return 1\n"
        );
        assert_eq!(
            t.harness,
            Some(Harness::FunctionCall {
                module: "solution".into(),
                entry_point: "f".into()
            })
        );
        // One small file: no snapshot of its own, the file goes into each fork.
        assert!(!t.needs_snapshot() && t.files_in_forks());
        assert_eq!(t.test_user, TestUser::Root);
        assert!(t.require_reward_file && t.has_tests() && t.test_command.is_none());
    }

    #[test]
    fn bad_lines_name_the_file_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "he.jsonl", "{\"task_id\":\"a\",\"prompt\":\"\",\"canonical_solution\":\"\",\"test\":\"\",\"entry_point\":\"f\"}\n\n{\"task_id\":\"b\"}\n");
        let err = load(&p, Format::Humaneval).unwrap_err().to_string();
        assert!(err.contains("he.jsonl:3") && err.contains("prompt"), "{err}");
        let p = write(dir.path(), "t.jsonl", "{\"id\":\"a\",\"instructoin\":\"x\"}\n");
        let err = load(&p, Format::Jsonl).unwrap_err().to_string();
        assert!(err.contains("t.jsonl:1") && err.contains("instructoin"), "{err}");
        let p = write(dir.path(), "t.jsonl", "not json\n");
        assert!(load(&p, Format::Jsonl).unwrap_err().to_string().contains("t.jsonl:1"));
    }

    #[test]
    fn duplicate_ids_and_escaping_paths_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "t.jsonl", "{\"id\":\"a\"}\n{\"id\":\"a\"}\n");
        assert!(load(&p, Format::Jsonl)
            .unwrap_err()
            .to_string()
            .contains("duplicate task id"));
        let p = write(
            dir.path(),
            "t.jsonl",
            "{\"id\":\"a\",\"files\":{\"../../etc/passwd\":\"x\"}}\n",
        );
        assert!(load(&p, Format::Jsonl)
            .unwrap_err()
            .to_string()
            .contains("must be relative"));
        let p = write(dir.path(), "t.jsonl", "\n");
        assert!(load(&p, Format::Jsonl).unwrap_err().to_string().contains("no tasks"));
    }

    #[test]
    fn jsonl_task_table_with_every_field() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            "t.jsonl",
            r#"{"id":"q1","instruction":"2+2?","expected_answer":"4","answer_match":{"kind":"numeric","tolerance":0.01},"files":{"a.txt":"A"},"setup":["true"],"tests":{"t.sh":"exit 0"},"test_command":"sh /opt/farm-tests/t.sh","solution":{"answer":"4.0"},"metadata":{"level":1}}"#,
        );
        let t = &load(&p, Format::Jsonl).unwrap()[0];
        assert!(t.require_reward_file, "on unless a task turns it off");
        assert_eq!(t.test_user, TestUser::Candidate);
        assert_eq!(t.answer_match, AnswerMatch::Numeric { tolerance: 0.01 });
        assert_eq!(t.files[0].path, "a.txt");
        assert_eq!(t.solution.as_ref().unwrap().answer.as_deref(), Some("4.0"));
        assert!(t.needs_snapshot());
    }

    #[test]
    fn unit_test_rows_use_the_harness_and_name_what_is_wrong() {
        let row = |json: serde_json::Value| serde_json::from_value::<TaskRow>(json).unwrap().into_task();
        let t = row(
            serde_json::json!({"id": "u", "tests": {"test_stack.py": "from solution import Stack"}, "unit_tests": {}}),
        )
        .unwrap();
        assert_eq!(
            t.harness,
            Some(Harness::UnitTests {
                modules: vec!["solution".into()]
            })
        );
        assert_eq!(t.test_user, TestUser::Root);
        assert!(t.tests.iter().any(|f| f.path == crate::HARNESS_TEST_FILE) && t.has_tests());
        let err = row(serde_json::json!({"id": "u", "tests": {"helper.py": ""}, "unit_tests": {}}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("test_*.py"), "{err}");
        let err =
            row(serde_json::json!({"id": "u", "tests": {"test_a.py": ""}, "unit_tests": {"modules": ["my-mod"]}}))
                .unwrap_err()
                .to_string();
        assert!(err.contains("\"my-mod\""), "{err}");
        let err =
            row(serde_json::json!({"id": "u", "tests": {"test_a.py": ""}, "unit_tests": {}, "test_command": "pytest"}))
                .unwrap_err()
                .to_string();
        assert!(err.contains("alternatives"), "{err}");
    }

    #[test]
    fn function_call_rows_use_the_harness() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            "t.jsonl",
            r#"{"id":"f1","files":{"lib.py":"def double(x):\n    pass\n"},"function_call":{"module":"lib","entry_point":"double","test":"def check(c):\n    assert c(2) == 4\n"}}"#,
        );
        let t = &load(&p, Format::Jsonl).unwrap()[0];
        assert_eq!(
            t.harness,
            Some(Harness::FunctionCall {
                module: "lib".into(),
                entry_point: "double".into()
            })
        );
        assert_eq!(t.test_user, TestUser::Root);
        assert!(t.tests.iter().any(|f| f.path == crate::HARNESS_TEST_FILE) && t.has_tests());
        let p = write(
            dir.path(),
            "t.jsonl",
            r#"{"id":"f2","test_command":"true","function_call":{"entry_point":"f","test":""}}"#,
        );
        let err = load(&p, Format::Jsonl).unwrap_err().to_string();
        assert!(err.contains("t.jsonl:1") && err.contains("alternatives"), "{err}");
        let p = write(
            dir.path(),
            "t.jsonl",
            r#"{"id":"f3","function_call":{"module":"../x","entry_point":"f","test":""}}"#,
        );
        assert!(load(&p, Format::Jsonl).unwrap_err().to_string().contains("module name"));
    }

    #[test]
    fn parquet_task_table_round_trip() {
        use arrow_array::{ArrayRef, RecordBatch, StringArray};
        use std::sync::Arc;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.parquet");
        let col = |v: Vec<Option<&str>>| Arc::new(StringArray::from(v)) as ArrayRef;
        let batch = RecordBatch::try_from_iter(vec![
            ("id", col(vec![Some("p1"), Some("p2")])),
            ("instruction", col(vec![Some("say hi"), None])),
            ("tests", col(vec![Some(r#"{"t.sh":"exit 0"}"#), None])),
            ("test_command", col(vec![Some("sh /opt/farm-tests/t.sh"), None])),
            ("expected_answer", col(vec![None, Some("42")])),
        ])
        .unwrap();
        let file = std::fs::File::create(&p).unwrap();
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let tasks = load(&p, Format::Parquet).unwrap();
        assert_eq!(tasks.len(), 2);
        assert_eq!(tasks[0].tests[0].path, "t.sh");
        assert_eq!(tasks[1].expected_answer.as_deref(), Some("42"));
    }
}
