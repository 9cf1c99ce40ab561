//! E2B's code interpreter on farm, driven by its own SDK (`e2b-code-interpreter` from PyPI,
//! unmodified, in `$FARM_CACHE_DIR/e2b-venv`): `e2b_interpreter_check.py` runs code with
//! state, output, figures, tables, errors and contexts through the sync and the async client,
//! branches a sandbox and finds its kernel's variables in both copies, pauses and resumes
//! one, and checks that another tenant's sandbox token, a tenant's key, no token or a forged
//! one opens none of the interpreter's routes. Here: the audit names the interpreter's calls,
//! and nothing is left.

mod common;
use common::assert_no_qemu_of;
use common::serve::{farm_serve, farm_tenant, new_key, repo, stop, Api};
use std::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2bs_code_interpreter_keeps_state_branches_with_it_and_opens_to_its_sandbox_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (out, run_dir) = (dir.path().join("out"), dir.path().join("run"));
    let db = out.join("tenants.db");
    farm_tenant(&db, &["add", "a"]);
    farm_tenant(&db, &["add", "b"]);
    let ((a_key, _), (b_key, _)) = (new_key(&db, "a", &[]), new_key(&db, "b", &[]));
    let config = dir.path().join("e2b.toml");
    std::fs::write(&config, "[serve]\nsuites = []\n[serve.sandboxes]\n").unwrap();
    let (mut service, url) = farm_serve(&config, &out, &run_dir, "127.0.0.1:0", Some("operator"));
    // A template with no interpreter, to be told so.
    let plain = Api::new(&url, Some(&a_key)).environment("python").await;

    let python = common::python::venv("e2b-venv");
    let check = Command::new(python)
        .args(["farm/tests/e2b_interpreter_check.py", &url, &a_key, &b_key, &plain])
        .current_dir(repo())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("E2B_API_KEY")
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .output()
        .unwrap();
    let said = format!(
        "--- stdout ---\n{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        check.status.success(),
        "E2B's code interpreter SDK against farm:\n{said}"
    );
    let seen: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&check.stdout).lines().last().unwrap_or("")).expect(&said);
    for part in ["sync", "branch", "pause", "async"] {
        assert_eq!(seen[part], "ok", "{part}: {seen}");
    }
    assert_eq!(seen["refusals"], 16, "{seen}");

    for key in [&a_key, &b_key] {
        let left = Api::new(&url, Some(key)).ok("GET", "/v1/sandboxes", None, 200).await;
        assert_eq!(left["sandboxes"], serde_json::json!([]), "{left}");
    }
    let audit = farm_tenant(&db, &["audit", "--tenant", "a", "--limit", "1000"]);
    for route in [
        "POST /execute",
        "POST /contexts",
        "POST /contexts/{context}/restart",
        "DELETE /contexts/{context}",
    ] {
        assert!(audit.contains(route), "the audit has no {route}:\n{audit}");
    }
    stop(&mut service);
    assert_no_qemu_of(&run_dir);
}
