//! Workspaces against real guests (the minimal image) and two tenants: a workspace outlives
//! its sandboxes and a restart of the service; one writable holder at a time, readers of the
//! last sync, a branch's copy that never reaches it; a lost holder fenced, after which its
//! revived guest's writes are refused at the host and do not land; an archive that would
//! reach outside refused; another tenant names none of it.

mod common;
use common::serve::{farm_serve, farm_tenant, sandboxes_config, Api, Proc};
use common::{assert_no_qemu_of, new_qemus, qemu_pids, signal};
use std::path::Path;

use serde_json::{json, Value};

fn start(config: &Path, out: &Path, run_dir: &Path, keys: (&str, &str)) -> (Proc, Api, Api) {
    let (proc, url) = farm_serve(config, out, run_dir, "127.0.0.1:0", Some("service-token"));
    (proc, Api::new(&url, Some(keys.0)), Api::new(&url, Some(keys.1)))
}

/// A sandbox of `env` with these mounts: its id and its QEMU's pid, where it has a QEMU of
/// its own (not where a pool's spare, reset, became it).
async fn mounted(api: &Api, env: &str, run_dir: &Path, mounts: Value) -> (String, Option<u32>) {
    let before = qemu_pids(run_dir);
    let made = api
        .ok(
            "POST",
            "/v1/sandboxes",
            Some(json!({ "environment": env, "workspaces": mounts })),
            201,
        )
        .await;
    // (A served suite may start VMs of its own meanwhile: the first new one is the sandbox's
    // where none other starts, as in the test that signals it.)
    let qemu = new_qemus(run_dir, &before).first().copied();
    (made["id"].as_str().unwrap().to_string(), qemu)
}

async fn sync(api: &Api, id: &str) -> (u16, Value) {
    api.call("POST", &format!("/v1/sandboxes/{id}/workspaces/sync"), None)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_outlives_its_holders_and_a_fenced_holder_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (out, run_dir) = (dir.path().join("out"), dir.path().join("run"));
    let db = out.join("tenants.db");
    farm_tenant(&db, &["add", "a"]);
    farm_tenant(&db, &["add", "b"]);
    let a_key = farm_tenant(&db, &["key", "add", "a"]).trim().to_string();
    let b_key = farm_tenant(&db, &["key", "add", "b"]).trim().to_string();
    // No pools: every sandbox is a new QEMU process, the one the test finds and signals (a
    // VM reset for a later sandbox is pools.rs's).
    let config = sandboxes_config(dir.path(), "workspaces.toml", "warm_pool_max = 0\n");
    let (service, a, b) = start(&config, &out, &run_dir, (&a_key, &b_key));
    let env = a.environment("minimal").await;
    let made = a
        .ok(
            "POST",
            "/v1/workspaces",
            Some(json!({ "name": "data", "size_mib": 16 })),
            201,
        )
        .await;
    assert_eq!(
        (made["generation"].as_u64(), made["bytes"].as_u64()),
        (Some(0), Some(0))
    );
    let rw = json!([{ "name": "data", "path": "/w" }]);
    let ro = json!([{ "name": "data", "path": "/w", "read_only": true }]);

    // The first holder writes and syncs; a second writer is refused, a reader sees the sync.
    let (s1, _) = mounted(&a, &env, &run_dir, rw.clone()).await;
    a.run_sh(&s1, "echo one > /w/f").await;
    let (status, synced) = sync(&a, &s1).await;
    assert_eq!(status, 200, "{synced}");
    assert_eq!(synced["workspaces"][0]["generation"], 1);
    let (status, held) = a
        .call(
            "POST",
            "/v1/sandboxes",
            Some(json!({ "environment": env, "workspaces": rw })),
        )
        .await;
    assert_eq!(
        (status, held["field"].as_str()),
        (409, Some("workspaces[0].name")),
        "{held}"
    );
    assert!(held["error"].as_str().unwrap().contains(&s1), "{held}");
    let (reader, _) = mounted(&a, &env, &run_dir, ro.clone()).await;
    assert_eq!(a.run_sh(&reader, "cat /w/f").await.1, "one\n");
    a.run_sh(&reader, "echo mine > /w/f").await;
    assert_eq!(sync(&a, &reader).await.0, 409, "a reader's writes never reach it");
    // A branch of the holder has a copy, never the original.
    let child = a.ok("POST", &format!("/v1/sandboxes/{s1}/branch"), None, 201).await;
    assert_eq!(child["workspaces"][0]["mode"], "copy", "{child}");
    let child = child["id"].as_str().unwrap().to_string();
    a.run_sh(&child, "echo branch > /w/f").await;
    assert_eq!(sync(&a, &child).await.0, 409);
    // A write the holder never synced is kept by its delete.
    a.run_sh(&s1, "echo two > /w/g").await;
    a.ok("DELETE", &format!("/v1/sandboxes/{s1}"), None, 200).await;
    let view = a.ok("GET", "/v1/workspaces/data", None, 200).await;
    assert_eq!(view["holder"], Value::Null, "{view}");

    // The next holder starts from it; then it is lost (its VM frozen) and fenced.
    let (s2, s2_qemu) = mounted(&a, &env, &run_dir, rw.clone()).await;
    let s2_qemu = s2_qemu.expect("with no pools, every sandbox is a QEMU of its own");
    assert_eq!(a.run_sh(&s2, "cat /w/f /w/g").await.1, "one\ntwo\n");
    signal(s2_qemu, "-STOP");
    let fenced = a.ok("POST", "/v1/workspaces/data/fence", None, 200).await;
    assert_eq!(fenced["holder"], Value::Null, "{fenced}");
    let (s3, _) = mounted(&a, &env, &run_dir, rw.clone()).await;
    assert_eq!(a.ok("GET", "/v1/workspaces/data", None, 200).await["generation"], 3);
    a.run_sh(&s3, "echo three > /w/f").await;
    assert_eq!(sync(&a, &s3).await.0, 200);
    // The old holder comes back and writes: refused at the host, and nothing of it lands.
    signal(s2_qemu, "-CONT");
    a.run_sh(&s2, "echo stale > /w/f; echo stale > /w/h").await;
    let (status, refused) = sync(&a, &s2).await;
    assert_eq!(status, 409, "{refused}");
    assert!(refused["error"].as_str().unwrap().contains("fenced"), "{refused}");
    a.ok("DELETE", &format!("/v1/sandboxes/{s2}"), None, 200).await;
    let (check, _) = mounted(&a, &env, &run_dir, ro.clone()).await;
    assert_eq!(a.run_sh(&check, "cat /w/f; ls /w").await.1, "three\nf\ng\n");

    // An archive that would reach outside the workspace is refused; nothing changes.
    a.run_sh(&s3, "ln -s /etc /w/evil").await;
    let (status, bad) = sync(&a, &s3).await;
    assert_eq!(status, 400, "{bad}");
    assert!(
        bad["error"].as_str().unwrap().contains("outside the workspace"),
        "{bad}"
    );
    a.run_sh(&s3, "rm /w/evil").await;

    // B names none of it, and its own "data" is another workspace.
    for (method, path) in [
        ("GET", "/v1/workspaces/data"),
        ("DELETE", "/v1/workspaces/data"),
        ("POST", "/v1/workspaces/data/fence"),
    ] {
        let (status, theirs) = b.call(method, path, None).await;
        let (_, never) = b.call(method, &path.replace("data", "never"), None).await;
        assert_eq!(status, 404, "{method} {path}: {theirs}");
        assert_eq!(
            theirs.to_string().replace("data", "X"),
            never.to_string().replace("never", "X")
        );
    }
    assert_eq!(b.ok("GET", "/v1/workspaces", None, 200).await["workspaces"], json!([]));
    let b_env = b.environment("minimal").await;
    let (status, _) = b
        .call(
            "POST",
            "/v1/sandboxes",
            Some(json!({ "environment": b_env, "workspaces": ro })),
        )
        .await;
    assert_eq!(status, 404);
    b.ok(
        "POST",
        "/v1/workspaces",
        Some(json!({ "name": "data", "size_mib": 1 })),
        201,
    )
    .await;
    assert_eq!(a.ok("GET", "/v1/workspaces/data", None, 200).await["generation"], 3);

    // A restart keeps the workspace, its bytes and its holder.
    let mut service = service;
    service.child.kill().unwrap();
    service.child.wait().unwrap();
    assert_no_qemu_of(&run_dir);
    let (service, a, _b) = start(&config, &out, &run_dir, (&a_key, &b_key));
    let view = a.ok("GET", "/v1/workspaces/data", None, 200).await;
    assert_eq!(
        (view["holder"].as_str(), view["generation"].as_u64()),
        (Some(s3.as_str()), Some(3)),
        "{view}"
    );
    assert!(
        a.ok("DELETE", "/v1/workspaces/data", None, 409)
            .await
            .get("error")
            .is_some(),
        "held by s3"
    );
    a.ok("POST", &format!("/v1/sandboxes/{s3}/resume"), None, 200).await;
    a.run_sh(&s3, "echo four > /w/f").await;
    assert_eq!(sync(&a, &s3).await.0, 200, "still its holder after the restart");
    a.ok("DELETE", &format!("/v1/sandboxes/{s3}"), None, 200).await;
    let (after, _) = mounted(&a, &env, &run_dir, ro).await;
    assert_eq!(a.run_sh(&after, "cat /w/f").await.1, "four\n");
    a.ok("DELETE", &format!("/v1/sandboxes/{after}"), None, 200).await;
    a.ok("DELETE", "/v1/workspaces/data", None, 200).await;
    drop(service);
    assert_no_qemu_of(&run_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_starts_from_a_workspace_and_a_rollout_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let (out, run_dir) = (dir.path().join("out"), dir.path().join("run"));
    let config = common::serve::suite_config(dir.path(), "sessions.toml", "");
    let (service, url) = farm_serve(&config, &out, &run_dir, "127.0.0.1:0", None);
    let api = Api::new(&url, None);
    let env = api.environment("minimal").await;
    api.ok(
        "POST",
        "/v1/workspaces",
        Some(json!({ "name": "repo", "size_mib": 4 })),
        201,
    )
    .await;
    let (holder, _) = mounted(&api, &env, &run_dir, json!([{ "name": "repo", "path": "/w" }])).await;
    api.run_sh(&holder, "echo 'def f(): return 1' > /w/lib.py").await;
    assert_eq!(sync(&api, &holder).await.0, 200);
    // A session of the suite's task starts with the workspace's files; its writes stay its own.
    let task = json!({ "task_id": "answer" });
    let with = |mounts: Value| {
        let mut body = task.clone();
        body["workspaces"] = mounts;
        body
    };
    let session = api
        .new_session(with(json!([{ "name": "repo", "path": "/src", "read_only": true }])))
        .await;
    let seen = api
        .session_exec(&session, "cat /src/lib.py; echo more > /src/lib.py")
        .await;
    assert_eq!(seen["step"]["stdout"], "def f(): return 1\n", "{seen}");
    let (status, refused) = api
        .call(
            "POST",
            "/v1/sessions",
            Some(with(json!([{ "name": "repo", "path": "/src" }]))),
        )
        .await;
    assert_eq!(
        (status, refused["field"].as_str()),
        (400, Some("workspaces[0].read_only")),
        "{refused}"
    );
    let (status, refused) = api
        .call(
            "POST",
            "/v1/rollouts",
            Some(json!({ "items": [with(json!([{ "name": "repo", "path": "/src", "read_only": true }]))] })),
        )
        .await;
    assert_eq!(
        (status, refused["field"].as_str()),
        (400, Some("items[0].workspaces")),
        "{refused}"
    );
    // A session's resume checks what it was to keep, as a sandbox's does.
    api.ok("POST", &format!("/v1/sessions/{session}/pause"), None, 200)
        .await;
    let keep = json!({ "keep": { "files": [{ "path": "/src/lib.py" }, { "path": "/src/gone" }] } });
    let (status, refused) = api
        .call("POST", &format!("/v1/sessions/{session}/resume"), Some(keep))
        .await;
    assert_eq!(status, 409, "{refused}");
    assert!(refused["error"].as_str().unwrap().contains("/src/gone"), "{refused}");
    let keep = json!({ "keep": { "files": [{ "path": "/src/lib.py", "size": 5 }] } });
    api.ok("POST", &format!("/v1/sessions/{session}/resume"), Some(keep), 200)
        .await;
    let kinds: Vec<String> = api.ok("GET", &format!("/v1/events?sandbox={session}"), None, 200).await["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds, ["created", "paused", "resume_failed", "resumed"]);
    api.ok("DELETE", &format!("/v1/sessions/{session}"), None, 200).await;
    api.ok("DELETE", &format!("/v1/sandboxes/{holder}"), None, 200).await;
    let (check, _) = mounted(
        &api,
        &env,
        &run_dir,
        json!([{ "name": "repo", "path": "/w", "read_only": true }]),
    )
    .await;
    assert_eq!(
        api.run_sh(&check, "cat /w/lib.py").await.1,
        "def f(): return 1\n",
        "the session wrote nothing to it"
    );
    drop(service);
    assert_no_qemu_of(&run_dir);
}
