//! `farm serve` against real guests: every endpoint, bad requests, the bearer token,
//! backpressure, cancel by policy version, branches whose states differ, SIGTERM and a
//! restart after SIGKILL, and the Python client example against a stand-in model.
//!
//! All three tests serve `configs/serve.toml` (the minimal image): they share its template
//! snapshot.

mod common;
use common::serve::{fake_model, farm_serve, farm_serve_with, repo, serve_suite, start, stop, suite_config, Api, Proc};
use common::{assert_no_qemu_of, temp_dirs};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn ids_of(submitted: &Value) -> Vec<String> {
    submitted["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| {
            g["rollout_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_str().unwrap().to_string())
        })
        .collect()
}

fn sleeper(n: u32, version: u64) -> Value {
    json!({ "task_id": "double", "n": n, "policy_version": version, "policy": { "kind": "replay", "actions": [ { "kind": "exec", "command": "sleep 300" } ] } })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollouts_results_sessions_and_the_python_client() {
    let (_model, model_url) = fake_model();
    let [out, run_dir] = temp_dirs();
    let (mut serve, url) = serve_suite(out.path(), run_dir.path(), None);
    let api = Api::new(&url, None);

    let capacity = api.ok("GET", "/v1/capacity", None, 200).await;
    for key in ["slots", "in_flight", "queued", "warm"] {
        assert!(capacity[key].is_u64(), "{capacity}");
    }

    // Submit: an openai group and a replay group; a retry with the same key is the same
    // submission.
    let body = json!({ "items": [
        { "task_id": "double", "n": 2, "seed": 11, "policy_version": 1, "metadata": { "step": 5 },
          "policy": { "kind": "openai", "base_url": model_url, "model": "fake", "logprobs": true } },
        { "task_id": "answer", "policy": { "kind": "replay", "actions": [ { "kind": "submit", "answer": "41" } ] } },
    ] });
    let (status, first) = api.post_keyed("/v1/rollouts", body.clone(), "batch-1").await;
    assert_eq!(status, 202, "{}", String::from_utf8_lossy(&first));
    let submitted: Value = serde_json::from_slice(&first).unwrap();
    let (status, again) = api.post_keyed("/v1/rollouts", body.clone(), "batch-1").await;
    assert_eq!(
        (status, serde_json::from_slice::<Value>(&again).unwrap()),
        (202, submitted.clone()),
        "a retried submit is the same submission"
    );
    let (status, other) = api
        .post_keyed("/v1/rollouts", json!({ "items": [ sleeper(1, 1) ] }), "batch-1")
        .await;
    assert_eq!(
        status,
        422,
        "a key reused for another body: {}",
        String::from_utf8_lossy(&other)
    );
    let ids = ids_of(&submitted);
    assert_eq!(ids.len(), 3);

    let rows = api.rows_for(&ids, 0).await;
    assert_eq!(rows.len(), 3, "one row per rollout, none twice: {rows:?}");
    let group = submitted["groups"][0]["group_id"].as_str().unwrap();
    for row in rows.iter().filter(|r| r["task_id"] == "double") {
        assert_eq!(
            (row["status"].as_str(), row["reward"].as_f64()),
            (Some("passed"), Some(1.0)),
            "{row}"
        );
        assert_eq!(row["group_id"], group);
        assert_eq!(row["policy_version"], 1);
        assert_eq!(row["metadata"], json!({ "step": 5 }).to_string());
        // Token ids and logprobs exactly as the endpoint returned them.
        let messages: Value = serde_json::from_str(row["messages"].as_str().unwrap()).unwrap();
        let assistant: Vec<&Value> = messages
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "assistant")
            .collect();
        assert_eq!(assistant.len(), 3, "{messages}");
        assert_eq!(assistant[1]["token_ids"], json!([1002, 2002]));
        assert_eq!(assistant[1]["prompt_token_ids"], json!([7, 8, 9]));
        assert_eq!(assistant[1]["logprobs"]["content"][0]["logprob"], -0.5);
    }
    let answer = rows.iter().find(|r| r["task_id"] == "answer").unwrap();
    assert_eq!(
        (answer["status"].as_str(), answer["reward"].as_f64()),
        (Some("failed"), Some(0.0)),
        "41 is not 42: {answer}"
    );

    // Inline tasks, in a task table's row format: one scored on the host, one whose setup
    // needs a snapshot of its own (made on submit, content-addressed).
    let inline = api.ok("POST", "/v1/rollouts", Some(json!({ "items": [
        { "task": { "id": "inline-sum", "instruction": "What is 2+3?", "expected_answer": "5" },
          "policy": { "kind": "replay", "actions": [ { "kind": "submit", "answer": "5" } ] } },
        { "task": { "id": "inline-setup", "instruction": "Double the number in seven.", "setup": ["echo 7 > seven"],
                    "tests": { "run.sh": "[ \"$(cat /workspace/out.txt)\" = 14 ] && echo 1 > \"$FARM_REWARD_FILE\"" },
                    "test_command": "sh /opt/farm-tests/run.sh" },
          "policy": { "kind": "replay", "actions": [ { "kind": "exec", "command": "echo $(( $(cat seven) * 2 )) > out.txt" } ] } },
    ] })), 202).await;
    for row in api.rows_for(&ids_of(&inline), 0).await {
        assert_eq!(row["status"], "passed", "{row}");
    }

    // Rows that are already there come back at once, however long the poll may wait (a
    // 300 s wait against a 60 s client timeout).
    let quick = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let waited = quick
        .get(format!("{url}/v1/results?cursor=0&wait=300"))
        .send()
        .await
        .expect("a long poll over existing rows must not wait");
    assert_eq!(waited.status(), 200);
    assert!(!waited.text().await.unwrap().is_empty());

    // One rollout, by id.
    let one = api.ok("GET", &format!("/v1/rollouts/{}", ids[2]), None, 200).await;
    assert_eq!(one["state"], "done");
    assert_eq!(one["row"]["rollout_id"], ids[2].as_str());

    // The same rows as an Arrow stream with the Parquet schema.
    let (status, headers, bytes) = api
        .send(
            "GET",
            "/v1/results?cursor=0&max=10",
            None,
            &[("Accept", "application/vnd.apache.arrow.stream")],
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/vnd.apache.arrow.stream");
    let reader = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None).unwrap();
    let schema = reader.schema();
    for column in ["rollout_id", "group_id", "policy_version", "reward", "status", "steps"] {
        assert!(
            schema.field_with_name(column).is_ok(),
            "no column {column} in {schema:?}"
        );
    }
    let rows_in_arrow: usize = reader.map(|b| b.unwrap().num_rows()).sum();
    assert_eq!(rows_in_arrow, 5);

    // Bad requests: a 4xx with a JSON error naming what is wrong.
    let cases = [
        (
            "POST",
            "/v1/rollouts",
            json!({ "items": [ { "n": 1, "policy": { "kind": "replay", "actions": [] } } ] }),
            400,
            "task_id",
        ),
        (
            "POST",
            "/v1/rollouts",
            json!({ "items": [ { "task_id": "double", "n": 0, "policy": { "kind": "replay", "actions": [] } } ] }),
            400,
            "items[0].n",
        ),
        (
            "POST",
            "/v1/rollouts",
            json!({ "items": [ { "task_id": "double", "nn": 2, "policy": { "kind": "replay", "actions": [] } } ] }),
            400,
            "items[0].nn",
        ),
        (
            "POST",
            "/v1/rollouts",
            json!({ "items": [ { "task_id": "nope", "policy": { "kind": "replay", "actions": [] } } ] }),
            404,
            "items[0].task_id",
        ),
        (
            "POST",
            "/v1/rollouts",
            json!({ "items": [ { "task_id": "double", "policy": { "kind": "magic" } } ] }),
            400,
            "items[0].policy.kind",
        ),
        (
            "POST",
            "/v1/rollouts",
            json!({ "items": [ { "task_id": "double", "policy": { "kind": "openai", "base_url": "ftp://x", "model": "m" } } ] }),
            400,
            "items[0].policy.base_url",
        ),
        (
            "POST",
            "/v1/rollouts",
            json!({ "items": [ { "task_id": "double", "limits": { "timeout_secs": 100000 }, "policy": { "kind": "replay", "actions": [] } } ] }),
            400,
            "items[0].limits.timeout_secs",
        ),
        ("POST", "/v1/rollouts", json!({ "items": [] }), 400, "items"),
        (
            "POST",
            "/v1/rollouts",
            json!({ "items": [ { "task": { "id": "x", "files": { "../a": "1" }, "expected_answer": "1" }, "policy": { "kind": "replay", "actions": [] } } ] }),
            400,
            "items[0].task",
        ),
        (
            "POST",
            "/v1/rollouts",
            json!({ "items": [ { "task": { "id": "x", "instruction": "no way to score" }, "policy": { "kind": "replay", "actions": [] } } ] }),
            400,
            "items[0].task",
        ),
        (
            "POST",
            "/v1/rollouts",
            json!({ "items": [ { "task_id": "double", "task": { "id": "x", "expected_answer": "1" }, "policy": { "kind": "replay", "actions": [] } } ] }),
            400,
            "items[0].task",
        ),
        // A caller cannot make the service read a key from its own environment (and send
        // it to a base_url of the caller's choosing).
        (
            "POST",
            "/v1/rollouts",
            json!({ "items": [ { "task_id": "double", "policy": { "kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "FARM_SERVE_TOKEN" } } ] }),
            400,
            "api_key_env",
        ),
        (
            "POST",
            "/v1/cancel",
            json!({ "policy_version_below": "soon" }),
            400,
            "policy_version_below",
        ),
        ("POST", "/v1/sessions", json!({ "task_id": 7 }), 400, "task_id"),
        (
            "POST",
            "/v1/sessions/s-nope/exec",
            json!({ "command": "true" }),
            404,
            "",
        ),
        ("POST", "/v1/rollouts/r-nope/cancel", json!({}), 404, ""),
        ("GET", "/v1/results?max=0", Value::Null, 400, "max"),
    ];
    for (method, path, body, status, field) in cases {
        let (got, v) = api.call(method, path, (!body.is_null()).then_some(body.clone())).await;
        assert_eq!(got, status, "{method} {path} {body}: {v}");
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
        // The field is named: as `field`, or in the message (a missing one).
        let named = v["field"]
            .as_str()
            .is_some_and(|f| f == field || f.ends_with(&format!(".{field}")));
        assert!(
            named || v["error"].as_str().unwrap().contains(field),
            "{method} {path} {body}: {v}"
        );
    }
    let (status, _, text) = api
        .send("POST", "/v1/rollouts", None, &[("content-type", "application/json")])
        .await;
    assert_eq!(status, 400, "an empty body: {}", String::from_utf8_lossy(&text));

    // Sessions: a branch continues from the same state; after different commands the two
    // states differ; a branch of a branch works; each is scored on submit.
    let s = api
        .ok(
            "POST",
            "/v1/sessions",
            Some(json!({ "task_id": "double", "seed": 1 })),
            201,
        )
        .await;
    let a = s["session_id"].as_str().unwrap().to_string();
    let seen = api.session_exec(&a, "echo base > state; cat n.txt").await;
    assert_eq!(seen["step"]["stdout"], "21\n");
    let b = api.ok("POST", &format!("/v1/sessions/{a}/branch"), None, 201).await["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    api.session_exec(&a, "echo A >> state").await;
    api.session_exec(&b, "echo B >> state").await;
    let c = api.ok("POST", &format!("/v1/sessions/{b}/branch"), None, 201).await["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    api.session_write(&c, "state", "C\n").await;
    let state = |id: String| {
        let api = &api;
        async move {
            api.session_exec(&id, "cat state").await["step"]["stdout"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    assert_eq!(state(a.clone()).await, "base\nA\n");
    assert_eq!(state(b.clone()).await, "base\nB\n");
    assert_eq!(state(c.clone()).await, "C\n");
    let timed = api
        .ok(
            "POST",
            &format!("/v1/sessions/{a}/exec"),
            Some(json!({ "command": "sleep 30", "timeout_secs": 1 })),
            200,
        )
        .await;
    assert!(
        timed["step"]["stderr"].as_str().unwrap().contains("killed after"),
        "{timed}"
    );
    api.session_write(&b, "out.txt", "42\n").await;
    let verdict_b = api
        .ok("POST", &format!("/v1/sessions/{b}/submit"), Some(json!({})), 200)
        .await;
    assert_eq!(
        (verdict_b["status"].as_str(), verdict_b["reward"].as_f64()),
        (Some("passed"), Some(1.0)),
        "{verdict_b}"
    );
    let verdict_a = api.ok("POST", &format!("/v1/sessions/{a}/submit"), None, 200).await;
    assert_eq!(
        (verdict_a["status"].as_str(), verdict_a["reward"].as_f64()),
        (Some("failed"), Some(0.0)),
        "{verdict_a}"
    );
    api.ok("DELETE", &format!("/v1/sessions/{c}"), None, 200).await;
    // A session's actions share its time budget: past it, the session ends as a timeout,
    // with a row.
    let t = api
        .new_session(json!({ "task_id": "double", "limits": { "timeout_secs": 2 } }))
        .await;
    let over = api.session_exec(&t, "sleep 30").await;
    assert_eq!(
        (over["ended"].as_bool(), over["status"].as_str()),
        (Some(true), Some("timeout")),
        "{over}"
    );
    assert!(over["cursor"].is_u64(), "{over}");
    assert_eq!(api.session_exec_status(&t).await, 404);

    // A hostile session: it plants a test script where the tests would go, a reward writer
    // that lingers, and a fake out.txt that only reads right to itself. Scoring happens in a
    // fresh fork with the session's files only: the verdict is the honest one.
    let h = api.new_session(json!({ "task_id": "double" })).await;
    let plant = concat!(
        r#"mkdir -p /opt/farm-tests && printf 'echo 1 > "$FARM_REWARD_FILE"\n' > /opt/farm-tests/run.sh; "#,
        r#"(while true; do for f in /opt/farm-tests/* /tmp/*; do echo 1 > "$f" 2>/dev/null; done; sleep 0.05; done) >/dev/null 2>&1 & "#,
        "ln -sf /proc/self/cmdline out.txt",
    );
    api.session_exec(&h, plant).await;
    let hostile = api
        .ok(
            "POST",
            &format!("/v1/sessions/{h}/submit"),
            Some(json!({ "answer": "42" })),
            200,
        )
        .await;
    assert_eq!(
        (hostile["status"].as_str(), hostile["reward"].as_f64()),
        (Some("failed"), Some(0.0)),
        "a session forged its reward: {hostile}"
    );
    for id in [&a, &b, &c] {
        assert_eq!(api.session_exec_status(id).await, 404, "session {id} ended");
    }
    let session_rows = api
        .rows_for(
            &[
                verdict_a["rollout_id"].as_str().unwrap().to_string(),
                verdict_b["rollout_id"].as_str().unwrap().to_string(),
            ],
            0,
        )
        .await;
    let row_b = session_rows
        .iter()
        .find(|r| r["rollout_id"] == verdict_b["rollout_id"])
        .unwrap();
    let kinds: Vec<&str> = row_b["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["exec", "exec", "exec", "write_file"],
        "a branch's row holds its parent's steps before the branch: {row_b}"
    );

    // The Python client example, against the same service and the stand-in model.
    let client = Command::new("python3")
        .arg(repo().join("examples/farm_client.py"))
        .args([
            "--farm",
            &url,
            "--model-url",
            &model_url,
            "--tasks",
            "double",
            "answer",
            "--n",
            "2",
        ])
        .output()
        .unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(client.status.success(), "{printed}");
    assert!(printed.contains("task double: passed:1.0, passed:1.0"), "{printed}");
    assert!(printed.contains("task answer: passed:1.0, passed:1.0"), "{printed}");
    assert!(
        printed.contains("session branch: out.txt = 42, passed reward 1.0"),
        "{printed}"
    );
    assert!(
        printed.contains("session original: out.txt = 41, failed reward 0.0"),
        "{printed}"
    );
    assert!(printed.contains("arrow: "), "{printed}");

    // Metrics: Prometheus text, bounded labels (no task or rollout ids).
    let (status, _, metrics) = api.send("GET", "/metrics", None, &[]).await;
    let metrics = String::from_utf8(metrics).unwrap();
    assert_eq!(status, 200);
    for name in [
        "farm_rollouts_total{status=\"passed\"}",
        "farm_reward_bucket",
        "farm_phase_seconds_bucket{phase=\"score\"",
        "farm_rollouts_in_flight",
        "farm_queue_depth",
        "farm_vms{role=\"session\"}",
        "farm_warm_pool_hits_total",
        "farm_policy_requests_total{code=\"200\"}",
        "farm_sessions_live",
    ] {
        assert!(metrics.contains(name), "no {name} in\n{metrics}");
    }
    assert!(
        !metrics.contains("double") && !metrics.contains("r-"),
        "task or rollout ids in metric labels:\n{metrics}"
    );

    stop(&mut serve);
    assert_no_qemu_of(run_dir.path());
    // Everything is in Parquet parts after the stop.
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("manifest.json")).unwrap()).unwrap();
    let in_parts: u64 = manifest["parts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["rows"].as_u64().unwrap())
        .sum();
    let journal = std::fs::read_to_string(out.path().join("journal.jsonl")).unwrap();
    assert_eq!(in_parts as usize, journal.lines().count());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_backpressure_and_cancel_by_policy_version() {
    let dir = tempfile::tempdir().unwrap();
    let config = suite_config(
        dir.path(),
        "serve.toml",
        "queue_limit = 2\nconcurrency = 1\nmax_sessions = 1\nsession_lease_secs = 10\n",
    );
    let (out, run_dir) = (dir.path().join("out"), tempfile::tempdir().unwrap());

    // Beyond loopback only with a token.
    let refused = Command::new(env!("CARGO_BIN_EXE_farm"))
        .arg("serve")
        .arg(&config)
        .args(["--listen", "0.0.0.0:0"])
        .env_remove("FARM_SERVE_TOKEN")
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("FARM_SERVE_TOKEN"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let token = "t0ken-for-the-test";
    let (mut serve, url) = farm_serve(&config, &out, run_dir.path(), "0.0.0.0:0", Some(token));
    for wrong in [None, Some("t0ken-for-the-tesT"), Some("")] {
        let api = Api::new(&url, wrong);
        for (method, path) in [
            ("GET", "/v1/capacity"),
            ("GET", "/metrics"),
            ("POST", "/v1/rollouts"),
            ("GET", "/v1/results"),
        ] {
            let (status, _, _) = api
                .send(method, path, Some(json!({ "items": [ sleeper(1, 1) ] })), &[])
                .await;
            assert_eq!(status, 401, "{method} {path} with token {wrong:?}");
        }
    }
    let api = Api::new(&url, Some(token));
    assert_eq!(api.ok("GET", "/v1/capacity", None, 200).await["slots"], 1);

    // One slot, a queue of two: a third waiting rollout is refused with Retry-After.
    let old = api
        .ok("POST", "/v1/rollouts", Some(json!({ "items": [ sleeper(2, 1) ] })), 202)
        .await;
    let started = Instant::now();
    while api.ok("GET", "/v1/capacity", None, 200).await["in_flight"] != 1 {
        assert!(started.elapsed() < Duration::from_secs(120));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, headers, body) = api
        .send("POST", "/v1/rollouts", Some(json!({ "items": [ sleeper(2, 1) ] })), &[])
        .await;
    assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
    assert!(headers.contains_key("retry-after"));
    let new = api
        .ok("POST", "/v1/rollouts", Some(json!({ "items": [ sleeper(1, 7) ] })), 202)
        .await;
    let capacity = api.ok("GET", "/v1/capacity", None, 200).await;
    assert_eq!(
        (capacity["in_flight"].as_u64(), capacity["queued"].as_u64()),
        (Some(1), Some(2)),
        "{capacity}"
    );

    // Sessions are limited too.
    let session = api
        .ok("POST", "/v1/sessions", Some(json!({ "task_id": "double" })), 201)
        .await;
    let (status, v) = api
        .call("POST", "/v1/sessions", Some(json!({ "task_id": "double" })))
        .await;
    assert_eq!(status, 429, "{v}");
    assert!(v["error"].as_str().unwrap().contains("max_sessions"), "{v}");

    // Cancel after a weight update: everything below version 5, running or queued.
    let old_ids = ids_of(&old);
    let cancelled = api
        .ok("POST", "/v1/cancel", Some(json!({ "policy_version_below": 5 })), 200)
        .await;
    assert_eq!(cancelled["cancelled"], 2, "{cancelled}");
    let rows = api.rows_for(&old_ids, 0).await;
    for row in &rows {
        assert_eq!(row["status"], "env_error", "{row}");
        assert!(
            row["reward"].is_null(),
            "a cancelled rollout has no reward, never a zero: {row}"
        );
        assert_eq!(row["error"], "cancelled: policy_version below 5");
    }
    let new_id = ids_of(&new)[0].clone();
    let state = api.ok("GET", &format!("/v1/rollouts/{new_id}"), None, 200).await["state"].clone();
    assert!(
        state == "running" || state == "queued",
        "version 7 is not cancelled: {state}"
    );
    let one = api
        .ok("POST", &format!("/v1/rollouts/{new_id}/cancel"), None, 200)
        .await;
    assert_eq!(one["cancelled"], true);
    let row = &api.rows_for(std::slice::from_ref(&new_id), 0).await[0];
    assert_eq!(row["error"], "cancelled: by request");
    assert_eq!(
        api.ok("POST", &format!("/v1/rollouts/{new_id}/cancel"), None, 200)
            .await["cancelled"],
        false,
        "a finished rollout stays finished"
    );

    // The idle session expires after its lease (10 s here: the only check that needs it
    // alive, the refused second session, comes right after it opened) and frees its slot. (Watched through
    // /v1/capacity: a call on the session would keep it alive.)
    let started = Instant::now();
    while api.ok("GET", "/v1/capacity", None, 200).await["sessions"] != 0 {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the idle session never expired"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let id = session["session_id"].as_str().unwrap();
    assert_eq!(api.session_exec_status(id).await, 404);

    // SIGTERM with a session live: the service stops, and no QEMU outlives it.
    api.ok("POST", "/v1/sessions", Some(json!({ "task_id": "double" })), 201)
        .await;
    stop(&mut serve);
    assert_no_qemu_of(run_dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_sigkill_loses_no_row_and_reports_lost_work() {
    let [out, run_dir] = temp_dirs();
    let config = repo().join("configs/serve.toml");
    let (mut serve, url) = farm_serve(&config, out.path(), run_dir.path(), "127.0.0.1:0", None);
    let api = Api::new(&url, None);
    // One service per output folder.
    let second = Command::new(env!("CARGO_BIN_EXE_farm"))
        .arg("serve")
        .arg(&config)
        .arg("--out")
        .arg(out.path())
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("another farm serve is using the output folder"),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let quick = json!({ "items": [ { "task_id": "double", "policy_version": 3, "policy": { "kind": "replay", "actions": [
        { "kind": "exec", "command": "echo 42 > out.txt" } ] } } ] });
    let (status, body) = api.post_keyed("/v1/rollouts", quick.clone(), "quick").await;
    assert_eq!(status, 202);
    let quick_ids = ids_of(&serde_json::from_slice(&body).unwrap());
    let done = api.rows_for(&quick_ids, 0).await;
    assert_eq!(done[0]["status"], "passed", "{}", done[0]);
    let slow = ids_of(
        &api.ok("POST", "/v1/rollouts", Some(json!({ "items": [ sleeper(3, 3) ] })), 202)
            .await,
    );
    let session = api
        .ok("POST", "/v1/sessions", Some(json!({ "task_id": "double" })), 201)
        .await;
    let started = Instant::now();
    while api.ok("GET", "/v1/capacity", None, 200).await["in_flight"] == 0 {
        assert!(started.elapsed() < Duration::from_secs(120));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // SIGKILL: no orderly stop. No QEMU survives it.
    serve.child.kill().unwrap();
    serve.child.wait().unwrap();
    assert_no_qemu_of(run_dir.path());

    let (mut serve, url) = farm_serve(&config, out.path(), run_dir.path(), "127.0.0.1:0", None);
    assert!(serve.log().contains("lost in its restart"), "{}", serve.log());
    let api = Api::new(&url, None);
    let mut all = slow.clone();
    all.push(session["rollout_id"].as_str().unwrap().to_string());
    all.extend(quick_ids.clone());
    let rows = api.rows_for(&all, 0).await;
    assert_eq!(rows.len(), 5, "{rows:?}");
    // The finished row keeps its cursor; what was queued, running or live is reported lost.
    assert_eq!(rows[0]["rollout_id"], quick_ids[0].as_str());
    assert_eq!(rows[0]["cursor"], done[0]["cursor"]);
    for row in &rows[1..] {
        assert_eq!(
            (row["status"].as_str(), row["error"].as_str()),
            (Some("env_error"), Some("lost in restart")),
            "{row}"
        );
        assert!(row["reward"].is_null());
    }
    // The idempotency key survives the restart: no new rollout.
    let (status, again) = api.post_keyed("/v1/rollouts", quick, "quick").await;
    assert_eq!(status, 202);
    assert_eq!(ids_of(&serde_json::from_slice(&again).unwrap()), quick_ids);
    assert_eq!(api.ok("GET", "/v1/capacity", None, 200).await["queued"], 0);
    stop(&mut serve);
    assert_no_qemu_of(run_dir.path());
}

/// Two `farm serve` processes on loopback as one pool, through examples/farm_client.py's
/// Fleet (farm/tests/fleet_check.py): submits spread by capacity, sessions that stay on their
/// endpoint, and a `kill -9` and restart of one endpoint that loses and repeats no row.
#[test]
fn a_fleet_of_two_services_spreads_work_and_survives_a_restart() {
    let work = tempfile::tempdir().unwrap();
    let o = Command::new("python3")
        .arg(repo().join("farm/tests/fleet_check.py"))
        .arg(env!("CARGO_BIN_EXE_farm"))
        .arg(repo().join("configs/serve.toml"))
        .arg(work.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success() && printed.contains("fleet ok"), "{printed}");
    for endpoint in ["a", "b"] {
        assert_no_qemu_of(&work.path().join(endpoint).join("run"));
    }
}

/// The stdout of one exec in a session.
async fn run_in(api: &Api, session: &str, command: &str) -> String {
    let answer = api.session_exec(session, command).await;
    assert_eq!(answer["step"]["exit_code"], 0, "{command}: {answer}");
    answer["step"]["stdout"].as_str().unwrap().to_string()
}

/// A session paused to disk keeps its processes, open files and workspace; the pause
/// survives `kill -9` of the service; a paused session can be branched, resumed (as itself)
/// and deleted; and its task snapshot is pinned against `farm snapshot gc` while it lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_session_survives_a_kill_and_resumes_as_it_was() {
    let [out, run_dir] = temp_dirs();
    let config = repo().join("configs/serve.toml");
    let (mut serve, url) = farm_serve(&config, out.path(), run_dir.path(), "127.0.0.1:0", None);
    let api = Api::new(&url, None);
    let s = api.new_session(json!({ "task_id": "double" })).await;
    // A file, and a process that holds a file open and writes to it.
    let before = run_in(&api, &s, "echo hello > a.txt; (exec 3>>/tmp/held; while sleep 0.2; do echo tick >&3; done) >/dev/null 2>&1 & echo $!; echo $FARM_FORK_ID").await;
    let (pid, fork_id) = before.trim().split_once('\n').unwrap();
    let (pid, fork_id) = (pid.to_string(), fork_id.to_string());

    let paused = api.ok("POST", &format!("/v1/sessions/{s}/pause"), None, 200).await;
    assert_eq!(paused["state"], "paused", "{paused}");
    let (disk, memory) = (
        paused["paused"]["disk_bytes"].as_u64().unwrap(),
        paused["paused"]["memory_bytes"].as_u64().unwrap(),
    );
    assert!(
        disk > 0 && disk < memory / 8,
        "a paused session stores what differs from its task snapshot: {paused}"
    );
    assert_eq!(
        api.ok("POST", &format!("/v1/sessions/{s}/pause"), None, 200).await,
        paused,
        "a second pause answers the same"
    );
    let (status, refused) = api
        .call(
            "POST",
            &format!("/v1/sessions/{s}/exec"),
            Some(json!({ "command": "true" })),
        )
        .await;
    assert!(
        status == 409 && refused["error"].as_str().unwrap().contains("resume it first"),
        "{refused}"
    );
    let listed = api.ok("GET", "/v1/sessions", None, 200).await;
    assert_eq!(listed["sessions"][0]["state"], "paused", "{listed}");
    let (_, _, metrics) = api.send("GET", "/metrics", None, &[]).await;
    assert!(String::from_utf8_lossy(&metrics).contains("farm_sessions_paused 1"));

    // The task snapshot it rests on is pinned: gc would not remove it.
    let folders: Vec<PathBuf> = std::fs::read_dir(out.path().join("paused"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(folders.len(), 1);
    let fork: Value = serde_json::from_str(&std::fs::read_to_string(folders[0].join("fork.json")).unwrap()).unwrap();
    let base = fork["base"].as_str().unwrap().to_string();
    let gc = Command::new(env!("CARGO_BIN_EXE_farm"))
        .args(["snapshot", "gc", "--dry-run"])
        .output()
        .unwrap();
    assert!(
        gc.status.success() && !String::from_utf8_lossy(&gc.stdout).contains(&base),
        "gc would remove the pinned {base}: {}",
        String::from_utf8_lossy(&gc.stdout)
    );

    // kill -9: the paused session is taken up by the next start.
    serve.child.kill().unwrap();
    serve.child.wait().unwrap();
    let (mut serve, url) = farm_serve(&config, out.path(), run_dir.path(), "127.0.0.1:0", None);
    let api = Api::new(&url, None);
    let after = api.ok("GET", &format!("/v1/sessions/{s}"), None, 200).await;
    assert_eq!(
        (after["state"].as_str(), after["steps"].as_u64()),
        (Some("paused"), Some(1)),
        "{after}"
    );

    // A branch of the paused session: its state, a new identity; the original stays paused.
    let b = api.ok("POST", &format!("/v1/sessions/{s}/branch"), None, 201).await["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let seen = run_in(
        &api,
        &b,
        &format!("cat a.txt; kill -0 {pid} && echo alive; echo $FARM_FORK_ID"),
    )
    .await;
    let lines: Vec<&str> = seen.lines().collect();
    assert_eq!(&lines[..2], ["hello", "alive"], "{seen}");
    assert_ne!(lines[2], fork_id, "a branch takes an identity of its own");
    assert_eq!(
        api.ok("GET", &format!("/v1/sessions/{s}"), None, 200).await["state"],
        "paused"
    );
    api.ok("DELETE", &format!("/v1/sessions/{b}"), None, 200).await;

    // Resumed: the same processes, files and identity; the writer goes on.
    let resumed = api.ok("POST", &format!("/v1/sessions/{s}/resume"), None, 200).await;
    assert_eq!(resumed["state"], "live", "{resumed}");
    assert_eq!(
        api.ok("POST", &format!("/v1/sessions/{s}/resume"), None, 200).await["state"],
        "live",
        "a second resume answers the same"
    );
    let seen = run_in(
        &api,
        &s,
        &format!("cat a.txt; kill -0 {pid} && echo alive; echo $FARM_FORK_ID; n=$(wc -l < /tmp/held); i=0; while [ $(wc -l < /tmp/held) -le $n ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; [ $(wc -l < /tmp/held) -gt $n ] && echo writing"),
    )
    .await;
    assert_eq!(
        seen.lines().collect::<Vec<_>>(),
        ["hello", "alive", fork_id.as_str(), "writing"],
        "{seen}"
    );
    run_in(&api, &s, "echo $(( $(cat n.txt) * 2 )) > out.txt").await;
    let verdict = api
        .ok("POST", &format!("/v1/sessions/{s}/submit"), Some(json!({})), 200)
        .await;
    assert_eq!(verdict["status"], "passed", "{verdict}");

    // Paused, then deleted: its folder goes.
    let d = api.new_session(json!({ "task_id": "double" })).await;
    api.ok("POST", &format!("/v1/sessions/{d}/pause"), None, 200).await;
    api.ok("DELETE", &format!("/v1/sessions/{d}"), None, 200).await;
    assert_eq!(api.call("GET", &format!("/v1/sessions/{d}"), None).await.0, 404);
    let left: Vec<_> = std::fs::read_dir(out.path().join("paused")).unwrap().collect();
    assert!(left.is_empty(), "paused folders left: {left:?}");
    // A paused session outlives an orderly stop (SIGTERM) too.
    let k = api.new_session(json!({ "task_id": "double" })).await;
    api.ok("POST", &format!("/v1/sessions/{k}/pause"), None, 200).await;
    stop(&mut serve);
    assert_no_qemu_of(run_dir.path());
    assert_eq!(
        std::fs::read_dir(out.path().join("paused")).unwrap().count(),
        1,
        "the paused folder is kept at shutdown"
    );
    let (mut serve, url) = farm_serve(&config, out.path(), run_dir.path(), "127.0.0.1:0", None);
    let api = Api::new(&url, None);
    assert_eq!(
        api.ok("GET", &format!("/v1/sessions/{k}"), None, 200).await["state"],
        "paused"
    );
    // Taken up after a restart, it can be deleted: its folder goes.
    api.ok("DELETE", &format!("/v1/sessions/{k}"), None, 200).await;
    assert_eq!(std::fs::read_dir(out.path().join("paused")).unwrap().count(), 0);
    stop(&mut serve);
}

/// The same server over HTTPS, with a certificate for `host.farm.internal` from a private CA
/// made here (ROOT/ca.pem, for FARM_EGRESS_EXTRA_CA); (process, port).
fn https_server(root: &Path, token: &str) -> (Proc, u16) {
    let sh = |script: &str| {
        let o = Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(root)
            .output()
            .unwrap();
        assert!(o.status.success(), "{script}: {}", String::from_utf8_lossy(&o.stderr));
    };
    sh("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj '/CN=farm test CA' -keyout ca.key -out ca.pem 2>/dev/null");
    sh("openssl req -newkey rsa:2048 -nodes -subj '/CN=host.farm.internal' -keyout server.key -out server.csr 2>/dev/null && \
        printf 'subjectAltName=DNS:host.farm.internal\\n' > ext.cnf && \
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile ext.cnf -out server.pem 2>/dev/null");
    let mut c = Command::new("python3");
    c.arg(repo().join("farm/tests/git_server.py"))
        .arg(root)
        .arg(token)
        .arg(root.join("requests.log"))
        .arg(root.join("server.pem"))
        .arg(root.join("server.key"));
    let (p, port) = start(c, "listening on ", true);
    (p, port.parse().unwrap())
}

/// A git server on loopback (farm/tests/git_server.py) that wants `token`; (process, port).
fn git_server(root: &Path, token: &str) -> (Proc, u16) {
    for args in [
        vec!["init", "-q", "--bare", "-b", "main", "repo.git"],
        vec!["-C", "repo.git", "config", "http.receivepack", "true"],
        vec!["init", "-q", "-b", "main", "seed"],
    ] {
        assert!(Command::new("git")
            .args(&args)
            .current_dir(root)
            .status()
            .unwrap()
            .success());
    }
    let seed = root.join("seed");
    assert!(Command::new("git")
        .args([
            "-c",
            "user.email=t@farm",
            "-c",
            "user.name=t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "base"
        ])
        .current_dir(&seed)
        .status()
        .unwrap()
        .success());
    assert!(Command::new("git")
        .args(["push", "-q"])
        .arg(root.join("repo.git"))
        .arg("main")
        .current_dir(&seed)
        .status()
        .unwrap()
        .success());
    let mut c = Command::new("python3");
    c.arg(repo().join("farm/tests/git_server.py"))
        .arg(root)
        .arg(token)
        .arg(root.join("requests.log"));
    let (p, port) = start(c, "listening on ", true);
    (p, port.parse().unwrap())
}

fn refs(root: &Path) -> String {
    repo_git(root, &["for-each-ref", "--format=%(refname)"])
}

/// What `git -C repo.git ARGS` prints, run in `root`.
fn repo_git(root: &Path, args: &[&str]) -> String {
    String::from_utf8(
        Command::new("git")
            .args(["-C", "repo.git"])
            .args(args)
            .current_dir(root)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
}

/// A secret of the test's own (`salt` tells two apart), for a credential rule to add.
fn fresh_token(salt: u64) -> String {
    format!(
        "farmtok{:016x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            ^ salt
    )
}

/// Request rules: a GET-only rule lets GETs through and nothing else; the proxy adds the
/// credential the guest never holds; a push rule lets `git push` update only
/// `refs/heads/agent/*` and refuses main, a tag and a deletion before the server sees them.
/// The token is then searched for in the session's memory and disk (paused to its folder).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_rules_credentials_and_a_push_limited_to_a_branch_pattern() {
    let [out, run_dir, git] = temp_dirs();
    let token = fresh_token(0);
    let (_git, port) = git_server(git.path(), &token);
    let tls_root = tempfile::tempdir().unwrap();
    let (_tls, tls_port) = https_server(tls_root.path(), &token);
    let (_passed, pass_port) = https_server(
        &{
            let d = tls_root.path().join("pass");
            std::fs::create_dir_all(&d).unwrap();
            d
        },
        &token,
    );
    // The proxy checks the HTTPS server against the host's trust store and this private CA.
    let extra_ca = tls_root.path().join("ca.pem");
    let suite = out.path().join("egress.toml");
    let credential = "credential = { header = \"Authorization\", prefix = \"Bearer \", env = \"FARM_TEST_GIT_TOKEN\" }";
    std::fs::write(
        &suite,
        format!(
            "[suite]\nname = \"egress\"\n[template]\nimage = \"python\"\n[dataset]\npath = \"{}\"\nformat = \"task_dirs\"\ntasks = [\"double\"]\n[policy]\nkind = \"replay\"\n\
             [rollouts.network]\nallow = [\"host.farm.internal:{pass_port}\"]\n\
             [[rollouts.network.rules]]\nhost = \"host.farm.internal\"\nport = {port}\nmethods = [\"GET\", \"HEAD\"]\npaths = [\"/simple/\"]\n{credential}\n\
             [[rollouts.network.rules]]\nhost = \"host.farm.internal\"\nport = {tls_port}\nmethods = [\"GET\"]\npaths = [\"/simple/\"]\n{credential}\n\
             [[rollouts.network.rules]]\nhost = \"host.farm.internal\"\nport = {port}\npaths = [\"/repo.git/\"]\ngit_push = {{ refs = [\"refs/heads/agent/*\"] }}\n{credential}\n",
            repo().join("configs/data/serve-tasks").display()
        ),
    )
    .unwrap();
    let (mut serve, url) = farm_serve_with(
        &suite,
        &out.path().join("serve"),
        run_dir.path(),
        "127.0.0.1:0",
        None,
        &[
            ("FARM_TEST_GIT_TOKEN", std::ffi::OsStr::new(&token)),
            ("FARM_EGRESS_EXTRA_CA", extra_ca.as_os_str()),
        ],
    );
    let api = Api::new(&url, None);
    let s = api.new_session(json!({ "task_id": "double" })).await;
    let base = format!("http://host.farm.internal:{port}");
    let fetch = |method: &str, path: &str| {
        format!("python3 -c \"import urllib.request as u, urllib.error as e\ntry:\n  r = u.urlopen(u.Request('{base}{path}', data=b'x' if '{method}' == 'POST' else None, method='{method}')); print(r.status, r.read().decode().strip())\nexcept e.HTTPError as x:\n  print(x.code, x.read().decode().strip())\"")
    };
    let got = run_in(&api, &s, &fetch("GET", "/simple/pkg/")).await;
    assert_eq!(
        got.trim(),
        "200 ok",
        "a GET the rule allows reaches the server, with the credential added"
    );
    for (method, path) in [("POST", "/simple/pkg/"), ("GET", "/admin")] {
        let got = run_in(&api, &s, &fetch(method, path)).await;
        assert!(
            got.starts_with("403 ")
                && got.contains("suite egress [rollouts.network]")
                && got.contains(&format!("{method} host.farm.internal:{port}{path}")),
            "{method} {path}: {got}"
        );
    }
    // HTTPS to an inspected host: farm's CA (installed in the guest) answers, the rules apply
    // inside, and the upstream is checked against the host's trust store.
    let https = |method: &str, port: u16, verify: bool| {
        let context = if verify {
            "None"
        } else {
            "__import__('ssl')._create_unverified_context()"
        };
        format!("python3 -c \"import urllib.request as u, urllib.error as e\ntry:\n  r = u.urlopen(u.Request('https://host.farm.internal:{port}/simple/pkg/', data=b'x' if '{method}' == 'POST' else None, method='{method}'), context={context}); print(r.status, r.read().decode().strip())\nexcept e.HTTPError as x:\n  print(x.code, x.read().decode().strip())\"")
    };
    assert_eq!(
        run_in(&api, &s, &https("GET", tls_port, true)).await.trim(),
        "200 ok",
        "HTTPS through the rules, with the credential"
    );
    let got = run_in(&api, &s, &https("POST", tls_port, true)).await;
    assert!(
        got.starts_with("403 ") && got.contains(&format!("POST host.farm.internal:{tls_port}/simple/pkg/")),
        "{got}"
    );
    // A pass-through host: CONNECT is relayed as is (the guest sees the server's own
    // certificate, and no credential is added: the server answers 401).
    assert_eq!(
        run_in(&api, &s, &https("GET", pass_port, false)).await.trim(),
        "401 a bearer token is required",
        "pass-through CONNECT"
    );
    // A raw request to the proxy naming another virtual host in its Host header: the
    // upstream hears the host the rules checked.
    let raw = format!(
        "python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', 3128)); s.sendall(b'GET {base}/simple/pkg/ HTTP/1.1\\r\\nHost: internal-admin.example\\r\\nConnection: close\\r\\n\\r\\n'); print(s.recv(100).split(b'\\r\\n')[0].decode())\""
    );
    assert_eq!(run_in(&api, &s, &raw).await.trim(), "HTTP/1.1 200 OK");
    // Smuggling: an allowed GET carrying a body that holds another request (a push the
    // rules would check, or a POST they deny). The git server never reads a GET's body and
    // keeps the connection open, so a forwarded body would be executed as a request of its
    // own; the proxy refuses such a GET (400) over plain HTTP and inside intercepted HTTPS.
    let smuggle = format!(
        "python3 -c \"import socket, ssl\n\
         inner = b'POST /repo.git/git-receive-pack HTTP/1.1\\r\\nHost: host.farm.internal:{port}\\r\\nContent-Length: 0\\r\\n\\r\\n'\n\
         s = socket.create_connection(('127.0.0.1', 3128))\n\
         s.sendall(b'GET {base}/repo.git/info/refs?service=git-receive-pack HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: %d\\r\\n\\r\\n' % len(inner) + inner)\n\
         print(s.recv(100).split(b'\\r\\n')[0].decode())\n\
         inner = b'POST /simple/pkg/ HTTP/1.1\\r\\nHost: host.farm.internal:{tls_port}\\r\\nContent-Length: 0\\r\\n\\r\\n'\n\
         s = socket.create_connection(('127.0.0.1', 3128))\n\
         s.sendall(b'CONNECT host.farm.internal:{tls_port} HTTP/1.1\\r\\n\\r\\n')\n\
         head = b''\n\
         while not head.endswith(b'\\r\\n\\r\\n'): head += s.recv(1)\n\
         t = ssl.create_default_context().wrap_socket(s, server_hostname='host.farm.internal')\n\
         t.sendall(b'GET /simple/pkg/ HTTP/1.1\\r\\nHost: host.farm.internal\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n%x\\r\\n' % len(inner) + inner + b'\\r\\n0\\r\\n\\r\\n')\n\
         print(t.recv(100).split(b'\\r\\n')[0].decode())\""
    );
    assert_eq!(
        run_in(&api, &s, &smuggle).await.trim(),
        "HTTP/1.1 400 Bad Request\nHTTP/1.1 400 Bad Request",
        "a GET with a body is refused, plain and inside TLS"
    );
    let log = std::fs::read_to_string(git.path().join("requests.log")).unwrap();
    assert!(
        !log.contains("internal-admin") && log.contains(&format!("host=host.farm.internal:{port}")),
        "{log}"
    );
    let git_in_guest = format!("cd /root && git init -q -b main w && cd w && git -c user.email=a@farm -c user.name=a commit -q --allow-empty -m agent && git remote add origin {base}/repo.git && echo made");
    assert_eq!(run_in(&api, &s, &git_in_guest).await.trim(), "made");
    let push = |refspec: &str| format!("cd /root/w && git push origin {refspec} 2>&1; echo rc=$?");
    let pushed = run_in(&api, &s, &push("HEAD:refs/heads/agent/fix")).await;
    assert!(pushed.trim_end().ends_with("rc=0"), "the allowed branch: {pushed}");
    let before = refs(git.path());
    assert_eq!(
        before.lines().collect::<Vec<_>>(),
        ["refs/heads/agent/fix", "refs/heads/main"],
        "{before}"
    );
    let main_before = repo_git(git.path(), &["rev-parse", "main"]);
    for refspec in [
        "+HEAD:refs/heads/main",
        "HEAD:refs/tags/v1",
        ":refs/heads/agent/fix",
        "HEAD:refs/heads/agent/two +HEAD:refs/heads/main",
    ] {
        let refused = run_in(&api, &s, &push(refspec)).await;
        assert!(
            !refused.trim_end().ends_with("rc=0") && refused.contains("403"),
            "{refspec}: {refused}"
        );
        assert_eq!(refs(git.path()), before, "{refspec}: the server's refs changed");
    }
    let main_after = repo_git(git.path(), &["rev-parse", "main"]);
    assert_eq!(main_before, main_after);
    // Refused requests are logged with method, host and path.
    assert!(
        serve
            .log()
            .contains(&format!("network: denied POST host.farm.internal:{port}/simple/pkg/")),
        "{}",
        serve.log()
    );
    assert!(
        serve.log().contains(&format!(
            "network: denied POST https://host.farm.internal:{tls_port}/simple/pkg/"
        )),
        "{}",
        serve.log()
    );
    // Every request that reached the server carried the token; the guest never held it.
    let log = std::fs::read_to_string(git.path().join("requests.log")).unwrap();
    assert!(!log.is_empty() && !log.contains("no-token"), "{log}");
    // A marker the guest does hold, to show the search below would find a token if it were there.
    run_in(
        &api,
        &s,
        "m=markerfarm; echo ${m}0451 > /root/marker; cat /root/marker > /dev/null",
    )
    .await;
    api.ok("POST", &format!("/v1/sessions/{s}/pause"), None, 200).await;
    let folder = std::fs::read_dir(out.path().join("serve/paused"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut found_marker = false;
    for name in ["memory.diff", "disk.qcow2", "state.bin"] {
        let bytes = std::fs::read(folder.join("state").join(name)).unwrap();
        assert!(
            !bytes.windows(token.len()).any(|w| w == token.as_bytes()),
            "the token is in the guest's {name}"
        );
        found_marker |= bytes.windows(14).any(|w| w == b"markerfarm0451");
    }
    assert!(found_marker, "the search must be able to find what the guest holds");
    api.ok("DELETE", &format!("/v1/sessions/{s}"), None, 200).await;
    stop(&mut serve);
    assert_no_qemu_of(run_dir.path());
}

/// A package index of `farmtestpkg` 1.0 and the host Python's own pip wheel, under ROOT/index
/// for farm/tests/git_server.py (farm/tests/package_index.py).
fn package_index(root: &Path) {
    let o = Command::new("python3")
        .arg(repo().join("farm/tests/package_index.py"))
        .arg(root.join("index"))
        .arg("--with-pip")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The standard case end to end, with a task written for farm: a Python project with a
/// failing test. The agent installs its dependency from a package index through a GET-only
/// rule, runs the tests (red), edits the code, and pauses for the night; the service is
/// killed (-9) and started again; the session resumes where it was, the tests pass, the agent
/// pushes its branch through the credential rule, a push to main is refused, and the session
/// is submitted and scored (in its own VM, `final_state`: the dependency it installed is
/// part of what is checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_fixes_a_bug_pauses_overnight_resumes_pushes_its_branch_and_is_scored() {
    let [out, run_dir, git] = temp_dirs();
    let token = fresh_token(0x5a5a);
    package_index(git.path());
    let (_git, port) = git_server(git.path(), &token);
    let suite = out.path().join("e2e.toml");
    let e2e_vars = [("FARM_TEST_E2E_TOKEN", std::ffi::OsStr::new(&token))];
    let credential = "credential = { header = \"Authorization\", prefix = \"Bearer \", env = \"FARM_TEST_E2E_TOKEN\" }";
    std::fs::write(
        &suite,
        format!(
            "[suite]\nname = \"fix-a-bug\"\n[template]\nimage = \"python\"\n[dataset]\npath = \"{}\"\nformat = \"task_dirs\"\ntasks = [\"double\"]\n[policy]\nkind = \"replay\"\n\
             [rollouts]\ntimeout_secs = 1200\nstep_timeout_secs = 600\n[scoring]\nmode = \"final_state\"\ntimeout_secs = 600\n\
             [[rollouts.network.rules]]\nhost = \"host.farm.internal\"\nport = {port}\nmethods = [\"GET\", \"HEAD\"]\npaths = [\"/simple/\", \"/packages/\"]\n{credential}\n\
             [[rollouts.network.rules]]\nhost = \"host.farm.internal\"\nport = {port}\npaths = [\"/repo.git/\"]\ngit_push = {{ refs = [\"refs/heads/agent/*\"] }}\n{credential}\n",
            repo().join("configs/data/serve-tasks").display()
        ),
    )
    .unwrap();
    let task = json!({
        "id": "fix-total",
        "instruction": "The tests of /workspace fail. Make them pass and push your branch agent/fix.",
        "files": {
            "shop.py": "from farmtestpkg import double\n\ndef total(prices):\n    return sum(prices) - 1\n\ndef total_twice(prices):\n    return double(total(prices))\n",
            "test_shop.py": "from shop import total, total_twice\n\ndef test_total():\n    assert total([1, 2, 3]) == 6\n\ndef test_twice():\n    assert total_twice([2, 3]) == 10\n",
        },
        "test_command": "cd /workspace && python3 -m pytest -q -p no:cacheprovider test_shop.py",
        "test_user": "root",
        "require_reward_file": false
    });
    // The service, started again after its kill with the same folders.
    let start_service = || {
        farm_serve_with(
            &suite,
            &out.path().join("serve"),
            run_dir.path(),
            "127.0.0.1:0",
            None,
            &e2e_vars,
        )
    };
    let (serve, url) = start_service();
    let api = Api::new(&url, None);
    let s = api.new_session(json!({ "task": task })).await;
    let index = format!("http://host.farm.internal:{port}");
    // 1. Dependencies, through the GET-only rule.
    let install = format!(
        "python3 -c \"import urllib.request as u; open('/tmp/pip.whl', 'wb').write(u.urlopen('{index}/packages/pip.whl').read())\" && \
         python3 /tmp/pip.whl/pip install -q --no-cache-dir --break-system-packages --trusted-host host.farm.internal --index-url {index}/simple/ farmtestpkg 2>&1 && echo installed"
    );
    assert!(run_in(&api, &s, &install).await.contains("installed"));
    // 2. The tests, red.
    let tests = "cd /workspace && python3 -m pytest -q -p no:cacheprovider test_shop.py 2>&1 | tail -1; true";
    assert!(run_in(&api, &s, tests).await.contains("2 failed"));
    // 3. The fix, committed on a branch.
    run_in(&api, &s, "cd /workspace && sed -i 's/sum(prices) - 1/sum(prices)/' shop.py && git init -q -b agent/fix && git add shop.py test_shop.py && git -c user.email=a@farm -c user.name=agent commit -q -m 'total: no off-by-one'").await;
    // 4. The night: paused, and the service killed.
    let paused = api.ok("POST", &format!("/v1/sessions/{s}/pause"), None, 200).await;
    assert_eq!(paused["state"], "paused", "{paused}");
    let mut serve = serve;
    serve.child.kill().unwrap();
    serve.child.wait().unwrap();
    let (mut serve, url) = start_service();
    let api = Api::new(&url, None);
    // 5. The morning: resumed where it was; the tests pass; the branch is pushed.
    assert_eq!(
        api.ok("POST", &format!("/v1/sessions/{s}/resume"), None, 200).await["state"],
        "live"
    );
    assert!(run_in(&api, &s, tests).await.contains("2 passed"));
    let push = |refspec: &str| format!("cd /workspace && git push {index}/repo.git {refspec} 2>&1; echo rc=$?");
    let pushed = run_in(&api, &s, &push("agent/fix:refs/heads/agent/fix")).await;
    assert!(pushed.trim_end().ends_with("rc=0"), "{pushed}");
    let refused = run_in(&api, &s, &push("+agent/fix:refs/heads/main")).await;
    assert!(
        !refused.trim_end().ends_with("rc=0") && refused.contains("403"),
        "{refused}"
    );
    assert_eq!(
        refs(git.path()).lines().collect::<Vec<_>>(),
        ["refs/heads/agent/fix", "refs/heads/main"]
    );
    // 6. Scored like any session.
    let verdict = api
        .ok("POST", &format!("/v1/sessions/{s}/submit"), Some(json!({})), 200)
        .await;
    assert_eq!(verdict["status"], "passed", "{verdict}");
    stop(&mut serve);
    assert_no_qemu_of(run_dir.path());
}

/// A paused session is removed `serve.paused_retention_secs` after its pause: its folder goes
/// and the task snapshot's pin with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_session_is_removed_after_its_retention() {
    let [out, run_dir] = temp_dirs();
    let service = suite_config(out.path(), "service.toml", "paused_retention_secs = 1\n");
    let (mut serve, url) = farm_serve(&service, &out.path().join("serve"), run_dir.path(), "127.0.0.1:0", None);
    let api = Api::new(&url, None);
    let s = api.new_session(json!({ "task_id": "double" })).await;
    api.ok("POST", &format!("/v1/sessions/{s}/pause"), None, 200).await;
    let started = Instant::now();
    while api.call("GET", &format!("/v1/sessions/{s}"), None).await.0 != 404 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the paused session was never removed"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The folder goes as the pause is dropped, a moment after the session stops answering.
    let started = Instant::now();
    loop {
        let left: Vec<_> = std::fs::read_dir(out.path().join("serve/paused")).unwrap().collect();
        if left.is_empty() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{left:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        serve
            .log()
            .contains("paused session removed after serve.paused_retention_secs"),
        "{}",
        serve.log()
    );
    stop(&mut serve);
}

/// Memory admission: past the reserve a session gets 503 with the figures (never a VM the
/// host cannot hold); `max_sessions = "auto"` follows memory; bad values are named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_pressure_refuses_sessions_with_503_and_the_figures() {
    let dir = tempfile::tempdir().unwrap();
    for (bad, named) in [
        ("memory_reserve_percent = 100", "serve.memory_reserve_percent"),
        ("max_sessions = 0", "serve.max_sessions"),
        ("ksm = \"maybe\"", "ksm"),
    ] {
        let config = suite_config(dir.path(), "bad.toml", &format!("{bad}\n"));
        let out = Command::new(env!("CARGO_BIN_EXE_farm"))
            .arg("serve")
            .arg(&config)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(named) && stderr.contains("bad.toml"), "{bad}: {stderr}");
    }
    // A reserve of 99 % of MemTotal: no host has that much available, so no VM is admitted.
    let config = suite_config(
        dir.path(),
        "serve.toml",
        "concurrency = 1\nwarm_pool = 0\nmemory_reserve_percent = 99\n",
    );
    let (out, run_dir) = (dir.path().join("out"), tempfile::tempdir().unwrap());
    let (mut serve, url) = farm_serve(&config, &out, run_dir.path(), "127.0.0.1:0", None);
    let api = Api::new(&url, None);
    let capacity = api.ok("GET", "/v1/capacity", None, 200).await;
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let total_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    let total = total_kib * 1024;
    assert_eq!(
        capacity["memory"]["reserve_mib"].as_u64(),
        Some((total / 100 * 99) >> 20),
        "{capacity}"
    );
    assert_eq!(capacity["memory"]["more_vms"], 0, "{capacity}");
    // auto: what memory past the reserve holds at 16 MiB a session (at least one).
    assert_eq!(
        capacity["max_sessions"].as_u64(),
        Some((((total - total / 100 * 99) >> 20) / 16).max(1)),
        "{capacity}"
    );
    let (status, headers, body) = api
        .send("POST", "/v1/sessions", Some(json!({ "task_id": "double" })), &[])
        .await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 503, "{v}");
    assert!(headers.contains_key("retry-after"));
    let message = v["error"].as_str().unwrap();
    for part in ["MiB available", "a VM costs about", "serve.memory_reserve_percent"] {
        assert!(message.contains(part), "{part}: {message}");
    }
    assert_eq!(
        api.ok("GET", "/v1/sessions", None, 200).await["sessions"]
            .as_array()
            .map(Vec::len),
        Some(0)
    );
    stop(&mut serve);
    assert_no_qemu_of(run_dir.path());
}
