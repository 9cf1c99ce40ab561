//! E2B's protocol as a front door, driven by E2B's own SDK (`e2b` from PyPI, unmodified: 2.63
//! in `$FARM_CACHE_DIR/e2b-venv`, 2.45 in `e2b-245-venv`): `e2b_check.py` makes, runs, reads,
//! writes, lists, pauses, resumes and kills sandboxes through the sync and the async client as
//! tenant A, and checks that tenant B reaches nothing of A's, and that a sandbox's access token
//! opens its own in-sandbox routes and no other. Here: the audit names the E2B calls, and
//! nothing is left.

mod common;
use common::assert_no_qemu_of;
use common::serve::{farm_serve, farm_tenant, new_key, repo, stop, Api};
use std::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2bs_sdk_drives_farm_sandboxes_and_reaches_nothing_of_another_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let (out, run_dir) = (dir.path().join("out"), dir.path().join("run"));
    let db = out.join("tenants.db");
    farm_tenant(&db, &["add", "a"]);
    farm_tenant(&db, &["add", "b"]);
    let ((a_key, _), (b_key, _)) = (new_key(&db, "a", &[]), new_key(&db, "b", &[]));
    let config = dir.path().join("e2b.toml");
    std::fs::write(&config, "[serve]\nsuites = []\n[serve.sandboxes]\n").unwrap();
    let (mut service, url) = farm_serve(&config, &out, &run_dir, "127.0.0.1:0", Some("operator"));

    // The template: an environment of the python image (bash, as E2B's templates have), made
    // by each tenant (an environment is visible to the tenants that asked for it).
    let (a, b) = (Api::new(&url, Some(&a_key)), Api::new(&url, Some(&b_key)));
    let template = a.environment("python").await;
    assert_eq!(b.environment("python").await, template);

    // The newest SDK tested, and 2.45 (which makes sandboxes at `POST /sandboxes`).
    for venv in ["e2b-venv", "e2b-245-venv"] {
        let check = Command::new(common::python::venv(venv))
            .args(["farm/tests/e2b_check.py", &url, &a_key, &b_key, &template])
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
        assert!(check.status.success(), "E2B's SDK ({venv}) against farm:\n{said}");
        let seen: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&check.stdout).lines().last().unwrap_or("")).expect(&said);
        assert_eq!(seen["sync"], "ok", "{venv}");
        assert_eq!(seen["async"], "ok", "{venv}");
        assert_eq!(seen["volumes"], "ok", "{venv}");
        assert_eq!(seen["refusals"].as_object().unwrap().len(), 8, "{venv}: {seen}");
    }

    // Nothing of either tenant is left, and the audit has A's E2B calls under A.
    for api in [&a, &b] {
        let left = api.ok("GET", "/v1/sandboxes", None, 200).await;
        assert_eq!(left["sandboxes"], serde_json::json!([]), "{left}");
    }
    let audit = farm_tenant(&db, &["audit", "--tenant", "a", "--limit", "1000"]);
    for route in [
        "POST /v2/sandboxes",
        "POST /sandboxes/{id}/pause",
        "POST /v2/sandboxes/{id}/connect",
        // 2.45's connect.
        "POST /sandboxes/{id}/connect",
        "DELETE /sandboxes/{id}",
    ] {
        assert!(audit.contains(route), "the audit has no {route}:\n{audit}");
    }
    let b_audit = farm_tenant(&db, &["audit", "--tenant", "b", "--limit", "1000"]);
    assert!(!b_audit.contains("/pause"), "B paused nothing:\n{b_audit}");
    stop(&mut service);
    assert_no_qemu_of(&run_dir);
}
