//! Agent frameworks on `farm serve`'s sandboxes, each the real package from PyPI (the
//! agents venv of `scripts/setup.sh`): SWE-ReX's deployment (`farm_sdk.swerex`, its server
//! installed in the guest from wheels, offline) with bash sessions whose state carries across
//! commands, one-off commands and files; mini-swe-agent's environment
//! (`farm_sdk.minisweagent`) running a task end to end with the package's own deterministic
//! model; and the SDK's processes, ports and terminal, sync and async, against real guests.
//! The checks are `clients/python/tests/frameworks_check.py`, run in the venv with this
//! checkout's SDK on `PYTHONPATH`, after the backends' scripted tests
//! (`clients/python/tests/frameworks_scripted.py`), which must not be skipped there.

mod common;
use common::serve::{farm_serve, repo, stop, Api};
use common::{assert_no_qemu_of, dies_with_test, pytest_args};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const TOKEN: &str = "frameworks-token";
/// SWE-ReX's server for the guest: a Dockerfile on `farm:python` (Debian bookworm's
/// CPython 3.11, no pip) installing it with pip run from its own wheel, from the wheels only
/// (beside Debian's packages, not over them: they have no pip records).
const DOCKERFILE: &str = "FROM farm:python
COPY wheels /tmp/wheels
RUN python3 \"$(echo /tmp/wheels/pip-*.whl)/pip\" install --no-index --find-links /tmp/wheels \\
      --break-system-packages --ignore-installed --no-warn-script-location swe-rex \\
 && rm -rf /tmp/wheels
RUN swerex-remote --version
";

fn cache() -> PathBuf {
    std::env::var_os("FARM_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/farm"))
}

/// The agents venv's Python and the guest's wheels, or a failure saying how to make them.
fn prerequisites() -> (PathBuf, PathBuf) {
    let python = cache().join("agents-venv/bin/python");
    let wheels = cache().join("swerex-wheels");
    let has_pip = std::fs::read_dir(&wheels)
        .map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with("pip-")))
        .unwrap_or(false);
    assert!(
        python.exists() && has_pip,
        "no agents venv ({}) or no guest wheels with pip's ({}): run `bash scripts/setup.sh` (section 7c)",
        python.display(),
        wheels.display()
    );
    (python, wheels)
}

/// The build context: the Dockerfile and the wheels, as a tar archive.
fn context(wheels: &Path) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(DOCKERFILE.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder
        .append_data(&mut header, "Dockerfile", DOCKERFILE.as_bytes())
        .unwrap();
    let mut names: Vec<PathBuf> = std::fs::read_dir(wheels)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    names.sort();
    for path in names {
        let name = format!("wheels/{}", path.file_name().unwrap().to_string_lossy());
        builder.append_path_with_name(&path, name).unwrap();
    }
    builder.into_inner().unwrap()
}

/// Uploads the context and builds the environment from it; its id once ready.
async fn environment(api: &Api, wheels: &Path) -> String {
    let response = api
        .http
        .post(format!("{}/v1/contexts", api.url))
        .bearer_auth(TOKEN)
        .header("content-type", "application/x-tar")
        .body(context(wheels))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let uploaded: Value = response.json().await.unwrap();
    assert_eq!(status, 201, "{uploaded}");
    let request = json!({ "dockerfile": { "context": uploaded["context"] }, "memory_mib": 1024 });
    let env = api.call("POST", "/v1/environments", Some(request)).await.1;
    let id = env["id"].as_str().unwrap_or_else(|| panic!("{env}")).to_string();
    let started = Instant::now();
    let mut offset = 0;
    loop {
        let path = format!("/v1/environments/{id}/logs?offset={offset}&wait=30");
        let logs = api.ok("GET", &path, None, 200).await;
        for line in logs["lines"].as_array().unwrap() {
            eprintln!("build: {}", line.as_str().unwrap_or(""));
        }
        offset = logs["next"].as_u64().unwrap();
        match logs["state"].as_str().unwrap() {
            "ready" => break,
            "building" => {}
            _ => panic!(
                "the build failed: {}",
                api.ok("GET", &format!("/v1/environments/{id}"), None, 200).await
            ),
        }
        assert!(started.elapsed() < Duration::from_secs(1800), "the build never ended");
    }
    eprintln!("environment {id} ready after {:.0?}", started.elapsed());
    id
}

/// `args` run by the agents venv's Python from the checkout, with its SDK on `PYTHONPATH`:
/// (succeeded, stdout, stderr), its output shown.
async fn venv_python(python: &Path, args: &[&str], home: &Path) -> (bool, String, String) {
    let mut command = std::process::Command::new(python);
    command
        .args(args)
        .current_dir(repo())
        .env("PYTHONPATH", repo().join("clients/python"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("FARM_SERVE_TOKEN", TOKEN)
        .env("MSWEA_GLOBAL_CONFIG_DIR", home.join("mini-swe-agent"))
        .env("MSWEA_SILENT_STARTUP", "1")
        .env_remove("FARM_URL");
    let started = Instant::now();
    let out = tokio::process::Command::from(dies_with_test(command))
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    eprintln!("--- {}: {:.0?} ---\n{stdout}", args.join(" "), started.elapsed());
    (out.status.success(), stdout, stderr)
}

/// Runs one part of frameworks_check.py; it must end well and say so.
async fn check(python: &Path, part: &str, url: &str, env: &str, home: &Path) {
    let script = "clients/python/tests/frameworks_check.py";
    let (ok, stdout, stderr) = venv_python(python, &[script, part, url, env], home).await;
    assert!(
        ok && stdout.contains(&format!("{part}: ok")),
        "{part} failed\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_frameworks_run_in_sandboxes() {
    let (python, wheels) = prerequisites();
    // The backends against the scripted service first, in the venv that has the frameworks:
    // none of these tests may be skipped here.
    let home = tempfile::tempdir().unwrap();
    let args = pytest_args(&["clients/python/tests/frameworks_scripted.py"]);
    let (ok, stdout, stderr) = venv_python(&python, &args, home.path()).await;
    assert!(
        ok && stdout.contains(" passed") && !stdout.contains("skipped"),
        "the backends' scripted tests\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
    );
    let dir = tempfile::tempdir().unwrap();
    let (out, run_dir) = (dir.path().join("out"), dir.path().join("run"));
    let config = dir.path().join("frameworks.toml");
    std::fs::write(
        &config,
        "[serve]\nsuites = []\n[serve.sandboxes]\nidle_timeout_secs = 600\nmax_lifetime_secs = 7200\n",
    )
    .unwrap();
    let (mut service, url) = farm_serve(&config, &out, &run_dir, "127.0.0.1:0", Some(TOKEN));
    let api = Api::new(&url, Some(TOKEN));
    let env = environment(&api, &wheels).await;
    for part in ["swerex", "minisweagent", "swebench", "sdk"] {
        check(&python, part, &url, &env, dir.path()).await;
    }
    // Every check removed what it made: no sandbox is left.
    let left = api.ok("GET", "/v1/sandboxes", None, 200).await;
    assert_eq!(left["sandboxes"], json!([]), "sandboxes were left: {left}");
    stop(&mut service);
    assert_no_qemu_of(&run_dir);
}
