//! Harbor tasks, unmodified, against real services on this machine: the sample tasks'
//! environments are built from their Dockerfiles `FROM` a base image the test pushes to a
//! local registry (Debian's docker-registry), install from a local package index and a local
//! Debian repository, and are verified by their own test.sh. The oracle passes every task, an
//! agent that does nothing fails every task, and the hostile tasks end as docs/security.md
//! says for each verification mode.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The local services (scripts/harbor-services.sh), stopped when dropped.
struct Services {
    dir: tempfile::TempDir,
    env: BTreeMap<String, String>,
}

impl Services {
    fn start() -> Services {
        let dir = tempfile::tempdir().unwrap();
        let o = Command::new("bash")
            .arg(repo().join("scripts/harbor-services.sh"))
            .arg("start")
            .arg(dir.path())
            .args(["0", "0", "0"])
            .output()
            .unwrap();
        assert!(o.status.success(), "scripts/harbor-services.sh: {}", text(&o));
        let env = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Services { dir, env }
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo().join("scripts/harbor-services.sh"))
            .arg("stop")
            .arg(self.dir.path())
            .output();
    }
}

/// A suite over `tasks` (a folder of Harbor tasks) with `policy` and verification `verify`,
/// wired to the services; its output in `out`.
fn suite(dir: &Path, name: &str, tasks: &Path, policy: &str, verify: &str, s: &Services) -> PathBuf {
    let (apt, pypi) = (&s.env["HARBOR_APT"], &s.env["HARBOR_PYPI"]);
    let text = format!(
        "[suite]\nname = \"{name}\"\n[template]\nimage = \"minimal\"\n[dataset]\npath = \"{}\"\nformat = \"harbor\"\n{policy}\n\
         [harbor]\nverify = \"{verify}\"\nbuild_args = {{ APT_REPO = \"http://{apt}\", PIP_INDEX = \"http://{pypi}/simple\" }}\n\
         [harbor.build_network]\nallow = [\"{apt}\", \"{pypi}\"]\n[harbor.verifier_network]\nallow = [\"{pypi}\"]\n[output]\ndir = \"out-{name}\"\n",
        tasks.display()
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs a suite with the registry mirror and the index address in the environment; returns
/// each task's (status, reward, trust).
fn run(suite: &Path, s: &Services, store: &Path) -> BTreeMap<String, (String, f64, String)> {
    let registries = s.dir.path().join("registries.toml");
    std::fs::write(
        &registries,
        format!(
            "[mirrors]\n\"registry.farm.test\" = [\"{}\"]\n",
            s.env["HARBOR_REGISTRY"]
        ),
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_farm"))
        .arg("run")
        .arg(suite)
        .env("FARM_REGISTRIES", &registries)
        .env("FARM_SNAPSHOT_DIR", store)
        .env("HARBOR_PIP_INDEX", format!("http://{}/simple", s.env["HARBOR_PYPI"]))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let name = suite.file_stem().unwrap().to_string_lossy();
    let journal = std::fs::read_to_string(suite.parent().unwrap().join(format!("out-{name}/journal.jsonl"))).unwrap();
    journal
        .lines()
        .map(|l| {
            let row: serde_json::Value = serde_json::from_str(l).unwrap();
            let id = row["task_id"].as_str().unwrap().rsplit('/').next().unwrap().to_string();
            assert_ne!(row["status"], "env_error", "{id}: {row}");
            (
                id,
                (
                    row["status"].as_str().unwrap().to_string(),
                    row["reward"].as_f64().unwrap_or(-1.0),
                    row["trust"].as_str().unwrap_or("").to_string(),
                ),
            )
        })
        .collect()
}

#[test]
fn harbor_tasks_pass_with_the_oracle_fail_without_it_and_hostile_ones_end_as_documented() {
    let services = Services::start();
    let dir = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let samples = repo().join("configs/data/harbor");
    let oracle = "[policy]\nkind = \"replay\"\nsource = \"reference\"";

    // The oracle passes every task, verified live (Harbor's way).
    let rows = run(
        &suite(dir.path(), "oracle-live", &samples, oracle, "live", &services),
        &services,
        store.path(),
    );
    assert_eq!(rows.len(), 11);
    for (task, (status, reward, trust)) in &rows {
        assert_eq!(
            (status.as_str(), *reward, trust.as_str()),
            ("passed", 1.0, "hardened"),
            "{task}"
        );
    }

    // An agent that does nothing fails every task.
    let nothing: String = rows
        .keys()
        .map(|t| {
            format!(
                "{}\n",
                serde_json::json!({ "task_id": task_id(&samples, t), "sample_index": 0, "actions": [] })
            )
        })
        .collect();
    std::fs::write(dir.path().join("nothing.jsonl"), nothing).unwrap();
    let policy = format!(
        "[policy]\nkind = \"replay\"\nsource = \"trajectories\"\ntrajectories_file = \"{}\"",
        dir.path().join("nothing.jsonl").display()
    );
    let rows = run(
        &suite(dir.path(), "nothing", &samples, &policy, "live", &services),
        &services,
        store.path(),
    );
    for (task, (status, reward, _)) in &rows {
        assert_eq!(
            (status.as_str(), *reward),
            ("failed", 0.0),
            "{task}: a do-nothing agent passed"
        );
    }

    // Fresh-boot verification: the same verdicts, except the task whose verifier probes a
    // service the agent started (no process of the agent's survives a fresh boot).
    let rows = run(
        &suite(dir.path(), "oracle-fresh", &samples, oracle, "fresh_boot", &services),
        &services,
        store.path(),
    );
    for (task, (status, _, _)) in &rows {
        let expected = if task == "http-service" { "failed" } else { "passed" };
        assert_eq!(status, expected, "{task} under fresh_boot");
    }

    // A docker_image that cannot be pulled gives way to the task's Dockerfile, as in Harbor.
    let fallback = dir.path().join("fallback");
    std::fs::create_dir_all(&fallback).unwrap();
    assert!(Command::new("cp")
        .arg("-r")
        .arg(samples.join("hello-file"))
        .arg(fallback.join("hello-fallback"))
        .status()
        .unwrap()
        .success());
    let toml = fallback.join("hello-fallback/task.toml");
    let text = std::fs::read_to_string(&toml).unwrap().replace(
        "[environment]\n",
        "[environment]\ndocker_image = \"registry.farm.test/not-there:1\"\n",
    );
    std::fs::write(&toml, text).unwrap();
    let rows = run(
        &suite(dir.path(), "fallback", &fallback, oracle, "live", &services),
        &services,
        store.path(),
    );
    assert_eq!(rows["hello-fallback"].0, "passed");

    // Hostile tasks (docs/security.md, "Harbor tasks"): what each mode stops, and what it cannot.
    let hostile = repo().join("configs/data/harbor-hostile");
    let live = run(
        &suite(dir.path(), "hostile-live", &hostile, oracle, "live", &services),
        &services,
        store.path(),
    );
    let fresh = run(
        &suite(dir.path(), "hostile-fresh", &hostile, oracle, "fresh_boot", &services),
        &services,
        store.path(),
    );
    for task in ["planted-reward", "read-tests"] {
        assert_eq!(live[task].0, "failed", "{task} (live)");
        assert_eq!(fresh[task].0, "failed", "{task} (fresh_boot)");
    }
    assert_eq!(
        fresh["reward-rewriter"].0, "failed",
        "no process of the agent's is alive under fresh_boot"
    );
    // A guest reset the moment the agent's phase ended: the agent's doing in both modes,
    // never an environment error (whichever comes first: the reset or taking the disk).
    for (mode, rows) in [("live", &live), ("fresh_boot", &fresh)] {
        let (status, reward, trust) = &rows["guest-reset"];
        assert!(
            matches!(status.as_str(), "failed" | "timeout") && *reward == 0.0 && !trust.is_empty(),
            "guest-reset ({mode}): {status} {reward} trust {trust:?}"
        );
    }
    // Not stopped, in either mode: the verifier runs the environment's own python3, which the
    // agent (root there) replaced. The row says hardened.
    assert_eq!(
        (live["fake-python"].0.as_str(), live["fake-python"].2.as_str()),
        ("passed", "hardened")
    );
    assert_eq!(fresh["fake-python"].0, "passed");
}

/// A task's id as the dataset gives it (`[task] name`, else the folder's name).
fn task_id(root: &Path, folder: &str) -> String {
    let toml = std::fs::read_to_string(root.join(folder).join("task.toml")).unwrap();
    let value: toml::Value = toml::from_str(&toml).unwrap();
    value
        .get("task")
        .and_then(|t| t.get("name"))
        .and_then(|n| n.as_str())
        .unwrap_or(folder)
        .to_string()
}
