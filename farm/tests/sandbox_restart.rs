//! Sandboxes across restarts of `farm serve`, against real guests (the minimal image): after
//! `kill -9`, each sandbox comes back paused, as its last checkpoint had it (its files, its
//! running processes with their pids, its open ports and their tokens), or, never
//! checkpointed, as its environment; after SIGTERM, as of the stop.

mod common;
use common::assert_no_qemu_of;
use common::serve::{farm_serve, sandboxes_config, stop, Api, Proc};
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

/// A GET through the port listener with a port token: (status, body).
async fn through_port(port: &Value, token: &str) -> (u16, String) {
    let address = port["address"].as_str().unwrap();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    for _ in 0..100 {
        let response = client
            .get(format!("http://{address}/"))
            .header("Farm-Port-Token", token)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body = response.text().await.unwrap();
        if status != 502 {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("the server behind the port never answered");
}

/// The newest lifecycle event of a sandbox.
async fn last_event(api: &Api, id: &str) -> Value {
    let list = api
        .ok("GET", &format!("/v1/events?sandbox={id}&limit=1000"), None, 200)
        .await;
    list["events"].as_array().unwrap().last().cloned().unwrap()
}

fn kill_9(service: &mut Proc) {
    service.child.kill().unwrap();
    service.child.wait().unwrap();
}

struct Service {
    proc: Proc,
    api: Api,
}

fn start(config: &Path, out: &Path, run_dir: &Path) -> Service {
    let (proc, url) = farm_serve(config, out, run_dir, "127.0.0.1:0", None);
    Service {
        proc,
        api: Api::new(&url, None),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_come_back_paused_after_kill_9_and_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let (out, run_dir) = (dir.path().join("out"), dir.path().join("run"));
    let config = sandboxes_config(dir.path(), "restart.toml", "");
    let mut s = start(&config, &out, &run_dir);
    let env = s.api.environment("minimal").await;
    let make = |metadata: Value| json!({ "environment": env, "metadata": metadata, "idle_timeout_secs": 600 });
    let a = s
        .api
        .ok("POST", "/v1/sandboxes", Some(make(json!({ "name": "a" }))), 201)
        .await;
    let a = a["id"].as_str().unwrap().to_string();
    let b = s
        .api
        .ok("POST", "/v1/sandboxes", Some(make(json!({ "name": "b" }))), 201)
        .await;
    let b = b["id"].as_str().unwrap().to_string();
    // A: a file, a counter running in the background, a web server behind an open port, then
    // a checkpoint; then a file the checkpoint does not have.
    s.api
        .run_sh(&a, "echo one > /tmp/f1; mkdir -p /www; echo served > /www/index.html")
        .await;
    let counter = s
        .api
        .ok(
            "POST",
            &format!("/v1/sandboxes/{a}/processes"),
            Some(json!({ "command": "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 1; done" })),
            201,
        )
        .await["pid"]
        .clone();
    s.api
        .ok(
            "POST",
            &format!("/v1/sandboxes/{a}/processes"),
            Some(json!({ "argv": ["httpd", "-f", "-p", "127.0.0.1:8000", "-h", "/www"] })),
            201,
        )
        .await;
    let port = s
        .api
        .ok(
            "POST",
            &format!("/v1/sandboxes/{a}/ports"),
            Some(json!({ "port": 8000 })),
            201,
        )
        .await;
    let token = port["token"].as_str().unwrap().to_string();
    assert_eq!(through_port(&port, &token).await, (200, "served\n".into()));
    let checkpointed = s
        .api
        .ok("POST", &format!("/v1/sandboxes/{a}/checkpoint"), None, 200)
        .await;
    assert!(checkpointed["checkpoint_at_ms"].as_u64().is_some(), "{checkpointed}");
    assert_eq!(s.api.run_sh(&a, "cat /tmp/f1").await.1, "one\n", "it runs on");
    s.api.run_sh(&a, "echo two > /tmp/f2").await;
    // B: never checkpointed.
    s.api.run_sh(&b, "echo lost > /tmp/b").await;

    kill_9(&mut s.proc);
    assert_no_qemu_of(&run_dir);
    let mut s = start(&config, &out, &run_dir);
    // Each says what the restart cost it.
    let (a_told, b_told) = (last_event(&s.api, &a).await, last_event(&s.api, &b).await);
    for (told, lost) in [
        (&a_told, "from its last checkpoint"),
        (&b_told, "fresh fork of its environment"),
    ] {
        assert_eq!(
            (told["type"].as_str(), told["cause"].as_str()),
            (Some("restored"), Some("service_restart")),
            "{told}"
        );
        let reason = told["reason"].as_str().unwrap();
        assert!(reason.contains(lost) && reason.contains("is lost"), "{reason}");
    }
    let list = s.api.ok("GET", "/v1/sandboxes", None, 200).await;
    let states: Vec<(&str, &str)> = list["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| (x["metadata"]["name"].as_str().unwrap(), x["state"].as_str().unwrap()))
        .collect();
    let mut states = states;
    states.sort();
    assert_eq!(states, [("a", "paused"), ("b", "paused")], "{list}");
    s.api.ok("POST", &format!("/v1/sandboxes/{a}/resume"), None, 200).await;
    assert_eq!(s.api.run_sh(&a, "cat /tmp/f1").await.1, "one\n");
    assert_eq!(
        s.api.run_sh(&a, "cat /tmp/f2").await.0,
        1,
        "written after the checkpoint: gone"
    );
    let process = s
        .api
        .ok("GET", &format!("/v1/sandboxes/{a}/processes/{counter}"), None, 200)
        .await;
    assert_eq!(process["state"], "running", "the counter runs on: {process}");
    let before: u64 = s.api.run_sh(&a, "cat /tmp/count").await.1.trim().parse().unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after: u64 = s.api.run_sh(&a, "cat /tmp/count").await.1.trim().parse().unwrap();
    assert!(after > before, "the counter counts: {before} then {after}");
    let ports = s.api.ok("GET", &format!("/v1/sandboxes/{a}/ports"), None, 200).await;
    assert_eq!(ports["ports"][0]["token"], token.as_str(), "the same token: {ports}");
    assert_eq!(through_port(&ports["ports"][0], &token).await, (200, "served\n".into()));
    s.api.ok("POST", &format!("/v1/sandboxes/{b}/resume"), None, 200).await;
    assert_eq!(
        s.api.run_sh(&b, "cat /tmp/b").await.0,
        1,
        "never checkpointed: its environment again"
    );
    assert_eq!(s.api.run_sh(&b, "echo alive").await.1, "alive\n");

    // A graceful stop keeps everything as of the stop.
    s.api.run_sh(&a, "echo three > /tmp/f3").await;
    stop(&mut s.proc);
    assert_no_qemu_of(&run_dir);
    let mut s = start(&config, &out, &run_dir);
    let told = last_event(&s.api, &a).await;
    assert_eq!(
        (told["type"].as_str(), told["cause"].as_str()),
        (Some("restored"), Some("service_stop")),
        "{told}"
    );
    assert!(told["reason"].as_str().unwrap().contains("exactly"), "{told}");
    s.api.ok("POST", &format!("/v1/sandboxes/{a}/resume"), None, 200).await;
    assert_eq!(s.api.run_sh(&a, "cat /tmp/f3").await.1, "three\n");
    let process = s
        .api
        .ok("GET", &format!("/v1/sandboxes/{a}/processes/{counter}"), None, 200)
        .await;
    assert_eq!(process["state"], "running", "{process}");
    // Deleted sandboxes stay deleted, and leave nothing behind.
    for id in [&a, &b] {
        s.api.ok("DELETE", &format!("/v1/sandboxes/{id}"), None, 200).await;
    }
    stop(&mut s.proc);
    let s = start(&config, &out, &run_dir);
    let list = s.api.ok("GET", "/v1/sandboxes", None, 200).await;
    assert_eq!(list["sandboxes"], json!([]));
    let left: Vec<_> = std::fs::read_dir(out.join("sandboxes/saved"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
    drop(s);
    assert_no_qemu_of(&run_dir);
}
