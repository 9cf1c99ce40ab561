//! One suite across many machines: `farm run --shard I/N`, `farm merge`, and the two engines
//! that run the shards (a real single-node Slurm, and the Kubernetes Job's container command
//! run locally). Every merge is compared with a single-process run of the same suite
//! (configs/scale-out.toml: 9 tasks, 2 samples each, on the minimal image).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn suite() -> PathBuf {
    repo().join("configs/scale-out.toml")
}

fn farm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_farm")).args(args).stdin(Stdio::null()).output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn run_shard(out: &Path, shard: &str, extra: &[&str]) -> Output {
    let suite = suite();
    let mut args = vec!["run", p(&suite), "--out", p(out), "--shard", shard];
    args.extend_from_slice(extra);
    farm(&args)
}

fn summary(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

/// (task, sample) → status of every row in the run's journal; fails on a duplicate.
fn rows(dir: &Path) -> BTreeMap<(String, u64), String> {
    let mut rows = BTreeMap::new();
    for line in std::fs::read_to_string(dir.join("journal.jsonl")).unwrap_or_default().lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        let key = (row["task_id"].as_str().unwrap().to_string(), row["sample_index"].as_u64().unwrap());
        assert!(rows.insert(key.clone(), row["status"].as_str().unwrap().to_string()).is_none(), "{key:?} recorded twice in {}", dir.display());
    }
    rows
}

/// The single-process run every merge is compared with (made once per test binary).
fn single_run() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let o = farm(&["run", p(&suite()), "--out", p(&dir.path().join("run"))]);
        assert!(o.status.success(), "{}", text(&o));
        dir
    })
    .path()
    .join("run")
    .leak()
}

/// The merged run equals the single-process run: the same (task, sample, status) rows, once
/// each, and the same counts, mean reward, pass@k and per-task figures. Its Parquet and
/// report read like any run's.
fn assert_equals_single_run(merged: &Path) {
    let single = single_run();
    assert_eq!(rows(merged), rows(single), "rows of {} against the single run", merged.display());
    let (m, s) = (summary(merged), summary(single));
    for key in ["planned", "finished", "counts", "mean_reward", "pass_at_k", "pass_hat_k", "trust", "tasks"] {
        assert_eq!(m[key], s[key], "summary.{key} of {} against the single run", merged.display());
    }
    assert_eq!((m["counts"]["passed"].as_u64(), m["counts"]["failed"].as_u64()), (Some(12), Some(6)), "{m}");
    let parquet = Command::new("python3")
        .args(["-c", "import pyarrow.parquet as pq, glob, sys; print(sum(pq.read_table(f).num_rows for f in glob.glob(sys.argv[1] + '/trajectories/*.parquet')))", p(merged)])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&parquet.stdout).trim(), "18", "{}", text(&parquet));
    let report = farm(&["report", p(merged), "--out", p(&merged.with_extension("report"))]);
    assert!(report.status.success(), "{}", text(&report));
}

/// Waits (bounded) until the run in `out` has recorded a row, then SIGKILLs `child`.
fn kill_after_first_row(mut child: std::process::Child, out: &Path) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while rows(out).is_empty() {
        assert!(child.try_wait().unwrap().is_none(), "the shard ended before it could be killed");
        assert!(Instant::now() < deadline, "no row recorded");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn shards_killed_resumed_and_merged_equal_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let shard = |i: u32| dir.path().join(format!("shard-{i}"));
    for i in [0, 2] {
        let o = run_shard(&shard(i), &format!("{i}/3"), &[]);
        assert!(o.status.success(), "{}", text(&o));
        assert!(text(&o).contains(&format!("shard {i}/3: 3 of 9 tasks, 6 of 18 rollouts")), "{}", text(&o));
    }
    // Shard 1 dies mid-run (SIGKILL, as a node lost) and is rerun alone with --resume.
    let child = Command::new(env!("CARGO_BIN_EXE_farm"))
        .args(["run", p(&suite()), "--out", p(&shard(1)), "--shard", "1/3", "--concurrency", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    kill_after_first_row(child, &shard(1));
    let done_before = rows(&shard(1)).len();
    assert!(done_before < 6 && !shard(1).join("summary.json").exists(), "killed before the end");

    // Until it is finished, the merge refuses and says what is missing.
    let early = farm(&["merge", p(&dir.path().join("early")), p(&shard(0)), p(&shard(1))]);
    assert!(!early.status.success(), "{}", text(&early));
    assert!(text(&early).contains("missing shards: 2/3") && text(&early).contains("shard 1/3") && text(&early).contains("--allow-partial"), "{}", text(&early));
    assert!(!dir.path().join("early").exists(), "a refused merge writes nothing");

    // Resuming under another N is refused, naming the folder.
    let other_n = run_shard(&shard(1), "1/4", &["--resume"]);
    assert!(!other_n.status.success() && text(&other_n).contains(p(&shard(1))), "{}", text(&other_n));
    let resumed = run_shard(&shard(1), "1/3", &["--resume"]);
    assert!(resumed.status.success(), "{}", text(&resumed));
    assert_eq!(rows(&shard(1)).len(), 6, "each of the shard's rollouts once after the resume");

    let merged = dir.path().join("merged");
    let o = farm(&["merge", p(&merged), p(&shard(2)), p(&shard(0)), p(&shard(1))]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("merged 3 shard(s) of 3") && text(&o).contains("18 rows"), "{}", text(&o));
    assert_equals_single_run(&merged);
    let m = summary(&merged);
    let shards = m["merged"]["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 3, "{m}");
    for (i, s) in shards.iter().enumerate() {
        assert_eq!(s["shard"], serde_json::json!({"index": i, "count": 3}), "{s}");
        assert!(!s["provenance"]["host"].as_str().unwrap().is_empty() && !s["provenance"]["accel"].as_str().unwrap().is_empty(), "{s}");
        assert!(s["performance"]["wall_secs"].as_f64().is_some(), "{s}");
    }
    assert!(m["merged"].get("missing_shards").is_none() && m["provenance"]["host"].as_str().is_some_and(|h| !h.is_empty()), "{m}");
    let manifest: Value = serde_json::from_str(&std::fs::read_to_string(shard(1).join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["shard"], serde_json::json!({"index": 1, "count": 3}));
    assert_eq!(summary(&shard(1))["provenance"]["shard"], serde_json::json!({"index": 1, "count": 3}));

    // Merging into a folder that holds something is refused.
    let again = farm(&["merge", p(&merged), p(&shard(0)), p(&shard(1)), p(&shard(2))]);
    assert!(!again.status.success() && text(&again).contains("is not empty"), "{}", text(&again));

    // What does not fit is refused, naming the folder.
    let single = single_run();
    let refused = |args: &[&Path], expect: &[&str]| {
        let out = dir.path().join("refused");
        let mut all = vec!["merge", p(&out)];
        all.extend(args.iter().map(|a| p(a)));
        let o = farm(&all);
        assert!(!o.status.success(), "{all:?}: {}", text(&o));
        for e in expect {
            assert!(text(&o).contains(e), "{all:?} should say {e:?}: {}", text(&o));
        }
        assert!(!out.exists(), "a refused merge writes nothing");
    };
    refused(&[&shard(0), &shard(0)], &["both shard 0/3"]);
    refused(&[&shard(0), single], &[p(single), "not a shard"]);
    refused(&[&shard(0), dir.path()], &[p(dir.path()), "not a farm run"]);
    let four = dir.path().join("four");
    assert!(run_shard(&four, "3/4", &[]).status.success());
    refused(&[&shard(0), &shard(1), &four], &[p(&four), "share N"]);
    // Another suite: the same tasks under another name have another digest.
    let other_suite = dir.path().join("other.toml");
    std::fs::write(&other_suite, std::fs::read_to_string(suite()).unwrap().replace("name = \"scale-out\"", "name = \"another\"").replace("data/scale-out.jsonl", p(&repo().join("configs/data/scale-out.jsonl")))).unwrap();
    let other = dir.path().join("other");
    let o = farm(&["run", p(&other_suite), "--out", p(&other), "--shard", "2/3"]);
    assert!(o.status.success(), "{}", text(&o));
    refused(&[&shard(0), &shard(1), &other], &[p(&other), "another suite"]);
    // Overlapping shards: a copy of shard 0 that claims to be shard 2.
    let forged = dir.path().join("forged");
    copy_dir(&shard(0), &forged);
    let manifest = std::fs::read_to_string(forged.join("manifest.json")).unwrap().replace("\"index\": 0", "\"index\": 2");
    std::fs::write(forged.join("manifest.json"), manifest).unwrap();
    refused(&[&shard(0), &shard(1), &forged], &["the shards overlap", p(&forged)]);
    let leftovers: Vec<String> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).filter(|n| n.contains("merging")).collect();
    assert!(leftovers.is_empty(), "staging folders left: {leftovers:?}");

    // --allow-partial merges what there is and records what is missing.
    let partial = dir.path().join("partial");
    let o = farm(&["merge", p(&partial), p(&shard(0)), p(&shard(1)), "--allow-partial"]);
    assert!(o.status.success(), "{}", text(&o));
    let s = summary(&partial);
    assert_eq!((s["finished"].as_u64(), s["merged"]["missing_shards"].clone()), (Some(12), serde_json::json!([2])), "{s}");
}

fn copy_dir(from: &Path, to: &Path) {
    let o = Command::new("cp").arg("-a").arg(from).arg(to).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

/// More shards than tasks: a shard with no task writes an empty, valid run, and the merge of
/// all ten still equals the single run.
#[test]
fn a_shard_without_tasks_is_an_empty_run_and_ten_shards_still_merge() {
    let dir = tempfile::tempdir().unwrap();
    let mut dirs = Vec::new();
    for i in 0..10 {
        let out = dir.path().join(format!("s{i}"));
        let o = run_shard(&out, &format!("{i}/10"), &[]);
        assert!(o.status.success(), "{}", text(&o));
        if i == 9 {
            assert!(text(&o).contains("shard 9/10 has no task"), "{}", text(&o));
            let s = summary(&out);
            assert_eq!((s["planned"].as_u64(), s["finished"].as_u64()), (Some(0), Some(0)), "{s}");
        }
        dirs.push(out);
    }
    let merged = dir.path().join("merged");
    let mut args = vec!["merge", p(&merged)];
    args.extend(dirs.iter().map(|d| p(d)));
    let o = farm(&args);
    assert!(o.status.success(), "{}", text(&o));
    assert_equals_single_run(&merged);
}
