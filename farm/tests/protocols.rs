//! `farm serve` reached in other tools' protocols, each through its own client from PyPI,
//! unmodified: OpenEnv (`openenv`, what TRL's trainers use) and MCP (`mcp`, the streamable
//! HTTP transport), and the GRPO-style example on OpenEnv. One service of
//! `configs/serve.toml` (the minimal image) with a bearer token serves them all.

mod common;
use common::serve::{repo, serve_suite, stop, tenant_key, Api};
use common::{assert_no_qemu_of, temp_dirs};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const TOKEN: &str = "protocols-token";

fn venv_python(name: &str) -> PathBuf {
    let cache = std::env::var_os("FARM_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/farm"));
    let python = cache.join(name).join("bin/python");
    assert!(python.exists(), "no {}: run scripts/setup.sh", python.display());
    python
}

fn said(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn python(venv: &str, args: &[&str]) -> Output {
    Command::new(venv_python(venv))
        .args(args)
        .current_dir(repo())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap()
}

/// Waits (up to `deadline`: not a timing claim) until no session is left.
async fn no_sessions_left(api: &Api, deadline: Duration) {
    let started = Instant::now();
    loop {
        let sessions = api.ok("GET", "/v1/sessions", None, 200).await;
        if sessions["sessions"].as_array().unwrap().is_empty() {
            return;
        }
        assert!(started.elapsed() < deadline, "sessions were left: {sessions}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openenv_and_mcp_clients_drive_sessions() {
    let [out, run_dir] = temp_dirs();
    let (mut serve, url) = serve_suite(out.path(), run_dir.path(), Some(TOKEN));
    let api = Api::new(&url, Some(TOKEN));
    let db = out.path().join("tenants.db");

    // OpenEnv: the generic client of `openenv` from PyPI.
    let check = python("openenv-venv", &["farm/tests/openenv_check.py", &url, TOKEN]);
    assert!(check.status.success(), "OpenEnv's client:\n{}", said(&check));
    eprintln!("{}", String::from_utf8_lossy(&check.stdout));
    let stdout = String::from_utf8_lossy(&check.stdout);
    let last: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    // The clients that went away without submitting: their sessions end, with no row; well
    // before the 600 s lease would have ended them (this wait is a deadline, not a timing).
    no_sessions_left(&api, Duration::from_secs(300)).await;
    for gone in last["left"].as_array().unwrap() {
        let (status, _) = api
            .call("GET", &format!("/v1/sessions/{}", gone.as_str().unwrap()), None)
            .await;
        assert_eq!(status, 404, "the disconnected client's session {gone} is gone");
    }

    // The socket's route refuses a plain GET, and a foreign Origin before anything else.
    let (status, v) = api.call("GET", "/v1/openenv/ws", None).await;
    assert!(
        (400..500).contains(&status) && v["error"].as_str().unwrap().contains("WebSocket"),
        "{status} {v}"
    );
    let (status, _, _) = api
        .send("GET", "/v1/openenv/ws", None, &[("Origin", "http://evil.example")])
        .await;
    assert_eq!(status, 403);

    // A browser page cannot reach the service but by its address, from a page it serves:
    // another site's Origin, or a rebinding name as both Origin and Host, is 403 on every route.
    let port = url.rsplit(':').next().unwrap().to_string();
    let evil_host = format!("evil.example:{port}");
    let evil_origin = format!("http://{evil_host}");
    for (path, headers) in [
        ("/v1/sessions", vec![("Origin", "http://evil.example")]),
        (
            "/v1/sessions",
            vec![("Origin", evil_origin.as_str()), ("Host", evil_host.as_str())],
        ),
    ] {
        let (status, _, body) = api
            .send("POST", path, Some(json!({ "task_id": "double" })), &headers)
            .await;
        assert_eq!(status, 403, "{path} {headers:?}: {}", String::from_utf8_lossy(&body));
    }
    let own_origin = url.clone();
    let (status, _, _) = api
        .send("GET", "/v1/capacity", None, &[("Origin", own_origin.as_str())])
        .await;
    assert_eq!(status, 200, "a page the service serves, at its address, may call it");

    // A caller that hangs up under a call does not cancel it: the command still runs to its
    // end and is a recorded step (else the guest would go on running something unjournaled).
    let hung = api.new_session(json!({ "task_id": "double" })).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let gave_up = impatient
        .post(format!("{url}/v1/sessions/{hung}/exec"))
        .bearer_auth(TOKEN)
        .json(&json!({ "command": "sleep 8; echo done > hung.txt" }))
        .send()
        .await;
    assert!(gave_up.is_err(), "the client was meant to give up first");
    let started = Instant::now();
    loop {
        let described = api.ok("GET", &format!("/v1/sessions/{hung}"), None, 200).await;
        if described["steps"] == 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the hung-up call was not recorded: {described}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = api.session_exec(&hung, "cat hung.txt").await;
    assert_eq!(out["step"]["stdout"].as_str().unwrap().trim(), "done", "{out}");
    api.ok("DELETE", &format!("/v1/sessions/{hung}"), None, 200).await;

    // MCP: a session opened through the API; the agent gets the session's own MCP token.
    let opened = api
        .ok("POST", "/v1/sessions", Some(json!({ "task_id": "double" })), 201)
        .await;
    let session = opened["session_id"].as_str().unwrap().to_string();
    let rollout = opened["rollout_id"].as_str().unwrap().to_string();
    assert_eq!(opened["mcp"]["path"], format!("/v1/sessions/{session}/mcp"), "{opened}");
    let mcp_token = opened["mcp"]["token"].as_str().unwrap().to_string();
    let other = api
        .ok("POST", "/v1/sessions", Some(json!({ "task_id": "double" })), 201)
        .await;
    let other_id = other["session_id"].as_str().unwrap().to_string();
    // That token opens that session's MCP endpoint and nothing else: not the API (its verdict,
    // a branch, the other sessions), not another session's endpoint.
    let agent = Api::new(&url, Some(&mcp_token));
    let list = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list" });
    for (method, path, body) in [
        ("GET", format!("/v1/rollouts/{rollout}"), None),
        ("GET", "/v1/sessions".to_string(), None),
        ("POST", format!("/v1/sessions/{session}/branch"), None),
        (
            "POST",
            format!("/v1/sessions/{session}/exec"),
            Some(json!({ "command": "true" })),
        ),
        ("POST", format!("/v1/sessions/{other_id}/mcp"), Some(list.clone())),
    ] {
        let (status, v) = agent.call(method, &path, body).await;
        assert_eq!(status, 401, "the MCP token opened {method} {path}: {v}");
    }
    let (status, v) = agent
        .call("POST", &format!("/v1/sessions/{session}/mcp"), Some(list))
        .await;
    assert_eq!(status, 200, "{v}");
    api.ok("DELETE", &format!("/v1/sessions/{other_id}"), None, 200).await;
    // A notification is accepted and answered with nothing; GET has no stream.
    let (status, _, body) = api
        .send(
            "POST",
            &format!("/v1/sessions/{session}/mcp"),
            Some(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" })),
            &[],
        )
        .await;
    assert_eq!((status, body.len()), (202, 0));
    let (status, _) = api.call("GET", &format!("/v1/sessions/{session}/mcp"), None).await;
    assert_eq!(status, 405);
    let (status, v) = api
        .call(
            "POST",
            "/v1/sessions/s-nope/mcp",
            Some(json!({ "jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {} })),
        )
        .await;
    assert_eq!(
        (status, &v["id"], &v["error"]["code"]),
        (404, &json!(7), &json!(-32600)),
        "{v}"
    );

    let check = python("mcp-venv", &["farm/tests/mcp_check.py", &url, &mcp_token, &session]);
    assert!(check.status.success(), "MCP's client:\n{}", said(&check));
    eprintln!("{}", String::from_utf8_lossy(&check.stdout));
    // The verdict the agent was not told: the caller reads it.
    let row = api.ok("GET", &format!("/v1/rollouts/{rollout}"), None, 200).await;
    assert_eq!(row["row"]["status"], "passed", "{row}");
    assert_eq!(row["row"]["reward"], 1.0, "{row}");
    let steps = row["row"]["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 8, "each tool call is a step of the session: {row}");

    // The GRPO-style example: groups of sessions branched from one prepared state, and the
    // MCP client again, as a tenant (docs/tenants.md): a tenant's key works where the token did.
    let key = tenant_key(&db, "trainer", &[]);
    let tenant = Api::new(&url, Some(&key));
    let opened = tenant
        .ok("POST", "/v1/sessions", Some(json!({ "task_id": "double" })), 201)
        .await;
    let (session, token) = (
        opened["session_id"].as_str().unwrap(),
        opened["mcp"]["token"].as_str().unwrap(),
    );
    assert_eq!(
        api.call("GET", &format!("/v1/sessions/{session}"), None).await.0,
        404,
        "not the operator's"
    );
    let check = python("mcp-venv", &["farm/tests/mcp_check.py", &url, token, session]);
    assert!(
        check.status.success(),
        "MCP's client with a tenant's session token:\n{}",
        said(&check)
    );
    let mut example = Command::new(venv_python("openenv-venv"));
    example
        .args([
            "examples/grpo_openenv.py",
            "--url",
            &url,
            "--groups",
            "2",
            "--group-size",
            "4",
        ])
        .current_dir(repo())
        .env("FARM_SERVE_TOKEN", &key);
    let ran = example.output().unwrap();
    assert!(ran.status.success(), "examples/grpo_openenv.py:\n{}", said(&ran));
    eprintln!("{}", String::from_utf8_lossy(&ran.stderr));
    let result: Value = serde_json::from_str(String::from_utf8_lossy(&ran.stdout).lines().last().unwrap()).unwrap();
    for group in result["groups"].as_array().unwrap() {
        assert_eq!(group["rewards"], json!([1.0, 0.0, 0.0, 1.0]), "{result}");
        assert_eq!(group["mean"], 0.5, "{result}");
        let advantages: Vec<f64> = group["advantages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_f64().unwrap())
            .collect();
        assert!(advantages[0] > 0.9 && advantages[1] < -0.9, "{result}");
    }
    no_sessions_left(&api, Duration::from_secs(300)).await;
    no_sessions_left(&tenant, Duration::from_secs(300)).await;

    stop(&mut serve);
    assert_no_qemu_of(run_dir.path());
}
