//! Environments' pools against real guests (the minimal image): a sandbox's VM, given back
//! when it is deleted, is reset in place for its tenant's next sandbox, never another
//! tenant's (a QEMU process a guest might have subverted serves no one else). The next
//! sandbox gets the environment's snapshot exactly: nothing the last one planted on disk, in
//! memory or in a process survives, its disk and CPU figures are its own, and a request of the
//! last sandbox's that was still running never sees the next one's guest.

mod common;
use common::serve::{farm_serve, farm_tenant, new_key, sandboxes_config, stop, Api};
use common::{assert_no_qemu_of, qemu_pids};
use std::time::Duration;

use serde_json::json;

/// A's QEMU process, reset, serves A's next sandbox with nothing of the last; B gets its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_is_reset_for_its_tenant_alone_and_keeps_nothing_of_the_last_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let (out, run_dir) = (dir.path().join("out"), dir.path().join("run"));
    let db = out.join("tenants.db");
    farm_tenant(&db, &["add", "a"]);
    farm_tenant(&db, &["add", "b"]);
    let (a_key, _) = new_key(&db, "a", &[]);
    let (b_key, _) = new_key(&db, "b", &[]);
    // No warm forks: the pool keeps only VMs given back, and starts no process of its own.
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

    // A request of the sandbox still runs when A deletes it; it asks for what A's next
    // sandbox writes.
    let in_flight = {
        let a = Api::new(&url, Some(&a_key));
        let sa = sa.clone();
        tokio::spawn(async move {
            a.call(
                "POST",
                &format!("/v1/sandboxes/{sa}/exec"),
                Some(json!({ "command": "sleep 4; cat /tmp/next-secret" })),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    a.ok("DELETE", &format!("/v1/sandboxes/{sa}"), None, 200).await;

    // B asks for the same content: the same environment, but a QEMU process of its own (A's
    // is kept, reset, for A).
    assert_eq!(b.environment("minimal").await, env);
    let sb = b.new_sandbox(json!({ "environment": env })).await;
    let after_b = qemu_pids(&run_dir);
    assert_eq!(after_b.len(), 2, "B's sandbox and A's kept VM: {after_b:?}");
    assert!(after_b.contains(&a_qemu[0]), "A's VM is kept, and not B's: {after_b:?}");
    // A's next sandbox is A's VM, reset.
    let sa2 = a.new_sandbox(json!({ "environment": env })).await;
    assert_eq!(
        qemu_pids(&run_dir),
        after_b,
        "A's next sandbox runs in A's QEMU process"
    );
    // Each says how its VM came to be: A's next a reset, B's a new process.
    let start = |v: serde_json::Value| v["start"].as_str().map(str::to_string);
    let a_view = a.ok("GET", &format!("/v1/sandboxes/{sa2}"), None, 200).await;
    assert_eq!(start(a_view.clone()).as_deref(), Some("reset"), "{a_view}");
    let b_view = b.ok("GET", &format!("/v1/sandboxes/{sb}"), None, 200).await;
    assert_eq!(start(b_view.clone()).as_deref(), Some("fork"), "{b_view}");
    a.stdout(&sa2, "echo next-secret > /tmp/next-secret").await;
    let (status, answer) = in_flight.await.unwrap();
    assert!(
        !answer.to_string().contains("next-secret"),
        "a request of the deleted sandbox saw the next one's guest: {status} {answer}"
    );
    assert!(status == 404 || status == 409 || status == 410, "{status} {answer}");

    let seen = a
        .stdout(
            &sa2,
            "cat /root/planted /dev/shm/in-memory /tmp/still-running 2>&1; \
             sleep 2; ls /tmp; ps -o args | grep -c 'a[-]loop'; true",
        )
        .await;
    assert!(
        !seen.contains("a-secret"),
        "the last sandbox's state reached the next: {seen}"
    );
    assert_eq!(
        seen.lines().last(),
        Some("0"),
        "the last sandbox's process runs on: {seen}"
    );
    assert_eq!(
        a.stdout(&sa2, "ls -A /root").await.trim(),
        "",
        "the last sandbox's files"
    );
    assert_eq!(a.stdout(&sa2, "ls -A /tmp").await.trim(), "next-secret");
    assert_ne!(a.stdout(&sa2, "hostname").await, a_host);
    // Its disk and CPU figures are its own: the last one's 40 MiB went back with the reset.
    let next = a.ok("GET", &format!("/v1/sandboxes/{sa2}/metrics"), None, 200).await;
    assert!(next["now"]["disk_bytes"].as_u64().unwrap() < 16 << 20, "{next}");
    assert!(
        next["now"]["cpu_seconds"].as_f64().unwrap() < a_metrics["now"]["cpu_seconds"].as_f64().unwrap(),
        "the next sandbox is charged the last one's CPU: {next} vs {a_metrics}"
    );
    let b_sees = b
        .stdout(&sb, "cat /tmp/next-secret /root/planted 2>/dev/null | wc -c")
        .await;
    assert_eq!(b_sees.trim(), "0", "B's sandbox holds A's files");

    // The deleted sandbox's id reaches nothing, for A or for B; the pool's figures are the
    // operator's.
    for who in [&a, &b] {
        let (status, v) = who
            .call(
                "POST",
                &format!("/v1/sandboxes/{sa}/exec"),
                Some(json!({ "command": "cat /tmp/next-secret" })),
            )
            .await;
        assert!(status == 404 || status == 410, "{status} {v}");
        assert!(!v.to_string().contains("next-secret"), "{v}");
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
    println!("A's VM reset for A's next sandbox: {pool}");

    stop(&mut service);
    assert_no_qemu_of(&run_dir);
}
