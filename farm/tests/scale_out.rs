//! One suite across many machines: `farm run --shard I/N`, `farm merge`, and the two engines
//! that run the shards (a real single-node Slurm, and the Kubernetes Job's container command
//! run locally). Every merge is compared with a single-process run of the same suite
//! (configs/scale-out.toml: 9 tasks, 2 samples each, on the minimal image).

mod common;
use common::{farm, repo, text};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

fn suite() -> PathBuf {
    repo().join("configs/scale-out.toml")
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

/// (task, sample) → status of every row in the run's journal; fails on a duplicate. A line
/// still being written (no newline yet) is not a row yet.
fn rows(dir: &Path) -> BTreeMap<(String, u64), String> {
    let mut rows = BTreeMap::new();
    let text = std::fs::read_to_string(dir.join("journal.jsonl")).unwrap_or_default();
    let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    for line in complete.lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        let key = (
            row["task_id"].as_str().unwrap().to_string(),
            row["sample_index"].as_u64().unwrap(),
        );
        assert!(
            rows.insert(key.clone(), row["status"].as_str().unwrap().to_string())
                .is_none(),
            "{key:?} recorded twice in {}",
            dir.display()
        );
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
    assert_eq!(
        rows(merged),
        rows(single),
        "rows of {} against the single run",
        merged.display()
    );
    let (m, s) = (summary(merged), summary(single));
    for key in [
        "planned",
        "finished",
        "counts",
        "mean_reward",
        "pass_at_k",
        "pass_hat_k",
        "trust",
        "tasks",
    ] {
        assert_eq!(
            m[key],
            s[key],
            "summary.{key} of {} against the single run",
            merged.display()
        );
    }
    assert_eq!(
        (m["counts"]["passed"].as_u64(), m["counts"]["failed"].as_u64()),
        (Some(12), Some(6)),
        "{m}"
    );
    let parquet = Command::new("python3")
        .args(["-c", "import pyarrow.parquet as pq, glob, sys; print(sum(pq.read_table(f).num_rows for f in glob.glob(sys.argv[1] + '/trajectories/*.parquet')))", p(merged)])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&parquet.stdout).trim(),
        "18",
        "{}",
        text(&parquet)
    );
    let report = farm(&["report", p(merged), "--out", p(&merged.with_extension("report"))]);
    assert!(report.status.success(), "{}", text(&report));
}

/// Waits (bounded) until the run in `out` has recorded a row, then SIGKILLs `child`.
fn kill_after_first_row(mut child: std::process::Child, out: &Path) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while rows(out).is_empty() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the shard ended before it could be killed"
        );
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
        assert!(
            text(&o).contains(&format!("shard {i}/3: 3 of 9 tasks, 6 of 18 rollouts")),
            "{}",
            text(&o)
        );
    }
    // Shard 1 dies mid-run (SIGKILL, as a node lost) and is rerun alone with --resume.
    let child = Command::new(env!("CARGO_BIN_EXE_farm"))
        .args([
            "run",
            p(&suite()),
            "--out",
            p(&shard(1)),
            "--shard",
            "1/3",
            "--concurrency",
            "1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    kill_after_first_row(child, &shard(1));
    let done_before = rows(&shard(1)).len();
    assert!(
        done_before < 6 && !shard(1).join("summary.json").exists(),
        "killed before the end"
    );

    // Until it is finished, the merge refuses and says what is missing.
    let early = farm(&["merge", p(&dir.path().join("early")), p(&shard(0)), p(&shard(1))]);
    assert!(!early.status.success(), "{}", text(&early));
    assert!(
        text(&early).contains("missing shards: 2/3")
            && text(&early).contains("shard 1/3")
            && text(&early).contains("--allow-partial"),
        "{}",
        text(&early)
    );
    assert!(!dir.path().join("early").exists(), "a refused merge writes nothing");

    // Resuming under another N is refused, naming the folder.
    let other_n = run_shard(&shard(1), "1/4", &["--resume"]);
    assert!(
        !other_n.status.success() && text(&other_n).contains(p(&shard(1))),
        "{}",
        text(&other_n)
    );
    let resumed = run_shard(&shard(1), "1/3", &["--resume"]);
    assert!(resumed.status.success(), "{}", text(&resumed));
    assert_eq!(
        rows(&shard(1)).len(),
        6,
        "each of the shard's rollouts once after the resume"
    );

    let merged = dir.path().join("merged");
    let o = farm(&["merge", p(&merged), p(&shard(2)), p(&shard(0)), p(&shard(1))]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("merged 3 shard(s) of 3") && text(&o).contains("18 rows"),
        "{}",
        text(&o)
    );
    assert_equals_single_run(&merged);
    let m = summary(&merged);
    let shards = m["merged"]["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 3, "{m}");
    for (i, s) in shards.iter().enumerate() {
        assert_eq!(s["shard"], serde_json::json!({"index": i, "count": 3}), "{s}");
        assert!(
            !s["provenance"]["host"].as_str().unwrap().is_empty()
                && !s["provenance"]["accel"].as_str().unwrap().is_empty(),
            "{s}"
        );
        assert!(s["performance"]["wall_secs"].as_f64().is_some(), "{s}");
    }
    assert!(
        m["merged"].get("missing_shards").is_none() && m["provenance"]["host"].as_str().is_some_and(|h| !h.is_empty()),
        "{m}"
    );
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(shard(1).join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["shard"], serde_json::json!({"index": 1, "count": 3}));
    assert_eq!(
        summary(&shard(1))["provenance"]["shard"],
        serde_json::json!({"index": 1, "count": 3})
    );

    // Merging into a folder that holds something is refused.
    let again = farm(&["merge", p(&merged), p(&shard(0)), p(&shard(1)), p(&shard(2))]);
    assert!(
        !again.status.success() && text(&again).contains("is not empty"),
        "{}",
        text(&again)
    );

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
    std::fs::write(
        &other_suite,
        std::fs::read_to_string(suite())
            .unwrap()
            .replace("name = \"scale-out\"", "name = \"another\"")
            .replace("data/scale-out.jsonl", p(&repo().join("configs/data/scale-out.jsonl"))),
    )
    .unwrap();
    let other = dir.path().join("other");
    let o = farm(&["run", p(&other_suite), "--out", p(&other), "--shard", "2/3"]);
    assert!(o.status.success(), "{}", text(&o));
    refused(&[&shard(0), &shard(1), &other], &[p(&other), "another suite"]);
    // Overlapping shards: a copy of shard 0 that claims to be shard 2.
    let forged = dir.path().join("forged");
    copy_dir(&shard(0), &forged);
    let manifest = std::fs::read_to_string(forged.join("manifest.json"))
        .unwrap()
        .replace("\"index\": 0", "\"index\": 2");
    std::fs::write(forged.join("manifest.json"), manifest).unwrap();
    refused(&[&shard(0), &shard(1), &forged], &["the shards overlap", p(&forged)]);
    // What a shard says about itself is checked, not trusted: each copy of shard 1 below has
    // one thing changed, and the merge refuses it and names what.
    let tampered = |name: &str, change: &dyn Fn(&Path)| -> PathBuf {
        let d = dir.path().join(name);
        copy_dir(&shard(1), &d);
        change(&d);
        d
    };
    let edit_json = |path: &Path, edit: &dyn Fn(&mut Value)| {
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        edit(&mut v);
        std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    };
    // A row edited in the journal (its reward and status rewritten): the hash chain breaks
    // at its line, even though the merge would read that row from a part.
    let edited = tampered("edited", &|d| {
        let journal = d.join("journal.jsonl");
        let text = std::fs::read_to_string(&journal).unwrap();
        let mut lines: Vec<String> = text.lines().map(String::from).collect();
        let mut row: Value = serde_json::from_str(&lines[2]).unwrap();
        row["status"] = "passed".into();
        row["reward"] = 1.0.into();
        row["attempts"] = 7.into();
        let chain = row.as_object_mut().unwrap().remove("chain").unwrap();
        let mut line = serde_json::to_string(&row).unwrap();
        line.pop();
        lines[2] = format!("{line},\"chain\":{chain}}}");
        std::fs::write(&journal, lines.join("\n") + "\n").unwrap();
    });
    refused(
        &[&shard(0), &edited, &shard(2)],
        &[&format!("{}:3", p(&edited.join("journal.jsonl"))), "hash chain breaks"],
    );
    // A part removed, and taken off the manifest: the parts no longer hold the journal's rows.
    let removed = tampered("removed", &|d| {
        std::fs::remove_file(d.join("trajectories/part-00000.parquet")).unwrap();
        edit_json(&d.join("manifest.json"), &|m| {
            m["parts"].as_array_mut().unwrap().remove(0);
        });
    });
    refused(
        &[&shard(0), &removed, &shard(2)],
        &[p(&removed), "a part was removed or replaced"],
    );
    // A part changed after it was committed.
    let changed = tampered("changed", &|d| {
        let part = d.join("trajectories/part-00000.parquet");
        let mut bytes = std::fs::read(&part).unwrap();
        bytes.extend_from_slice(b"tail");
        std::fs::write(&part, bytes).unwrap();
    });
    refused(
        &[&shard(0), &changed, &shard(2)],
        &["part-00000.parquet changed after it was written"],
    );
    // A torn journal under a summary that says the shard finished.
    let torn = tampered("torn", &|d| {
        let journal = d.join("journal.jsonl");
        let len = std::fs::metadata(&journal).unwrap().len();
        let file = std::fs::OpenOptions::new().write(true).open(&journal).unwrap();
        file.set_len(len - 40).unwrap();
    });
    assert_eq!(summary(&torn)["finished"], 6, "the summary still says finished");
    refused(&[&shard(0), &torn, &shard(2)], &[p(&torn)]);
    // Rows of another run under a manifest that claims this suite: each row's digest is checked.
    let suite_digest = serde_json::from_str::<Value>(&std::fs::read_to_string(shard(0).join("manifest.json")).unwrap())
        .unwrap()["suite_digest"]
        .clone();
    let alien = dir.path().join("alien");
    copy_dir(&other, &alien);
    edit_json(&alien.join("manifest.json"), &|m| {
        m["suite_digest"] = suite_digest.clone();
        m["suite_name"] = "scale-out".into();
    });
    refused(&[&shard(0), &shard(1), &alien], &[p(&alien), "a row of another run"]);
    // A plan edited to take in another shard's rows.
    let replanned = tampered("replanned", &|d| {
        edit_json(&d.join("plan.json"), &|plan| {
            plan["tasks"]["extra-task"] = 2.into();
        });
    });
    refused(
        &[&shard(0), &replanned, &shard(2)],
        &["plan.json changed after it was written"],
    );
    let leftovers: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.contains("merging"))
        .collect();
    assert!(leftovers.is_empty(), "staging folders left: {leftovers:?}");

    // --allow-partial merges what there is and records what is missing.
    let partial = dir.path().join("partial");
    let o = farm(&["merge", p(&partial), p(&shard(0)), p(&shard(1)), "--allow-partial"]);
    assert!(o.status.success(), "{}", text(&o));
    let s = summary(&partial);
    assert_eq!(
        (s["finished"].as_u64(), s["merged"]["missing_shards"].clone()),
        (Some(12), serde_json::json!([2])),
        "{s}"
    );
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
            assert_eq!(
                (s["planned"].as_u64(), s["finished"].as_u64()),
                (Some(0), Some(0)),
                "{s}"
            );
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

/// A single-node Slurm (scripts/slurm/local-cluster.sh), stopped when dropped.
struct Slurm {
    dir: tempfile::TempDir,
}

impl Slurm {
    fn start() -> Slurm {
        let dir = tempfile::tempdir().unwrap();
        let o = Command::new("bash")
            .arg(repo().join("scripts/slurm/local-cluster.sh"))
            .arg("start")
            .arg(dir.path())
            // The daemons and their jobs die with this process, however it ends.
            .env("SLURM_CLUSTER_OWNER", std::process::id().to_string())
            .output()
            .unwrap();
        let slurm = Slurm { dir };
        assert!(
            o.status.success(),
            "the local Slurm did not start (scripts/setup.sh installs slurm-wlm and munge):\n{}",
            text(&o)
        );
        slurm
    }

    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", self.dir.path().join("slurm.conf"))
            .stdin(Stdio::null());
        c
    }

    /// `JobState` of a job (or array task `J_I`).
    fn state(&self, job: &str) -> String {
        let o = self
            .command("scontrol")
            .args(["show", "job", "-o", job])
            .output()
            .unwrap();
        let t = String::from_utf8_lossy(&o.stdout).to_string();
        t.split_whitespace()
            .find_map(|w| w.strip_prefix("JobState="))
            .unwrap_or("UNKNOWN")
            .to_string()
    }

    /// Waits (bounded) until `job` reaches one of `states`; fails on another final state.
    fn wait(&self, job: &str, states: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let state = self.state(job);
            if states.contains(&state.as_str()) {
                return state;
            }
            let final_state = [
                "COMPLETED",
                "FAILED",
                "CANCELLED",
                "TIMEOUT",
                "NODE_FAIL",
                "OUT_OF_MEMORY",
                "BOOT_FAIL",
                "DEADLINE",
            ]
            .contains(&state.as_str());
            assert!(
                !final_state && Instant::now() < deadline,
                "job {job} is {state}, not {states:?}; logs: {}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn logs(&self) -> String {
        ["slurmctld.log", "slurmd.log"]
            .iter()
            .map(|f| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// scripts/slurm/submit.sh: (shards array job, merge job).
    fn submit(&self, out: &Path, extra: &[&str]) -> (String, String) {
        let farm = Path::new(env!("CARGO_BIN_EXE_farm"));
        let o = self
            .command("bash")
            .arg(repo().join("scripts/slurm/submit.sh"))
            .args([p(&suite()), p(out), "3"])
            .args(extra)
            .env("FARM_BIN", farm)
            .env("FARM_RUN_ARGS", "--concurrency 1")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let t = String::from_utf8_lossy(&o.stdout).to_string();
        let id = |key: &str| {
            t.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .unwrap_or_else(|| panic!("no {key} in {t}"))
                .to_string()
        };
        (id("shards="), id("merge="))
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo().join("scripts/slurm/local-cluster.sh"))
            .arg("stop")
            .arg(self.dir.path())
            .output();
    }
}

/// The farm process of array task `job_index` (found by its Slurm environment).
fn farm_of_array_task(array_job: &str, index: u32) -> Option<i32> {
    std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let environ = std::fs::read(e.path().join("environ")).ok()?;
        let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
        let has = |v: String| vars.contains(&v.as_bytes());
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim() == "farm"
            && has(format!("SLURM_ARRAY_JOB_ID={array_job}"))
            && has(format!("SLURM_ARRAY_TASK_ID={index}")))
        .then_some(pid)
    })
}

/// The Slurm path end to end: a 3-shard array and a dependent merge job; shard 1's farm is
/// SIGKILLed mid-run, which fails its array task and cancels the merge; the shard is resubmitted
/// alone (`submit.sh --only 1`), resumes, and the new merge equals the single run.
#[test]
fn a_slurm_array_with_a_killed_shard_resubmitted_merges_into_the_single_run() {
    let single = single_run(); // before the cluster takes the cores
    let slurm = Slurm::start();
    let out = tempfile::tempdir().unwrap();
    let (shards, merge) = slurm.submit(out.path(), &[]);
    let shard1 = out.path().join("shards/1");
    let deadline = Instant::now() + Duration::from_secs(600);
    let pid = loop {
        if !rows(&shard1).is_empty() {
            if let Some(pid) = farm_of_array_task(&shards, 1) {
                break pid;
            }
        }
        assert!(
            Instant::now() < deadline && slurm.state(&format!("{shards}_1")) != "COMPLETED",
            "shard 1 was not caught mid-run: {}",
            slurm.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let kill = Command::new("kill").args(["-9", &pid.to_string()]).output().unwrap();
    assert!(kill.status.success(), "{}", text(&kill));
    assert_eq!(slurm.wait(&format!("{shards}_1"), &["FAILED"]), "FAILED");
    for i in [0, 2] {
        slurm.wait(&format!("{shards}_{i}"), &["COMPLETED"]);
    }
    assert_eq!(
        slurm.wait(&merge, &["CANCELLED"]),
        "CANCELLED",
        "a merge whose shard failed is cancelled, not left pending"
    );
    assert!(!out.path().join("merged").exists());
    assert!(rows(&shard1).len() < 6 && !shard1.join("summary.json").exists());

    let (again, merge) = slurm.submit(out.path(), &["--only", "1"]);
    slurm.wait(&format!("{again}_1"), &["COMPLETED"]);
    slurm.wait(&merge, &["COMPLETED"]);
    assert_eq!(
        rows(&shard1).len(),
        6,
        "the resubmitted shard recorded each rollout once"
    );
    assert_equals_single_run(&out.path().join("merged"));
    let _ = single;

    // The fleet script: a `farm serve` per node of the allocation (one here), listed in
    // endpoints.txt, answering, and stopped in order by scancel.
    let serve_out = tempfile::tempdir().unwrap();
    let run_dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = slurm
        .command("sbatch")
        .args(["--parsable", "--nodes=1", "--export=ALL", "--output"])
        .arg(serve_out.path().join("serve-%j.log"))
        .arg(repo().join("scripts/slurm/farm-serve.sbatch"))
        .env("FARM_CONFIG", repo().join("configs/serve.toml"))
        .env("FARM_OUT", serve_out.path())
        .env("FARM_PORT", port.to_string())
        .env("FARM_LISTEN_HOST", "127.0.0.1")
        .env("FARM_BIN", env!("CARGO_BIN_EXE_farm"))
        .env("FARM_RUN_DIR", run_dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let job = String::from_utf8_lossy(&o.stdout)
        .trim()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(600);
    let capacity = loop {
        if let Some(answer) = http_get(port, "/v1/capacity") {
            break answer;
        }
        assert!(
            Instant::now() < deadline && slurm.state(&job) != "FAILED",
            "the fleet's service never answered: {}",
            std::fs::read_to_string(serve_out.path().join(format!("serve-{job}.log"))).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(capacity.contains("\"slots\""), "{capacity}");
    assert_eq!(
        std::fs::read_to_string(serve_out.path().join("endpoints.txt"))
            .unwrap()
            .trim(),
        url
    );
    let cancel = slurm.command("scancel").arg(&job).output().unwrap();
    assert!(cancel.status.success(), "{}", text(&cancel));
    slurm.wait(&job, &["CANCELLED", "COMPLETED"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(port, "/v1/capacity").is_some() || any_qemu_of(run_dir.path()) {
        assert!(Instant::now() < deadline, "the service or a VM outlived scancel");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The body of a plain HTTP GET on loopback, None when nothing answers.
fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    answer.starts_with("HTTP/1.1 200").then(|| {
        answer
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default()
    })
}

/// A live QEMU process with a file open under `run_dir`.
fn any_qemu_of(run_dir: &Path) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmdline).contains("qemu-system")
            && std::fs::read_dir(e.path().join("fd"))
                .map(|d| {
                    d.flatten()
                        .filter_map(|f| std::fs::read_link(f.path()).ok())
                        .any(|f| f.starts_with(run_dir))
                })
                .unwrap_or(false)
    })
}

/// deploy/k8s: the manifests parse and hold what an Indexed Job of farm needs, and the Job's
/// exact container command, run here once per index with JOB_COMPLETION_INDEX set, gives the
/// shards that the merge Job's command merges into the single run.
#[test]
fn the_kubernetes_jobs_commands_run_locally_per_index_merge_into_the_single_run() {
    let load = |file: &str| -> Value {
        let o = Command::new("python3")
            .args([
                "-c",
                "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
            ])
            .arg(repo().join("deploy/k8s").join(file))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{file} does not parse as YAML (python3-yaml from scripts/setup.sh): {}",
            text(&o)
        );
        let docs: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(docs.as_array().unwrap().len(), 1, "{file}: one document");
        docs[0].clone()
    };
    let shards = load("farm-shards.yaml");
    let merge = load("farm-merge.yaml");
    for job in [&shards, &merge] {
        assert_eq!(
            (job["apiVersion"].as_str(), job["kind"].as_str()),
            (Some("batch/v1"), Some("Job")),
            "{job}"
        );
        assert_eq!(job["spec"]["template"]["spec"]["restartPolicy"], "Never");
    }
    let spec = &shards["spec"];
    assert_eq!(spec["completionMode"], "Indexed");
    let n = spec["completions"].as_u64().expect("completions");
    assert!(spec["parallelism"].as_u64().is_some_and(|p| p >= 1 && p <= n), "{spec}");
    let pod = &spec["template"]["spec"];
    let container = &pod["containers"][0];
    let env = |c: &Value| -> BTreeMap<String, String> {
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_string(),
                    e["value"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    assert_eq!(
        env(container)["FARM_SHARDS"],
        n.to_string(),
        "FARM_SHARDS equals completions"
    );
    let kvm_device = container["resources"]["limits"]
        .get("devices.kubevirt.io/kvm")
        .is_some();
    let kvm_mounted = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v["hostPath"]["path"] == "/dev/kvm");
    assert!(kvm_device || kvm_mounted, "the pod asks for /dev/kvm");
    assert_eq!(container["securityContext"]["privileged"], true);
    let volume = |name: &str| {
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .cloned()
            .unwrap()
    };
    let cache_mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"].as_str() == env(container).get("FARM_CACHE_DIR").map(|s| s.as_str()))
        .expect("FARM_CACHE_DIR is a mounted volume");
    assert!(
        volume(cache_mount["name"].as_str().unwrap())["hostPath"].is_object(),
        "the cache is node-local"
    );
    let output = env(container)["FARM_OUTPUT"].clone();
    let out_mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| output.starts_with(m["mountPath"].as_str().unwrap()))
        .expect("FARM_OUTPUT is on a mounted volume");
    assert!(
        volume(out_mount["name"].as_str().unwrap())["persistentVolumeClaim"].is_object(),
        "the output is on a shared volume"
    );
    let merge_container = &merge["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        env(merge_container)["FARM_OUTPUT"],
        output,
        "the merge reads where the shards write"
    );

    // The fleet: a headless Service and a StatefulSet whose pods keep their output volume
    // and need the token to listen beyond loopback.
    let o = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(repo().join("deploy/k8s/farm-serve.yaml"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let fleet: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    let service = fleet.iter().find(|d| d["kind"] == "Service").expect("a Service");
    let set = fleet
        .iter()
        .find(|d| d["kind"] == "StatefulSet")
        .expect("a StatefulSet");
    assert_eq!(service["spec"]["clusterIP"], "None", "headless: a DNS name per pod");
    assert_eq!(set["spec"]["serviceName"], service["metadata"]["name"]);
    let serve = &set["spec"]["template"]["spec"]["containers"][0];
    let command: Vec<&str> = serve["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(&command[..2], ["farm", "serve"]);
    let out_at = command
        .iter()
        .position(|c| *c == "--out")
        .map(|i| command[i + 1])
        .expect("--out");
    let claim = set["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
        .as_str()
        .expect("a volume claim per pod");
    assert!(
        serve["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == claim && m["mountPath"] == out_at),
        "the output is the pod's own volume"
    );
    assert!(
        serve["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "FARM_SERVE_TOKEN" && e["valueFrom"]["secretKeyRef"].is_object()),
        "the token comes from a Secret"
    );
    for label in [&set["spec"]["selector"]["matchLabels"], &service["spec"]["selector"]] {
        for (k, v) in label.as_object().unwrap() {
            assert_eq!(&set["spec"]["template"]["metadata"]["labels"][k], v, "selector {k}");
        }
    }

    // The commands, as the pods run them, with this machine's paths for the volumes.
    let dir = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_farm")).parent().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let run = |c: &Value, extra: &[(&str, String)]| {
        assert_eq!(c["command"], serde_json::json!(["/bin/sh", "-c"]));
        let script = c["args"][0].as_str().unwrap();
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg(script).stdin(Stdio::null()).env("PATH", &path);
        for (k, v) in env(c) {
            if k != "FARM_CACHE_DIR" {
                cmd.env(k, v);
            }
        }
        cmd.env("FARM_SUITE", suite()).env("FARM_OUTPUT", dir.path());
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{script}: {}", text(&o));
    };
    for i in 0..n {
        run(container, &[("JOB_COMPLETION_INDEX", i.to_string())]);
    }
    run(merge_container, &[]);
    assert_equals_single_run(&dir.path().join("merged"));
}

/// A bad `--shard`, or `--shard auto` outside an array, is refused with what was expected,
/// before anything is written.
#[test]
fn bad_shard_flags_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (&["--shard", "3/3"], &[], "--shard \"3/3\" is not I/N"),
        (
            &["--shard", "one/two"],
            &[],
            "is not I/N (0 <= I < N, e.g. 0/4), or auto",
        ),
        (
            &["--shard", "auto"],
            &[],
            "neither a Slurm job array (SLURM_ARRAY_TASK_ID) nor a Kubernetes Indexed Job (JOB_COMPLETION_INDEX)",
        ),
        (
            &["--shard", "auto"],
            &[("JOB_COMPLETION_INDEX", "1")],
            "needs the number of shards: --shards N, or FARM_SHARDS",
        ),
        (
            &["--shard", "auto", "--shards", "2"],
            &[("JOB_COMPLETION_INDEX", "2")],
            "index 2 is not below the 2 shards",
        ),
        (
            &["--shard", "auto"],
            &[("SLURM_ARRAY_TASK_ID", "x")],
            "SLURM_ARRAY_TASK_ID = \"x\" is not a number",
        ),
    ];
    for (args, env, expect) in cases {
        let mut c = Command::new(env!("CARGO_BIN_EXE_farm"));
        c.args(["run", p(&suite()), "--out", p(&out)])
            .args(*args)
            .stdin(Stdio::null());
        for var in [
            "SLURM_ARRAY_TASK_ID",
            "SLURM_ARRAY_TASK_MIN",
            "SLURM_ARRAY_TASK_MAX",
            "SLURM_ARRAY_TASK_COUNT",
            "JOB_COMPLETION_INDEX",
            "FARM_SHARDS",
        ] {
            c.env_remove(var);
        }
        c.envs(env.iter().copied());
        let o = c.output().unwrap();
        assert!(
            !o.status.success() && text(&o).contains(expect),
            "{args:?} {env:?}: {}",
            text(&o)
        );
        assert!(!out.exists(), "{args:?}: nothing may be written");
    }
}
