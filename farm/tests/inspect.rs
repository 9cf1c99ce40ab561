//! inspect_ai's sandbox type `farm` (`farm_sdk.inspectai`), found by inspect through the SDK's
//! `inspect_ai` entry point as pip installs it, in a venv of inspect-ai from PyPI
//! (`$FARM_CACHE_DIR/inspect-venv`, made by scripts/setup.sh), against a real `farm serve`:
//! - inspect's own conformance suite for providers (`self_check`, its 44 checks, unmodified:
//!   `clients/python/tests/inspect_selfcheck.py`) passes, every check;
//! - a real eval of a task of our own (`clients/python/tests/inspect_eval_check.py`: a
//!   Docker task's compose file and Dockerfile as they are, inspect's mock model and `bash`
//!   tool, a scorer in the sandbox) scores as expected, its log shows farm, inspect's
//!   `exec_remote` (its tools binary through exec's stdin, its server left running) answers, and
//!   `--no-sandbox-cleanup` then `inspect sandbox cleanup farm` leaves nothing.

mod common;
use common::assert_no_qemu_of;
use common::serve::{farm_serve, repo, stop, Api};
use std::path::Path;
use std::process::Command;

const TOKEN: &str = "inspect-test-token";

/// `args` run by the inspect venv's Python from the checkout, the installed SDK on its path:
/// its output, after it ended well.
fn run(python: &Path, site: &Path, url: &str, args: &[&str], envs: &[(&str, &str)]) -> String {
    let out = Command::new(python)
        .args(args)
        .current_dir(repo())
        .env("PYTHONPATH", site)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("FARM_URL", url)
        .env("FARM_SERVE_TOKEN", TOKEN)
        .env("INSPECT_LOG_LEVEL", "warning")
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    let said = format!(
        "--- stdout ---\n{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{}:\n{said}", args.join(" "));
    said
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspects_own_suite_and_an_eval_run_on_farm_sandboxes() {
    let python = common::python::venv("inspect-venv");
    let dir = tempfile::tempdir().unwrap();
    let site = common::python::installed_sdk(dir.path());
    let (out, run_dir) = (dir.path().join("out"), dir.path().join("run"));
    let config = dir.path().join("inspect.toml");
    std::fs::write(&config, "[serve]\nsuites = []\n[serve.sandboxes]\n").unwrap();
    let (mut service, url) = farm_serve(&config, &out, &run_dir, "127.0.0.1:0", Some(TOKEN));
    let api = Api::new(&url, Some(TOKEN));
    let env = api.environment("python").await;

    let suite = run(
        &python,
        &site,
        &url,
        &[
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "clients/python/tests/inspect_selfcheck.py",
        ],
        &[("FARM_INSPECT_ENV", &env)],
    );
    assert!(suite.contains("44 passed") && !suite.contains("failed"), "{suite}");

    let task = dir.path().join("task");
    let eval = run(
        &python,
        &site,
        &url,
        &["clients/python/tests/inspect_eval_check.py", &task.to_string_lossy()],
        &[],
    );
    assert!(eval.contains(r#""n4": "I""#), "{eval}");

    let left = api.ok("GET", "/v1/sandboxes", None, 200).await;
    assert_eq!(left["sandboxes"], serde_json::json!([]), "sandboxes were left: {left}");
    stop(&mut service);
    assert_no_qemu_of(&run_dir);
}
