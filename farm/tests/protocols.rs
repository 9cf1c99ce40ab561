//! `farm serve` reached in other tools' protocols, each through its own client from PyPI,
//! unmodified: OpenEnv (`openenv`, what TRL's trainers use) and MCP (`mcp`, the streamable
//! HTTP transport), and the GRPO-style example on OpenEnv. One service of
//! `configs/serve.toml` (the minimal image) with a bearer token serves them all.

mod common;
use common::assert_no_qemu_of;
use common::serve::{farm_serve, repo, stop, Api};
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

/// Waits (up to 10 minutes: not a timing claim) until no session is left.
async fn no_sessions_left(api: &Api) {
    let started = Instant::now();
    loop {
        let sessions = api.ok("GET", "/v1/sessions", None, 200).await;
        if sessions["sessions"].as_array().unwrap().is_empty() {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "sessions were left: {sessions}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openenv_and_mcp_clients_drive_sessions() {
    let (out, run_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut serve, url) = farm_serve(
        &repo().join("configs/serve.toml"),
        out.path(),
        run_dir.path(),
        "127.0.0.1:0",
        Some(TOKEN),
    );
    let api = Api::new(&url, Some(TOKEN));

    // OpenEnv: the generic client of `openenv` from PyPI.
    let check = python("openenv-venv", &["farm/tests/openenv_check.py", &url, TOKEN]);
    assert!(check.status.success(), "OpenEnv's client:\n{}", said(&check));
    eprintln!("{}", String::from_utf8_lossy(&check.stdout));
    let stdout = String::from_utf8_lossy(&check.stdout);
    let last: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    // The client that went away without submitting: its session ended, with no row.
    no_sessions_left(&api).await;
    let gone = last["disconnected"].as_str().unwrap();
    let (status, _) = api.call("GET", &format!("/v1/sessions/{gone}"), None).await;
    assert_eq!(status, 404, "the disconnected client's session is gone");

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

    // MCP: a session opened through the API, driven by `mcp`'s client.
    let opened = api
        .ok("POST", "/v1/sessions", Some(json!({ "task_id": "double" })), 201)
        .await;
    let session = opened["session_id"].as_str().unwrap().to_string();
    // A browser page of another site cannot drive it (MCP's Origin rule).
    let (status, _, body) = api
        .send(
            "POST",
            &format!("/v1/sessions/{session}/mcp"),
            Some(json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list" })),
            &[("Origin", "http://evil.example")],
        )
        .await;
    assert_eq!(status, 403, "{}", String::from_utf8_lossy(&body));
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

    let check = python("mcp-venv", &["farm/tests/mcp_check.py", &url, TOKEN, &session]);
    assert!(check.status.success(), "MCP's client:\n{}", said(&check));
    eprintln!("{}", String::from_utf8_lossy(&check.stdout));
    let stdout = String::from_utf8_lossy(&check.stdout);
    let rollout = stdout
        .lines()
        .find_map(|l| l.strip_prefix("rollout "))
        .unwrap()
        .to_string();
    // The verdict the agent was not told: the caller reads it.
    let row = api.ok("GET", &format!("/v1/rollouts/{rollout}"), None, 200).await;
    assert_eq!(row["row"]["status"], "passed", "{row}");
    assert_eq!(row["row"]["reward"], 1.0, "{row}");
    let steps = row["row"]["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 6, "each tool call is a step of the session: {row}");

    // The GRPO-style example: groups of sessions branched from one prepared state.
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
        .env("FARM_SERVE_TOKEN", TOKEN);
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
    no_sessions_left(&api).await;

    stop(&mut serve);
    assert_no_qemu_of(run_dir.path());
}
