//! Harbor tasks, unmodified, against real services on this machine: the sample tasks'
//! environments are built from their Dockerfiles `FROM` a base image the test pushes to a
//! local registry (Debian's docker-registry), install from a local package index and a local
//! Debian repository, and are verified by their own test.sh. The oracle passes every task, an
//! agent that does nothing fails every task, and the hostile tasks end as docs/security.md
//! says for each verification mode. Harbor's own CLI runs the same tasks on farm's Harbor
//! backend (clients/python) and gives the same verdicts.
//!
//! The four tests run two at a time and share one set of services (see [`services`]) and one
//! snapshot store (see [`store`]): the same services give the same build arguments, so an
//! environment one of them builds, the others reuse.

mod common;
use common::{pytest_args, repo, text};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Each task's (status, reward, trust).
type Outcomes = BTreeMap<String, (String, f64, String)>;

/// The local services (scripts/harbor-services.sh), stopped by [`Services::stop`], and the registry
/// settings that send `registry.farm.test` to their registry.
struct Services {
    dir: tempfile::TempDir,
    env: BTreeMap<String, String>,
    registries: PathBuf,
}

impl Services {
    fn start() -> Services {
        let dir = tempfile::tempdir().unwrap();
        let o = Command::new("bash")
            .arg(repo().join("scripts/harbor-services.sh"))
            .arg("start")
            .arg(dir.path())
            .args(["0", "0", "0"])
            // The servers die with this process, whichever of its tests run.
            .env("HARBOR_SERVICES_OWNER", std::process::id().to_string())
            .output()
            .unwrap();
        assert!(o.status.success(), "scripts/harbor-services.sh: {}", text(&o));
        let env = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>();
        let registries = dir.path().join("registries.toml");
        std::fs::write(
            &registries,
            format!("[mirrors]\n\"registry.farm.test\" = [\"{}\"]\n", env["HARBOR_REGISTRY"]),
        )
        .unwrap();
        Services { dir, env, registries }
    }
}

/// How many tests of this binary use [`services`] and [`store`].
const USERS: usize = 4;

/// The services, shared by the tests of this binary and stopped when the last of them is
/// done, or with this process when not all of them run (HARBOR_SERVICES_OWNER).
struct SharedServices(&'static Services);

fn services() -> SharedServices {
    static SERVICES: OnceLock<Services> = OnceLock::new();
    SharedServices(SERVICES.get_or_init(Services::start))
}

impl std::ops::Deref for SharedServices {
    type Target = Services;
    fn deref(&self) -> &Services {
        self.0
    }
}

impl Drop for SharedServices {
    fn drop(&mut self) {
        static DONE: AtomicUsize = AtomicUsize::new(0);
        if DONE.fetch_add(1, Ordering::SeqCst) + 1 == USERS {
            self.0.stop();
        }
    }
}

/// One snapshot store for the tests of this binary, removed when the last of them is done
/// (one a cut-short run left behind goes at the next run). The store's per-snapshot lock
/// makes a test that needs what another is building wait for it, then reuse it.
struct Store(&'static Path);

fn store() -> Store {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    let root = ROOT.get_or_init(|| {
        let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
        for entry in std::fs::read_dir(base).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("harbor-store-") {
                if !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        let root = base.join(format!("harbor-store-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        root
    });
    Store(root)
}

impl Drop for Store {
    fn drop(&mut self) {
        static DONE: AtomicUsize = AtomicUsize::new(0);
        if DONE.fetch_add(1, Ordering::SeqCst) + 1 == USERS {
            let _ = std::fs::remove_dir_all(self.0);
        }
    }
}

impl Services {
    fn stop(&self) {
        let _ = Command::new("bash")
            .arg(repo().join("scripts/harbor-services.sh"))
            .arg("stop")
            .arg(self.dir.path())
            .output();
        let _ = std::fs::remove_dir_all(self.dir.path());
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
/// each task's (status, reward, trust), none of them an environment error.
fn run(suite: &Path, s: &Services, store: &Path) -> Outcomes {
    outcomes(&run_rows(suite, s, store))
}

/// Each task's (status, reward, trust), none of them an environment error.
fn outcomes(rows: &BTreeMap<String, serde_json::Value>) -> Outcomes {
    rows.iter()
        .map(|(id, row)| {
            assert_ne!(row["status"], "env_error", "{id}: {row}");
            let row = (
                row["status"].as_str().unwrap().to_string(),
                row["reward"].as_f64().unwrap_or(-1.0),
                row["trust"].as_str().unwrap_or("").to_string(),
            );
            (id.clone(), row)
        })
        .collect()
}

/// Runs a suite as [`run`] does; returns each task's row.
fn run_rows(suite: &Path, s: &Services, store: &Path) -> BTreeMap<String, serde_json::Value> {
    let started = std::time::Instant::now();
    let mut farm = Command::new(env!("CARGO_BIN_EXE_farm"));
    farm.arg("run")
        .arg(suite)
        .env("FARM_REGISTRIES", &s.registries)
        .env("FARM_SNAPSHOT_DIR", store)
        .env("HARBOR_PIP_INDEX", format!("http://{}/simple", s.env["HARBOR_PYPI"]));
    let o = common::dies_with_test(farm).stdin(Stdio::null()).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let name = suite.file_stem().unwrap().to_string_lossy();
    eprintln!(
        "[harbor test] farm run {name}: {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let journal = std::fs::read_to_string(suite.parent().unwrap().join(format!("out-{name}/journal.jsonl"))).unwrap();
    let rows: BTreeMap<String, serde_json::Value> = journal
        .lines()
        .map(|l| {
            let row: serde_json::Value = serde_json::from_str(l).unwrap();
            let id = row["task_id"].as_str().unwrap().rsplit('/').next().unwrap().to_string();
            (id, row)
        })
        .collect();
    // Each row's verdict and its basis, printed only when a test fails: the reason a verdict
    // differs from the expected one is then in the failure's output.
    for (id, row) in &rows {
        let details: serde_json::Value = row["score_details"]
            .as_str()
            .and_then(|d| serde_json::from_str(d).ok())
            .unwrap_or_default();
        let tests = &details["tests"];
        eprintln!(
            "[harbor test]   {id}: {} {} {} | {} | {} | {} | stdout {:?} | stderr {:?}",
            row["status"],
            row["reward"],
            row["trust"],
            row["error"].as_str().unwrap_or(""),
            details["basis"].as_str().unwrap_or(""),
            details["agent_failure"].as_str().unwrap_or(""),
            tests["stdout_tail"].as_str().unwrap_or(""),
            tests["stderr_tail"].as_str().unwrap_or(""),
        );
    }
    rows
}

const ORACLE: &str = "[policy]\nkind = \"replay\"\nsource = \"reference\"";

/// The sample tasks, by name.
fn sample_tasks() -> Vec<String> {
    let mut tasks: Vec<String> = std::fs::read_dir(repo().join("configs/data/harbor"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    tasks.sort();
    tasks
}

#[test]
fn oracle_passes_every_harbor_task_and_an_agent_that_does_nothing_fails_every_one() {
    let services = services();
    let dir = tempfile::tempdir().unwrap();
    let store = store();
    let samples = repo().join("configs/data/harbor");
    let oracle = ORACLE;

    // The oracle passes every task, verified live (Harbor's way).
    let full = run_rows(
        &suite(dir.path(), "oracle-live", &samples, oracle, "live", &services),
        &services,
        store.0,
    );
    let rows = outcomes(&full);
    assert_eq!(rows.len(), 11);
    for (task, (status, reward, trust)) in &rows {
        assert_eq!(
            (status.as_str(), *reward, trust.as_str()),
            ("passed", 1.0, "hardened"),
            "{task}"
        );
    }
    // What solve.sh printed is in the oracle's step, and Harbor's logs and the task's
    // artifacts are in the run folder, as the row lists them.
    let row = &full["workdir-env"];
    assert!(
        row["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|step| step["kind"] == "exec"
                && step["stdout"]
                    .as_str()
                    .unwrap()
                    .contains("wrote /srv/work/greeting.txt")),
        "{row}"
    );
    let details: serde_json::Value = serde_json::from_str(row["score_details"].as_str().unwrap()).unwrap();
    let logs = &details["harbor_logs"];
    let folder = dir
        .path()
        .join("out-oracle-live")
        .join(logs["folder"].as_str().unwrap());
    let listed: Vec<&str> = logs["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    for path in ["agent/oracle.txt", "verifier/reward.txt", "artifacts/greeting.txt"] {
        assert!(listed.contains(&path), "{path} not in {logs}");
    }
    assert_eq!(
        std::fs::read_to_string(folder.join("verifier/reward.txt"))
            .unwrap()
            .trim(),
        "1"
    );
    assert_eq!(
        std::fs::read_to_string(folder.join("artifacts/greeting.txt")).unwrap(),
        "bonjour\n"
    );
    assert!(std::fs::read_to_string(folder.join("agent/oracle.txt"))
        .unwrap()
        .contains("wrote"));

    // An agent that does nothing (Harbor's nop agent) fails every task.
    let policy = "[policy]\nkind = \"nop\"".to_string();
    let nothing = run(
        &suite(dir.path(), "nothing", &samples, &policy, "live", &services),
        &services,
        store.0,
    );
    for (task, (status, reward, _)) in &nothing {
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
        store.0,
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
    let with_image = std::fs::read_to_string(&toml).unwrap().replace(
        "[environment]\n",
        "[environment]\ndocker_image = \"registry.farm.test/not-there:1\"\n",
    );
    std::fs::write(&toml, with_image).unwrap();
    let rows = run(
        &suite(dir.path(), "fallback", &fallback, oracle, "live", &services),
        &services,
        store.0,
    );
    assert_eq!(rows["hello-fallback"].0, "passed");
    // The run records what the environment was built from, and the report shows it.
    let out = dir.path().join("out-fallback");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let env = &summary["provenance"]["environments"]["hello-fallback"];
    assert_eq!(env["built_from"], "dockerfile", "{env}");
    assert_eq!(env["fallback"]["image"], "registry.farm.test/not-there:1", "{env}");
    assert!(
        env["fallback"]["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{env}"
    );
    assert!(
        env["images"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["resolved"].as_str().unwrap().contains("harbor-base")),
        "the FROM image, as resolved: {env}"
    );
    let report = Command::new(env!("CARGO_BIN_EXE_farm"))
        .args(["report"])
        .arg(&out)
        .arg("--out")
        .arg(dir.path().join("report"))
        .output()
        .unwrap();
    assert!(report.status.success(), "{}", text(&report));
    let index = std::fs::read_to_string(dir.path().join("report/index.html")).unwrap();
    assert!(
        index.contains("Environments") && index.contains("could not be had"),
        "the report shows it"
    );
}

/// Hostile tasks (docs/security.md, "Harbor tasks"): what each mode stops, and what it cannot.
/// Then the verifier's network.
#[test]
fn the_hostile_harbor_tasks_end_as_documented_and_the_verifier_has_a_network_of_its_own() {
    let services = services();
    let dir = tempfile::tempdir().unwrap();
    let store = store();
    let samples = repo().join("configs/data/harbor");
    let oracle = ORACLE;
    let hostile = repo().join("configs/data/harbor-hostile");
    let live = run(
        &suite(dir.path(), "hostile-live", &hostile, oracle, "live", &services),
        &services,
        store.0,
    );
    let fresh = run(
        &suite(dir.path(), "hostile-fresh", &hostile, oracle, "fresh_boot", &services),
        &services,
        store.0,
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

    verifier_networks(dir.path(), &samples, oracle, &services, store.0);
}

/// The verifier's network is its own, and a dependency of it that is down on the host's side
/// is the farm's failure (`env_error`, naming it), never the agent's: the agent cannot make
/// one look down.
fn verifier_networks(dir: &Path, samples: &Path, oracle: &str, s: &Services, store: &Path) {
    let pypi = &s.env["HARBOR_PYPI"];
    let closed = || {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let (down, unlisted) = (closed(), closed());
    // Two folders of copies of pytest-verifier, one per suite below, so that each suite runs
    // only the tasks it asserts on.
    let (agents, verifiers) = (dir.join("agents-network"), dir.join("verifier-network"));
    let copy = |tasks: &Path, name: &str| {
        std::fs::create_dir_all(tasks).unwrap();
        assert!(Command::new("cp")
            .arg("-r")
            .arg(samples.join("pytest-verifier"))
            .arg(tasks.join(name))
            .status()
            .unwrap()
            .success());
        let toml = tasks.join(name).join("task.toml");
        let text = std::fs::read_to_string(&toml)
            .unwrap()
            .replace("farm/pytest-verifier", &format!("farm/{name}"));
        std::fs::write(&toml, text).unwrap();
        // The copies' pip gives up at the first refused connection instead of retrying
        // with back-off: what is checked is whose failure it is, not pip's patience.
        let test_sh = tasks.join(name).join("tests/test.sh");
        let script = std::fs::read_to_string(&test_sh).unwrap();
        assert!(script.contains("pip install --quiet"), "{script}");
        std::fs::write(
            &test_sh,
            script.replace("pip install --quiet", "pip install --retries 0 --quiet"),
        )
        .unwrap();
        tasks.join(name)
    };
    // The verifier's index, on a port the verifier's network names, where nothing listens.
    let dependency_down = copy(&verifiers, "dependency-down");
    let toml = dependency_down.join("task.toml");
    let text = std::fs::read_to_string(&toml).unwrap().replace(
        "${HARBOR_PIP_INDEX:-http://host.farm.internal:15001/simple}",
        &format!("http://host.farm.internal:{down}/simple"),
    );
    std::fs::write(&toml, text).unwrap();
    // The agent (root) redirects the verifier's pip to an index that does not answer, so
    // that its wrong answer reads as a dependency that was down.
    let blame = copy(&verifiers, "blame-the-network");
    let solve = [
        "#!/bin/bash".to_string(),
        "printf 'def mean(values):\\n    return 0\\n' > /app/calc.py".into(),
        "rm -f /usr/local/bin/pip".into(),
        format!(
            "printf '#!/bin/sh\\nexec python3 -m pip \"$@\" --index-url http://host.farm.internal:{unlisted}/simple --retries 0\\n' > /usr/local/bin/pip"
        ),
        "chmod 755 /usr/local/bin/pip".into(),
        "printf '[global]\\nindex-url = http://no-such-host.invalid/simple\\n' > /etc/pip.conf".into(),
    ];
    std::fs::write(blame.join("solution/solve.sh"), solve.join("\n") + "\n").unwrap();
    copy(&agents, "index-up");
    let suite = |name: &str, tasks: &Path, sections: &str| -> PathBuf {
        let text = format!(
            "[suite]\nname = \"{name}\"\n[template]\nimage = \"minimal\"\n[dataset]\npath = \"{}\"\nformat = \"harbor\"\n{oracle}\n\
             [harbor]\nverify = \"live\"\n[harbor.build_network]\nallow = [\"{pypi}\"]\n{sections}[output]\ndir = \"out-{name}\"\n",
            tasks.display()
        );
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    };
    // No [harbor.verifier_network]: test.sh has no network, whatever the agent's allowed.
    let rows = run_rows(
        &suite(
            "agents-network-only",
            &agents,
            &format!("[rollouts.network]\nallow = [\"{pypi}\"]\n"),
        ),
        s,
        store,
    );
    let row = &rows["index-up"];
    assert_eq!(
        (row["status"].as_str(), row["reward"].as_f64()),
        (Some("failed"), Some(0.0)),
        "the verifier installed pytest through the agent's network: {row}"
    );
    // It failed for want of a network: pip could not reach the index (its log is one of the
    // verifier's Harbor logs).
    let details: serde_json::Value = serde_json::from_str(row["score_details"].as_str().unwrap()).unwrap();
    let pip_log = dir
        .join("out-agents-network-only")
        .join(details["harbor_logs"]["folder"].as_str().unwrap())
        .join("verifier/pip.log");
    let pip_log = std::fs::read_to_string(&pip_log).unwrap_or_else(|e| panic!("{}: {e}", pip_log.display()));
    assert!(
        !pip_log.contains("Successfully installed") && pip_log.contains("Could not find a version"),
        "{pip_log}"
    );
    // The verifier may reach the index and the port that is down. (That the same task passes
    // when the verifier's network has the index is the pytest-verifier row of oracle-live, in the
    // test above.)
    let rows = run_rows(
        &suite(
            "verifier-network",
            &verifiers,
            &format!("[harbor.verifier_network]\nallow = [\"{pypi}\", \"host.farm.internal:{down}\"]\n"),
        ),
        s,
        store,
    );
    let row = &rows["dependency-down"];
    assert_eq!(row["status"], "env_error", "{row}");
    assert!(row["reward"].is_null(), "{row}");
    let error = row["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("host.farm.internal:{down}")) && error.contains("failed on the host's side"),
        "{error}"
    );
    let row = &rows["blame-the-network"];
    assert_eq!(
        (row["status"].as_str(), row["reward"].as_f64()),
        (Some("failed"), Some(0.0)),
        "a down index the agent pointed the verifier at is the agent's failure: {row}"
    );
}

/// Harbor's own CLI (PyPI `harbor`, in the set-up's venv) on farm's environment backend
/// (`farm_sdk.harbor:FarmEnvironment`, clients/python), against a `farm serve` with the
/// sandbox API of its own.
struct HarborCli {
    harbor: PathBuf,
    service: common::serve::Proc,
    url: String,
    build_args: String,
    pypi: String,
    jobs: PathBuf,
    run_dir: PathBuf,
    /// The key of the tenant the trials run as.
    key: String,
}

/// Trials of one Harbor job, by task name: each one's result.json and folder.
type Trials = BTreeMap<String, (serde_json::Value, PathBuf)>;

impl HarborCli {
    fn start(dir: &Path, s: &Services, store: &Path) -> HarborCli {
        let cache = std::env::var_os("FARM_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/farm"));
        let harbor = cache.join("harbor-venv/bin/harbor");
        assert!(
            harbor.exists(),
            "no Harbor at {}: run scripts/setup.sh",
            harbor.display()
        );
        let (apt, pypi) = (&s.env["HARBOR_APT"], &s.env["HARBOR_PYPI"]);
        let config = dir.join("serve-sandboxes.toml");
        std::fs::write(
            &config,
            format!(
                "[serve]\nsuites = []\n[serve.sandboxes]\n[serve.sandboxes.build_network]\nallow = [\"{apt}\", \"{pypi}\"]\n\
                 [serve.sandboxes.networks.harbor]\nallow = [\"{pypi}\"]\n"
            ),
        )
        .unwrap();
        let run_dir = dir.join("serve-run");
        // Harbor's trials run as a tenant (docs/tenants.md), granted the network they name.
        let key = common::serve::tenant_key(&dir.join("serve-out/tenants.db"), "harbor", &["harbor"]);
        let mut serve = Command::new(env!("CARGO_BIN_EXE_farm"));
        serve
            .arg("serve")
            .arg(&config)
            .arg("--out")
            .arg(dir.join("serve-out"))
            .args(["--listen", "127.0.0.1:0"])
            .env("FARM_RUN_DIR", &run_dir)
            .env("FARM_REGISTRIES", &s.registries)
            .env("FARM_SNAPSHOT_DIR", store)
            .env_remove("FARM_SERVE_TOKEN");
        let (service, url) = common::serve::start(serve, "listening on ", false);
        HarborCli {
            harbor,
            service,
            url: url.replace("0.0.0.0", "127.0.0.1"),
            build_args: format!(
                "build_args={{\"APT_REPO\": \"http://{apt}\", \"PIP_INDEX\": \"http://{pypi}/simple\"}}"
            ),
            pypi: pypi.clone(),
            jobs: dir.join("harbor-jobs"),
            run_dir,
            key,
        }
    }

    /// One Harbor job; each trial's result.json by task name, and what Harbor printed.
    fn job(&self, name: &str, tasks: &Path, agent: &[&str], env: &[(&str, &str)]) -> (Trials, String) {
        let mut c = Command::new(&self.harbor);
        c.arg("run")
            .args(["--env", "farm_sdk.harbor:FarmEnvironment", "--path"])
            .arg(tasks)
            .args(agent)
            .args(["--n-concurrent", "2", "--yes", "--quiet", "--jobs-dir"])
            .arg(&self.jobs)
            .args(["--job-name", name])
            .args([
                "--ek",
                &format!("url={}", self.url),
                "--ek",
                "network=harbor",
                "--ek",
                &self.build_args,
            ])
            .env("PYTHONPATH", repo().join("clients/python"))
            // What the tasks' ${HARBOR_PIP_INDEX:-...} read (Harbor resolves it, as farm does).
            .env("HARBOR_PIP_INDEX", format!("http://{}/simple", self.pypi))
            .env("FARM_SERVE_TOKEN", &self.key);
        for (k, v) in env {
            c.env(k, v);
        }
        let mut c = common::dies_with_test(c);
        c.stdin(Stdio::null());
        let started = std::time::Instant::now();
        let o = c.output().unwrap();
        eprintln!(
            "[harbor test] harbor run {name}: {:.0} s",
            started.elapsed().as_secs_f64()
        );
        let said = text(&o);
        let mut trials = BTreeMap::new();
        for entry in std::fs::read_dir(self.jobs.join(name)).unwrap_or_else(|e| panic!("job {name}: {e}\n{said}")) {
            let path = entry.unwrap().path().join("result.json");
            if let Ok(raw) = std::fs::read_to_string(&path) {
                let result: serde_json::Value = serde_json::from_str(&raw).unwrap();
                let task = result["task_name"]
                    .as_str()
                    .unwrap()
                    .rsplit('/')
                    .next()
                    .unwrap()
                    .to_string();
                trials.insert(task, (result, path.parent().unwrap().to_path_buf()));
            }
        }
        (trials, said)
    }
}

impl HarborCli {
    /// Stops the service (SIGTERM) and checks that no QEMU of it is left. (A test that fails
    /// before this kills the service when `service` is dropped.)
    fn stop(mut self) {
        common::serve::stop(&mut self.service);
        common::assert_no_qemu_of(&self.run_dir);
    }
}

fn reward(result: &serde_json::Value) -> Option<f64> {
    result["verifier_result"]["rewards"]["reward"].as_f64()
}

/// Harbor's own CLI on farm's backend: the oracle and the nop agent give the verdicts farm's
/// own run of the same tasks gave (the test above).
#[test]
fn backend_harbors_own_cli_on_farm_gives_the_verdicts_farm_gives() {
    let services = services();
    let dir = tempfile::tempdir().unwrap();
    let store = store();
    let cli = HarborCli::start(dir.path(), &services, store.0);
    // The SDK's own tests on Harbor's Python too (the live ones run in tests/sandboxes.rs).
    let pytest = Command::new(cli.harbor.with_file_name("python"))
        .args(pytest_args(&["clients/python/tests"]))
        .current_dir(repo())
        .env_remove("FARM_TEST_URL")
        .output()
        .unwrap();
    assert!(
        pytest.status.success(),
        "the SDK's tests on Harbor's Python: {}",
        text(&pytest)
    );
    // Harbor is there: its backend's tests ran (only the live ones, without a service, skip).
    assert!(
        !text(&pytest).contains("test_harbor.py"),
        "the SDK's Harbor tests did not run: {}",
        text(&pytest)
    );
    // Task by task: 1 for the oracle on every task, 0 for the nop agent, and no exception.
    let samples = repo().join("configs/data/harbor");
    let tasks = sample_tasks();
    for (name, agent, farm_reward) in [("oracle", "oracle", 1.0), ("nop", "nop", 0.0)] {
        let (trials, said) = cli.job(name, &samples, &["--agent", agent], &[]);
        assert_eq!(trials.len(), tasks.len(), "{name}: {said}");
        for task in &tasks {
            let (result, _) = trials.get(task).unwrap_or_else(|| panic!("{name} {task}: {said}"));
            assert!(result["exception_info"].is_null(), "{name} {task}: {result}");
            assert_eq!(reward(result), Some(farm_reward), "{name} {task}: {result}");
        }
    }
    cli.stop();
}

/// Harbor's terminus-2 agent solves a task through a scripted model on loopback, and a
/// failure on farm's side (a build that fails, a VM that dies) reaches Harbor as an exception
/// with farm's message, never as a reward. (A test of its own, named to sort last: the two
/// longest tests of this binary start first, and the shorter ones fill in after them.)
#[test]
fn the_terminus_2_agent_through_harbors_cli_solves_a_task_and_farms_failures_are_harbors_exceptions() {
    let services = services();
    let dir = tempfile::tempdir().unwrap();
    let store = store();
    let (dir, cli) = (dir.path(), HarborCli::start(dir.path(), &services, store.0));

    // terminus-2, driving tmux in the sandbox, with a scripted model.
    let mut model = Command::new("python3");
    model.arg(repo().join("farm/tests/scripted_model.py"));
    let requests = dir.join("model-requests.jsonl");
    model.env("SCRIPTED_LLM_LOG", &requests);
    let (model, port) = common::serve::start(model, "listening on ", true);
    let api_base = format!("api_base=http://127.0.0.1:{port}/v1");
    let (trials, said) = cli.job(
        "terminus",
        &repo().join("configs/data/harbor-agents"),
        &[
            "--agent",
            "terminus-2",
            "--model",
            "openai/scripted",
            "--ak",
            &api_base,
            "--ak",
            "record_terminal_session=false",
        ],
        &[("OPENAI_API_KEY", "sk-scripted")],
    );
    drop(model);
    let (result, trial) = trials.get("tmux-greeting").unwrap_or_else(|| panic!("{said}"));
    assert!(result["exception_info"].is_null(), "{result}");
    assert_eq!(reward(result), Some(1.0), "{result}");
    assert!(std::fs::read_to_string(&requests).unwrap().lines().count() >= 2);
    assert!(trial.join("agent/trajectory.json").exists(), "{}", trial.display());

    // farm's failures are Harbor's exceptions, with farm's message, and no reward; what
    // farm cannot honour (a GPU) is refused with the reason, never run differently.
    let (trials, said) = cli.job(
        "failures",
        &repo().join("configs/data/harbor-failures"),
        &["--agent", "oracle"],
        &[],
    );
    for (task, says) in [("broken-build", "line 3"), ("vm-dies", "VM died"), ("needs-gpu", "GPU")] {
        let (result, _) = trials.get(task).unwrap_or_else(|| panic!("{task}: {said}"));
        let exception = &result["exception_info"];
        assert!(
            exception["exception_message"]
                .as_str()
                .is_some_and(|m| m.contains(says)),
            "{task}: {result}"
        );
        assert_eq!(reward(result), None, "{task}: {result}");
    }
    cli.stop();
}
