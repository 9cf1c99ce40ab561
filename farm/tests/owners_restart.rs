//! Owners across a restart of `farm serve`, against real guests (the minimal image). A fork
//! taken up after a restart carries its owner from the tenants database into its entry in the
//! service's book: another tenant's GET, list and calls see nothing of it, and once resumed it
//! counts against its owner's `live` quota, not anyone else's.

mod common;
use common::assert_no_qemu_of;
use common::serve::{farm_serve, farm_tenant, new_key, stop, Api};

use serde_json::json;

/// The ids of the caller's sandboxes.
async fn listed(api: &Api) -> Vec<String> {
    let list = api.ok("GET", "/v1/sandboxes", None, 200).await;
    list["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

/// A sandbox of the caller's, of the minimal image: (its id, its environment).
async fn sandbox_of(api: &Api) -> (String, String) {
    let (status, env) = api
        .call("POST", "/v1/environments", Some(json!({ "image": "minimal" })))
        .await;
    assert!(status == 200 || status == 202, "{status} {env}");
    let env = env["id"].as_str().unwrap().to_string();
    api.wait_built(&env).await;
    let made = api
        .ok(
            "POST",
            "/v1/sandboxes",
            Some(json!({ "environment": env, "idle_timeout_secs": 600 })),
            201,
        )
        .await;
    (made["id"].as_str().unwrap().to_string(), env)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_taken_up_after_a_restart_is_its_owners_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (out, run_dir) = (dir.path().join("out"), dir.path().join("run"));
    let db = out.join("tenants.db");
    farm_tenant(&db, &["add", "a"]);
    farm_tenant(&db, &["add", "b"]);
    farm_tenant(&db, &["quota", "set", "a", "live", "1"]);
    let ((a_key, _), (b_key, _)) = (new_key(&db, "a", &[]), new_key(&db, "b", &[]));
    let config = dir.path().join("owners.toml");
    std::fs::write(&config, "[serve]\nsuites = []\n[serve.sandboxes]\n").unwrap();

    let (mut service, url) = farm_serve(&config, &out, &run_dir, "127.0.0.1:0", Some("operator"));
    let (a, b) = (Api::new(&url, Some(&a_key)), Api::new(&url, Some(&b_key)));
    let (a_box, env) = sandbox_of(&a).await;
    let (b_box, _) = sandbox_of(&b).await;
    a.run_sh(&a_box, "echo a-secret > /root/secret").await;
    // SIGTERM: each live sandbox is paused to disk, to be taken up by the next service.
    stop(&mut service);
    assert_no_qemu_of(&run_dir);

    let (mut service, url) = farm_serve(&config, &out, &run_dir, "127.0.0.1:0", Some("operator"));
    let (a, b) = (Api::new(&url, Some(&a_key)), Api::new(&url, Some(&b_key)));
    assert_eq!(listed(&a).await, std::slice::from_ref(&a_box));
    assert_eq!(listed(&b).await, std::slice::from_ref(&b_box));
    // B reaches nothing of A's: every call is a sandbox that never was.
    for (method, path) in [
        ("GET", format!("/v1/sandboxes/{a_box}")),
        ("POST", format!("/v1/sandboxes/{a_box}/resume")),
        ("POST", format!("/v1/sandboxes/{a_box}/branch")),
        ("DELETE", format!("/v1/sandboxes/{a_box}")),
    ] {
        let (status, answer) = b.call(method, &path, None).await;
        assert_eq!(status, 404, "{method} {path} as B: {answer}");
    }
    let (status, answer) = b
        .call(
            "POST",
            &format!("/v1/sandboxes/{a_box}/exec"),
            Some(json!({ "command": "cat /root/secret" })),
        )
        .await;
    assert_eq!(status, 404, "B's exec on A's sandbox: {answer}");
    // A's own, resumed, as A left it.
    a.ok("POST", &format!("/v1/sandboxes/{a_box}/resume"), None, 200).await;
    a.sh_prints(&a_box, "cat /root/secret", "a-secret").await;
    // Resumed, it is A's one live fork: a second is over A's quota, and B's is not A's.
    a.over_live_quota(&env).await;
    b.ok("POST", &format!("/v1/sandboxes/{b_box}/resume"), None, 200).await;
    stop(&mut service);
    assert_no_qemu_of(&run_dir);
}
