//! Lifecycle events, resumes that check, timeouts that pause, and per-sandbox usage, against
//! real guests (the minimal image) and two tenants: every change of A's sandboxes is an event
//! A lists, follows as a stream (resumed from an id) and receives at a webhook, signed and
//! retried; a VM killed from outside is a `died` event with its cause; a resume that lacks
//! what was to be kept stays paused in `resume_failed`; B sees, follows and removes none of
//! A's.

mod common;
use common::serve::{farm_serve, farm_tenant, sandboxes_config, sse_event, Api};
use common::{assert_no_qemu_of, new_qemu, qemu_pids, signal};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One POST a webhook receiver got: its headers (lowercase names) and body.
type Delivery = (BTreeMap<String, String>, String);

/// A webhook receiver on loopback: it answers its first request 500 (to be retried) and every
/// later one 204.
async fn receiver() -> (u16, Arc<Mutex<Vec<Delivery>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let got: Arc<Mutex<Vec<Delivery>>> = Arc::default();
    let kept = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut bytes = Vec::new();
                let mut buf = [0u8; 8192];
                let (head, body) = loop {
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    bytes.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&bytes).into_owned();
                    let Some((head, body)) = text.split_once("\r\n\r\n") else {
                        continue;
                    };
                    let length: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().to_string())
                        })
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    if body.len() >= length {
                        break (head.to_string(), body.to_string());
                    }
                };
                let headers = head
                    .lines()
                    .skip(1)
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
                    .collect();
                let first = {
                    let mut got = kept.lock().unwrap();
                    got.push((headers, body));
                    got.len() == 1
                };
                let status = if first {
                    "500 Internal Server Error"
                } else {
                    "204 No Content"
                };
                let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    (port, got)
}

/// The caller's events after `after`, of one fork when given.
async fn events(api: &Api, after: u64, sandbox: Option<&str>) -> Vec<Value> {
    let filter = sandbox.map(|s| format!("&sandbox={s}")).unwrap_or_default();
    let list = api
        .ok(
            "GET",
            &format!("/v1/events?after={after}&limit=1000{filter}"),
            None,
            200,
        )
        .await;
    list["events"].as_array().unwrap().clone()
}

/// Waits (up to two minutes) for an event of `sandbox` of type `kind` after `after`.
async fn wait_for(api: &Api, sandbox: &str, kind: &str, after: u64) -> Value {
    let started = Instant::now();
    loop {
        let found = events(api, after, Some(sandbox))
            .await
            .into_iter()
            .find(|e| e["type"] == kind);
        if let Some(event) = found {
            return event;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no {kind} event of {sandbox}: {:?}",
            events(api, 0, Some(sandbox)).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Event `kind`s of a fork, in order.
async fn kinds(api: &Api, sandbox: &str) -> Vec<String> {
    events(api, 0, Some(sandbox))
        .await
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect()
}

/// An open event stream: the events' (id, data) as they come.
struct Stream(reqwest::Response, String);

impl Stream {
    async fn open(api: &Api, query: &str, last_event_id: Option<u64>) -> Result<Stream, u16> {
        let mut request = api
            .http
            .get(format!("{}/v1/events/stream{query}", api.url))
            .bearer_auth(api.token.as_ref().unwrap());
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id.to_string());
        }
        let response = request.send().await.unwrap();
        match response.status().as_u16() {
            200 => Ok(Stream(response, String::new())),
            other => Err(other),
        }
    }

    async fn next(&mut self) -> Value {
        loop {
            if let Some(end) = self.1.find("\n\n") {
                let block: String = self.1.drain(..end + 2).collect();
                if let Some((name, data)) = sse_event(&block) {
                    assert_eq!(name, "event");
                    let id = block.lines().find_map(|l| l.strip_prefix("id:")).unwrap().trim();
                    let event: Value = serde_json::from_str(&data).unwrap();
                    assert_eq!(event["id"].to_string(), id, "the SSE id is the event's");
                    return event;
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(120), self.0.chunk())
                .await
                .expect("no event in two minutes")
                .unwrap()
                .expect("the stream ended");
            self.1.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_of_a_sandbox_is_told_and_no_sandbox_goes_silently() {
    let dir = tempfile::tempdir().unwrap();
    let (out, run_dir) = (dir.path().join("out"), dir.path().join("run"));
    let db = out.join("tenants.db");
    farm_tenant(&db, &["add", "a"]);
    farm_tenant(&db, &["add", "b"]);
    let a_key = farm_tenant(&db, &["key", "add", "a"]).trim().to_string();
    let b_key = farm_tenant(&db, &["key", "add", "b"]).trim().to_string();
    let (hook_port, deliveries) = receiver().await;
    let rest = format!(
        "paused_retention_secs = 600\n[serve.events]\nwarn_before_secs = 60\nwebhook_hosts = [\"127.0.0.1:{hook_port}\"]\n"
    );
    let config = sandboxes_config(dir.path(), "events.toml", &rest);
    let (service, url) = farm_serve(&config, &out, &run_dir, "127.0.0.1:0", Some("service-token"));
    let (a, b) = (Api::new(&url, Some(&a_key)), Api::new(&url, Some(&b_key)));

    // Webhooks: A's, to the allowed host; B's elsewhere is refused, and B cannot touch A's.
    let hook = a
        .ok(
            "POST",
            "/v1/webhooks",
            Some(json!({ "url": format!("http://127.0.0.1:{hook_port}/farm") })),
            201,
        )
        .await;
    let secret: Vec<u8> = (0..hook["secret"].as_str().unwrap().len() / 2)
        .map(|i| u8::from_str_radix(&hook["secret"].as_str().unwrap()[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let hook_id = hook["id"].as_str().unwrap().to_string();
    for url in [
        "http://127.0.0.1:1/x",
        "http://169.254.169.254/latest",
        "file:///etc/passwd",
    ] {
        let (status, answer) = b.call("POST", "/v1/webhooks", Some(json!({ "url": url }))).await;
        assert_eq!(
            (status, answer["field"].as_str()),
            (400, Some("url")),
            "{url}: {answer}"
        );
    }
    assert_eq!(b.call("DELETE", &format!("/v1/webhooks/{hook_id}"), None).await.0, 404);
    assert_eq!(b.ok("GET", "/v1/webhooks", None, 200).await["webhooks"], json!([]));
    let a_hooks = a.ok("GET", "/v1/webhooks", None, 200).await;
    assert!(
        a_hooks["webhooks"][0].get("secret").is_none(),
        "a secret is shown once: {a_hooks}"
    );

    let env = a.environment("minimal").await;
    let mut stream = Stream::open(&a, "?after=0", None).await.unwrap();

    // A sandbox's life: made, reset, branched, paused, resumed with checks.
    let s = a
        .ok(
            "POST",
            "/v1/sandboxes",
            Some(json!({ "environment": env, "idle_timeout_secs": 600 })),
            201,
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    a.ok("POST", &format!("/v1/sandboxes/{s}/reset"), None, 200).await;
    a.run_sh(&s, "printf hello > /tmp/keep").await;
    let pid = a.start_process(&s, "sleep 100000").await["pid"].as_u64().unwrap();
    let metrics = a.ok("GET", &format!("/v1/sandboxes/{s}/metrics"), None, 200).await;
    assert_eq!(metrics["state"], "running", "{metrics}");
    assert!(metrics["now"]["cpu_seconds"].as_f64().unwrap() > 0.0, "{metrics}");
    assert!(metrics["now"]["memory_bytes"].as_u64().unwrap() > 1 << 20, "{metrics}");
    let before_branch = qemu_pids(&run_dir);
    let c = a.ok("POST", &format!("/v1/sandboxes/{s}/branch"), None, 201).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let c_qemu = new_qemu(&run_dir, &before_branch);
    a.ok("POST", &format!("/v1/sandboxes/{s}/pause"), None, 200).await;
    let keep = json!({ "keep": { "files": [{ "path": "/tmp/keep", "size": 5 }], "processes": [pid] } });
    let resumed = a
        .ok("POST", &format!("/v1/sandboxes/{s}/resume"), Some(keep), 200)
        .await;
    assert_eq!(resumed["state"], "running");

    // A resume that lacks what it was to keep stays paused, says why, and can be retried.
    a.ok("POST", &format!("/v1/sandboxes/{s}/pause"), None, 200).await;
    let keep =
        json!({ "keep": { "files": [{ "path": "/tmp/keep", "size": 6 }, { "path": "/tmp/never" }], "ports": [8123] } });
    let (status, refused) = a.call("POST", &format!("/v1/sandboxes/{s}/resume"), Some(keep)).await;
    assert_eq!(status, 409, "{refused}");
    let why = refused["error"].as_str().unwrap();
    for missing in ["/tmp/keep has 5 bytes, not 6", "/tmp/never", "port 8123"] {
        assert!(why.contains(missing), "{missing}: {why}");
    }
    let view = a.ok("GET", &format!("/v1/sandboxes/{s}"), None, 200).await;
    assert_eq!(view["state"], "resume_failed", "{view}");
    assert_eq!(
        a.call(
            "POST",
            &format!("/v1/sandboxes/{s}/exec"),
            Some(json!({ "command": "true" }))
        )
        .await
        .0,
        409
    );
    a.ok("POST", &format!("/v1/sandboxes/{s}/resume"), None, 200).await;
    assert_eq!(a.run_sh(&s, "cat /tmp/keep").await.1, "hello", "nothing was lost");

    // A timer about to end it is warned of, with when.
    a.ok(
        "POST",
        &format!("/v1/sandboxes/{s}/timeout"),
        Some(json!({ "expires_in_secs": 50 })),
        200,
    )
    .await;
    let warning = wait_for(&a, &s, "timeout_warning", 0).await;
    assert_eq!(
        (warning["cause"].as_str(), warning["state"].as_str()),
        (Some("lifetime"), Some("running"))
    );
    assert!(warning["ends_at_ms"].as_u64().unwrap() > warning["at_ms"].as_u64().unwrap());
    a.ok("DELETE", &format!("/v1/sandboxes/{s}"), None, 200).await;

    // A sandbox whose timeout pauses it: paused at its idle timeout, resumed by a call.
    let t = a
        .ok(
            "POST",
            "/v1/sandboxes",
            Some(json!({ "environment": env, "idle_timeout_secs": 8, "on_timeout": "pause" })),
            201,
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    a.run_sh(&t, "echo kept > /tmp/t").await;
    let paused = wait_for(&a, &t, "paused", 0).await;
    assert_eq!(paused["cause"], "idle_timeout", "{paused}");
    assert_eq!(
        a.ok("GET", &format!("/v1/sandboxes/{t}"), None, 200).await["state"],
        "paused"
    );
    assert_eq!(
        a.run_sh(&t, "cat /tmp/t").await.1,
        "kept\n",
        "a call resumes it as it was"
    );
    let told: Vec<String> = kinds(&a, &t)
        .await
        .into_iter()
        .filter(|k| k != "timeout_warning")
        .collect();
    assert_eq!(told[..3], ["created", "paused", "resumed"]);
    let warning = wait_for(&a, &t, "timeout_warning", 0).await;
    assert_eq!(warning["reason"], "unless it is used, its idle timeout pauses it");

    // A VM killed from outside: its sandbox died, and says how.
    signal(c_qemu, "-KILL");
    let died = wait_for(&a, &c, "died", 0).await;
    assert_eq!(
        (died["cause"].as_str(), died["state"].as_str()),
        (Some("qemu_killed"), Some("ended")),
        "{died}"
    );
    let (status, gone) = a.call("GET", &format!("/v1/sandboxes/{c}/metrics"), None).await;
    assert_eq!(status, 410, "{gone}");

    a.ok("DELETE", &format!("/v1/sandboxes/{t}"), None, 200).await;
    assert_eq!(
        kinds(&a, &s).await,
        [
            "created",
            "reset",
            "branched",
            "paused",
            "resumed",
            "paused",
            "resume_failed",
            "resumed",
            "timeout_warning",
            "ended"
        ]
    );
    let branch = events(&a, 0, Some(&c)).await;
    assert_eq!(
        (branch[0]["type"].as_str(), branch[0]["related"].as_str()),
        (Some("created"), Some(s.as_str()))
    );
    // No sandbox went without an `ended` or `died` event.
    for id in [&s, &c, &t] {
        let last = events(&a, 0, Some(id)).await.pop().unwrap();
        assert!(
            ["ended", "died"].contains(&last["type"].as_str().unwrap()),
            "{id}: {last}"
        );
    }

    // The stream saw the same events, in order; a stream resumed from an id goes on after it.
    let all = events(&a, 0, None).await;
    for want in &all {
        assert_eq!(&stream.next().await, want);
    }
    let third = all[2]["id"].as_u64().unwrap();
    let mut resumed = Stream::open(&a, "", Some(third)).await.unwrap();
    assert_eq!(resumed.next().await, all[3]);

    // The webhook got every event, signed, the first one again after its 500.
    let started = Instant::now();
    let last_id = all.last().unwrap()["id"].as_u64().unwrap();
    loop {
        let hooks = a.ok("GET", "/v1/webhooks", None, 200).await;
        if hooks["webhooks"][0]["delivered"].as_u64() == Some(last_id) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "{hooks}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let got = deliveries.lock().unwrap().clone();
    let mut ids: Vec<u64> = Vec::new();
    for (headers, body) in &got {
        let mut mac = Hmac::<Sha256>::new_from_slice(&secret).unwrap();
        mac.update(format!("{}.{body}", headers["farm-timestamp"]).as_bytes());
        let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(headers["farm-signature"], format!("sha256={hex}"), "{body}");
        let event: Value = serde_json::from_str(body).unwrap();
        assert_eq!(headers["farm-event-id"], event["id"].to_string());
        assert_eq!(event["tenant"], "a", "a webhook is sent its own tenant's events alone");
        ids.push(event["id"].as_u64().unwrap());
    }
    assert_eq!(ids[0], ids[1], "the first delivery, answered 500, came again");
    let mut unique = ids.clone();
    unique.dedup();
    assert_eq!(
        unique,
        all.iter().map(|e| e["id"].as_u64().unwrap()).collect::<Vec<_>>()
    );

    // B: none of A's events, by list, by name or by stream.
    assert!(events(&b, 0, None).await.is_empty());
    for id in [&s, &c] {
        let (status, theirs) = b.call("GET", &format!("/v1/events?sandbox={id}"), None).await;
        let (never_status, never) = b.call("GET", "/v1/events?sandbox=sb-never", None).await;
        assert_eq!((status, never_status), (404, 404));
        assert_eq!(
            theirs.to_string().replace(id.as_str(), "X"),
            never.to_string().replace("sb-never", "X")
        );
        assert_eq!(Stream::open(&b, &format!("?sandbox={id}"), None).await.err(), Some(404));
        assert_eq!(b.call("GET", &format!("/v1/sandboxes/{id}/metrics"), None).await.0, 404);
    }
    let mut b_stream = Stream::open(&b, "?after=0", None).await.unwrap();
    let mine = b
        .ok(
            "POST",
            "/v1/sandboxes",
            Some(json!({ "environment": b.environment("minimal").await })),
            201,
        )
        .await;
    assert_eq!(
        b_stream.next().await["sandbox"],
        mine["id"],
        "B's stream starts at B's own first event"
    );
    drop(service);
    assert_no_qemu_of(&run_dir);
}
