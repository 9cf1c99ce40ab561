//! The fault suite, against real guests (the minimal image): faults are injected while
//! sandboxes work (a QEMU killed, a disk past its limit, a guest out of memory, a VM frozen
//! so its agent hangs, `farm serve` killed with `kill -9` and started again), and then every
//! sandbox must be in a defined state with an event that says why: none gone silently, none
//! stuck, no QEMU orphaned, no paused sandbox lost. It prints the figures it checked.
//!
//! Not injected here: a host clock step (it would step the clock of every test running
//! beside this one) and a full host disk (the host's, shared likewise).

mod common;
use common::serve::{farm_serve, sandboxes_config, Api, Proc};
use common::{assert_no_qemu_of, new_qemu, qemu_pids, signal};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn start(config: &Path, out: &Path, run_dir: &Path) -> (Proc, Api) {
    let (proc, url) = farm_serve(config, out, run_dir, "127.0.0.1:0", None);
    (proc, Api::new(&url, None))
}

async fn new_sandbox(api: &Api, env: &str, extra: Value) -> String {
    let mut body = json!({ "environment": env, "idle_timeout_secs": 600 });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    api.ok("POST", "/v1/sandboxes", Some(body), 201).await["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A sandbox's events, oldest first.
async fn events_of(api: &Api, id: &str) -> Vec<Value> {
    let list = api
        .ok("GET", &format!("/v1/events?sandbox={id}&limit=1000"), None, 200)
        .await;
    list["events"].as_array().unwrap().clone()
}

/// Waits up to two minutes for a sandbox's newest event to be of type `kind`.
async fn wait_for_last(api: &Api, id: &str, kind: &str) -> Value {
    let started = Instant::now();
    loop {
        if let Some(last) = events_of(api, id).await.pop().filter(|e| e["type"] == kind) {
            return last;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{id}: no {kind}: {:?}",
            events_of(api, id).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_leave_every_sandbox_in_a_defined_state_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (out, run_dir) = (dir.path().join("out"), dir.path().join("run"));
    let config = sandboxes_config(dir.path(), "faults.toml", "");
    let (mut service, api) = start(&config, &out, &run_dir);
    let env = api.environment("minimal").await;
    let mut faults = 0;

    // Three that work throughout: each appends to a log, in the background.
    let mut working = Vec::new();
    for _ in 0..3 {
        let id = new_sandbox(&api, &env, json!({})).await;
        api.start_process(
            &id,
            "i=0; while true; do echo $i >> /var/tmp/log; i=$((i+1)); sleep 0.2; done",
        )
        .await;
        working.push(id);
    }
    // One paused before everything, with a file: it must come through as it was.
    let paused = new_sandbox(&api, &env, json!({})).await;
    api.run_sh(&paused, "echo kept > /var/tmp/kept").await;
    api.ok("POST", &format!("/v1/sandboxes/{paused}/pause"), None, 200)
        .await;

    // A QEMU killed from outside.
    let before = qemu_pids(&run_dir);
    let killed = new_sandbox(&api, &env, json!({})).await;
    signal(new_qemu(&run_dir, &before), "-KILL");
    faults += 1;
    let told = wait_for_last(&api, &killed, "died").await;
    assert_eq!(told["cause"], "qemu_killed", "{told}");

    // A disk past its limit.
    let full = new_sandbox(&api, &env, json!({ "disk_mib": 8 })).await;
    let (status, _) = api
        .call(
            "POST",
            &format!("/v1/sandboxes/{full}/exec"),
            Some(json!({ "command": "dd if=/dev/urandom of=/big bs=1M count=64; sync; sleep 5" })),
        )
        .await;
    faults += 1;
    let told = wait_for_last(&api, &full, "died").await;
    assert_eq!(told["cause"], "disk_limit", "{status}: {told}");

    // A guest out of memory: its kernel kills the process, and the sandbox goes on.
    let hungry = new_sandbox(&api, &env, json!({})).await;
    let (code, _) = api
        .run_sh(&hungry, "awk 'BEGIN { s = \"x\"; while (1) s = s s }'; echo $?")
        .await;
    faults += 1;
    assert_eq!(code, 0, "the shell goes on after its awk is killed");
    assert_eq!(api.run_sh(&hungry, "echo alive").await.1, "alive\n", "it goes on");

    // A VM frozen (its agent hangs): a call on it fails in time, and delete still works.
    let before = qemu_pids(&run_dir);
    let frozen = new_sandbox(&api, &env, json!({})).await;
    let frozen_qemu = new_qemu(&run_dir, &before);
    signal(frozen_qemu, "-STOP");
    faults += 1;
    let (status, _) = api
        .call(
            "POST",
            &format!("/v1/sandboxes/{frozen}/exec"),
            Some(json!({ "command": "true", "timeout_secs": 5 })),
        )
        .await;
    assert!(status >= 400, "a frozen guest does not answer: {status}");
    // Its missed pings may have ended it already (died: agent_lost); else delete ends it.
    let (status, _) = api.call("DELETE", &format!("/v1/sandboxes/{frozen}"), None).await;
    let last = events_of(&api, &frozen).await.pop().unwrap();
    match status {
        200 => assert_eq!(
            (last["type"].as_str(), last["cause"].as_str()),
            (Some("ended"), Some("deleted"))
        ),
        _ => assert_eq!(
            (last["type"].as_str(), last["cause"].as_str()),
            (Some("died"), Some("agent_lost")),
            "{status}"
        ),
    }

    // A workspace's holder acknowledged a write (a sync), then wrote more it never synced.
    api.ok(
        "POST",
        "/v1/workspaces",
        Some(json!({ "name": "ws", "size_mib": 8 })),
        201,
    )
    .await;
    let holder = new_sandbox(&api, &env, json!({ "workspaces": [{ "name": "ws", "path": "/w" }] })).await;
    api.run_sh(
        &holder,
        "head -c 100000 /dev/urandom > /w/acked; sha256sum /w/acked > /w/sum",
    )
    .await;
    let acked = api.run_sh(&holder, "cat /w/sum").await.1;
    api.ok("POST", &format!("/v1/sandboxes/{holder}/workspaces/sync"), None, 200)
        .await;
    api.run_sh(&holder, "echo never-synced > /w/later").await;

    // The service killed with kill -9, and started again.
    service.child.kill().unwrap();
    service.child.wait().unwrap();
    faults += 1;
    assert_no_qemu_of(&run_dir);
    let (service, api) = start(&config, &out, &run_dir);

    // Every sandbox is in a defined state, with the event that says why.
    let states: BTreeMap<String, String> = api.ok("GET", "/v1/sandboxes", None, 200).await["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["id"].as_str().unwrap().into(), s["state"].as_str().unwrap().into()))
        .collect();
    let (mut silent, mut stuck) = (0, 0);
    for id in working
        .iter()
        .chain([&paused, &killed, &full, &hungry, &frozen, &holder])
    {
        let last = events_of(&api, id).await.pop().unwrap();
        let kind = last["type"].as_str().unwrap();
        match states.get(id.as_str()).map(String::as_str) {
            // Still here: taken up, paused, and told so.
            Some("paused") if kind == "restored" => {}
            Some(state) => {
                eprintln!("{id}: {state}, and its last event is {last}");
                stuck += 1;
            }
            // Gone: told why.
            None if kind == "died" || kind == "ended" => {}
            None => {
                eprintln!("{id}: gone, and its last event is {last}");
                silent += 1;
            }
        }
    }
    // No acknowledged workspace byte is lost: a reader finds them, and so does the holder.
    let reader = new_sandbox(
        &api,
        &env,
        json!({ "workspaces": [{ "name": "ws", "path": "/w", "read_only": true }] }),
    )
    .await;
    let mut bytes_lost = 0;
    if api.run_sh(&reader, "sha256sum /w/acked").await.1 != acked {
        bytes_lost += 100_000;
    }
    api.ok("POST", &format!("/v1/sandboxes/{holder}/resume"), None, 200)
        .await;
    assert_eq!(
        api.run_sh(&holder, "sha256sum /w/acked").await.1,
        acked,
        "the holder finds what it acknowledged"
    );
    api.ok("POST", &format!("/v1/sandboxes/{holder}/workspaces/sync"), None, 200)
        .await;
    for id in [&reader, &holder] {
        api.ok("DELETE", &format!("/v1/sandboxes/{id}"), None, 200).await;
    }

    // The paused one is exactly as it was; the working ones run again.
    api.ok("POST", &format!("/v1/sandboxes/{paused}/resume"), None, 200)
        .await;
    let paused_lost = usize::from(api.run_sh(&paused, "cat /var/tmp/kept").await.1 != "kept\n");
    for id in working.iter().chain([&hungry]) {
        api.ok("POST", &format!("/v1/sandboxes/{id}/resume"), None, 200).await;
        assert_eq!(api.run_sh(id, "echo up").await.1, "up\n");
        api.ok("DELETE", &format!("/v1/sandboxes/{id}"), None, 200).await;
    }
    drop(service);
    // Fails unless every QEMU is gone within a minute of its service.
    assert_no_qemu_of(&run_dir);
    eprintln!(
        "fault suite: {faults} faults injected; {silent} silent losses, {stuck} stuck states, 0 orphaned QEMUs, {paused_lost} paused sandboxes lost, {bytes_lost} acknowledged workspace bytes lost"
    );
    assert_eq!((silent, stuck, paused_lost, bytes_lost), (0, 0, 0, 0));
}
