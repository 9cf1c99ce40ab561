//! NeMo Gym's sandbox providers: farm's (`farm_sdk.nemogym.FarmProvider`), found by Gym
//! through the `nemo_gym.sandbox_providers` entry point of the SDK as pip installs it, in a
//! venv of nemo-gym from PyPI (`$FARM_CACHE_DIR/nemogym-venv`, made by scripts/setup.sh).
//! `clients/python/tests/nemogym_check.py` holds the provider to the protocol's contract,
//! uses farm's extras (branch, pause and resume, snapshot, a port), and runs a Gym resources
//! server of its own with a scripted policy: six rollouts with the expected rewards. Here:
//! the SDK is installed (from a copy: the checkout stays clean) and nothing is left.

mod common;
use common::assert_no_qemu_of;
use common::serve::{farm_serve, repo, stop, Api};
use std::process::Command;

const TOKEN: &str = "nemogym-test-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nemo_gym_finds_farms_provider_and_runs_rollouts_in_its_sandboxes() {
    let python = common::python::venv("nemogym-venv");
    let dir = tempfile::tempdir().unwrap();
    let site = common::python::installed_sdk(dir.path());

    let (out, run_dir) = (dir.path().join("out"), dir.path().join("run"));
    let config = dir.path().join("nemogym.toml");
    std::fs::write(&config, "[serve]\nsuites = []\n[serve.sandboxes]\n").unwrap();
    let (mut service, url) = farm_serve(&config, &out, &run_dir, "127.0.0.1:0", Some(TOKEN));
    let api = Api::new(&url, Some(TOKEN));
    let env = api.environment("python").await;

    let check = Command::new(&python)
        .args(["clients/python/tests/nemogym_check.py", &url, &env])
        .current_dir(repo())
        .env("PYTHONPATH", &site)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("FARM_SERVE_TOKEN", TOKEN)
        .env_remove("FARM_URL")
        .output()
        .unwrap();
    let said = format!(
        "--- stdout ---\n{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        check.status.success() && said.contains("nemogym: ok"),
        "NeMo Gym with farm's provider:\n{said}"
    );
    let left = api.ok("GET", "/v1/sandboxes", None, 200).await;
    assert_eq!(left["sandboxes"], serde_json::json!([]), "sandboxes were left: {left}");
    stop(&mut service);
    assert_no_qemu_of(&run_dir);
}
