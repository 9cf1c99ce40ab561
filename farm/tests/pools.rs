//! Environments' pools against real guests (the minimal image): a sandbox's VM, given back
//! when it is deleted, is reset in place for the next sandbox, even another tenant's. The
//! next user gets the environment's snapshot exactly: nothing the first one planted on disk,
//! in memory or in a process survives, its disk and CPU figures are its own, and a request
//! of the first user's that was still running never sees the second one's guest.

mod common;
use common::serve::{farm_serve, farm_tenant, new_key, sandboxes_config, stop, Api};
use common::{assert_no_qemu_of, qemu_pids};
use std::time::Duration;

use serde_json::json;

/// The same QEMU process, reset: what A left is gone for B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_reset_for_another_tenant_keeps_nothing_of_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let (out, run_dir) = (dir.path().join("out"), dir.path().join("run"));
    let db = out.join("tenants.db");
    farm_tenant(&db, &["add", "a"]);
    farm_tenant(&db, &["add", "b"]);
    let (a_key, _) = new_key(&db, "a", &[]);
    let (b_key, _) = new_key(&db, "b", &[]);
    // No warm forks: the pool keeps only VMs given back, so B's sandbox is A's VM.
    let config = sandboxes_config(dir.path(), "pools.toml", "warm_pool = 0\n");
    let (mut service, url) = farm_serve(&config, &out, &run_dir, "127.0.0.1:0", Some("operator"));
    let (a, b) = (Api::new(&url, Some(&a_key)), Api::new(&url, Some(&b_key)));
    let operator = Api::new(&url, Some("operator"));

    let env = a.environment("minimal").await;
    let sa = a.new_sandbox(json!({ "environment": env })).await;
    let a_qemu = qemu_pids(&run_dir);
    assert_eq!(a_qemu.len(), 1, "A's sandbox is the only VM: {a_qemu:?}");
    let a_host = a.stdout(&sa, "hostname").await;
    a.stdout(
        &sa,
        "echo a-secret > /root/planted; echo a-secret > /dev/shm/in-memory; \
         dd if=/dev/urandom of=/root/big bs=1M count=40 2>/dev/null; sync; \
         sh -c 'while true; do echo a-secret > /tmp/still-running; sleep 1; done' a-loop >/dev/null 2>&1 &",
    )
    .await;
    let a_metrics = a.ok("GET", &format!("/v1/sandboxes/{sa}/metrics"), None, 200).await;
    assert!(
        a_metrics["now"]["disk_bytes"].as_u64().unwrap() > 30 << 20,
        "{a_metrics}"
    );

    // A request of A's still runs when A deletes its sandbox; it asks for what B writes.
    let in_flight = {
        let a = Api::new(&url, Some(&a_key));
        let sa = sa.clone();
        tokio::spawn(async move {
            a.call(
                "POST",
                &format!("/v1/sandboxes/{sa}/exec"),
                Some(json!({ "command": "sleep 4; cat /tmp/b-secret" })),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    a.ok("DELETE", &format!("/v1/sandboxes/{sa}"), None, 200).await;

    // B asks for the same content: the same environment, and A's VM, reset.
    let env_b = b.environment("minimal").await;
    assert_eq!(env_b, env);
    let sb = b.new_sandbox(json!({ "environment": env })).await;
    assert_eq!(
        qemu_pids(&run_dir),
        a_qemu,
        "B's sandbox runs in A's QEMU process, reset"
    );
    b.stdout(&sb, "echo b-secret > /tmp/b-secret").await;
    let (status, answer) = in_flight.await.unwrap();
    assert!(
        !answer.to_string().contains("b-secret"),
        "A's request saw B's guest: {status} {answer}"
    );
    assert!(status == 404 || status == 409 || status == 410, "{status} {answer}");

    let seen = b
        .stdout(
            &sb,
            "cat /root/planted /dev/shm/in-memory /tmp/still-running 2>&1; \
             sleep 2; ls /tmp; ps -o args | grep -c 'a[-]loop'; true",
        )
        .await;
    assert!(!seen.contains("a-secret"), "A's state reached B: {seen}");
    assert_eq!(b.stdout(&sb, "ls -A /root").await.trim(), "", "A's files in /root");
    assert_eq!(b.stdout(&sb, "ls -A /tmp").await.trim(), "b-secret");
    assert_eq!(
        seen.lines().last(),
        Some("0"),
        "A's process runs in B's sandbox: {seen}"
    );
    assert_ne!(b.stdout(&sb, "hostname").await, a_host);
    // B's disk and CPU are B's: A's 40 MiB went back to the host with the reset.
    let b_metrics = b.ok("GET", &format!("/v1/sandboxes/{sb}/metrics"), None, 200).await;
    assert!(
        b_metrics["now"]["disk_bytes"].as_u64().unwrap() < 16 << 20,
        "{b_metrics}"
    );
    assert!(
        b_metrics["now"]["cpu_seconds"].as_f64().unwrap() < a_metrics["now"]["cpu_seconds"].as_f64().unwrap(),
        "B is charged A's CPU: {b_metrics} vs {a_metrics}"
    );

    // A's old id reaches nothing, for A or for B; the pool's figures are the operator's.
    for who in [&a, &b] {
        let (status, v) = who
            .call(
                "POST",
                &format!("/v1/sandboxes/{sa}/exec"),
                Some(json!({ "command": "cat /tmp/b-secret" })),
            )
            .await;
        assert!(status == 404 || status == 410, "{status} {v}");
        assert!(!v.to_string().contains("b-secret"), "{v}");
    }
    let seen_by_b = b.ok("GET", &format!("/v1/environments/{env}"), None, 200).await;
    assert!(
        seen_by_b["pool"].is_null(),
        "a tenant sees the shared pool: {seen_by_b}"
    );
    assert_eq!(operator.environment("minimal").await, env);
    let pool = operator.ok("GET", &format!("/v1/environments/{env}"), None, 200).await["pool"].clone();
    assert_eq!(
        (pool["reset"].as_u64(), pool["reset_failed"].as_u64()),
        (Some(1), Some(0)),
        "{pool}"
    );
    println!("A's VM reset for B: {pool}");

    stop(&mut service);
    assert_no_qemu_of(&run_dir);
}
