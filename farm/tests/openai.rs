//! The `openai` policy against a local chat-completions server that the test runs: tool
//! calls drive the rollout, a 429 is retried, the API key comes from the environment, and
//! messages, token usage and logprobs land in the trajectory.

mod common;
use common::{farm_run, journal_rows, text};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

/// (authorization header, request body) of each request the server received.
type Seen = Arc<Mutex<Vec<(String, serde_json::Value)>>>;

/// Answers each request with the next scripted (status, body); records the requests.
fn serve(script: Vec<(u16, serde_json::Value)>) -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        let mut script = script.into_iter();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut length = 0usize;
            let mut auth = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                if lower.starts_with("authorization:") {
                    auth = line.trim().to_string();
                }
            }
            let mut body = vec![0u8; length];
            reader.read_exact(&mut body).unwrap();
            log.lock()
                .unwrap()
                .push((auth, serde_json::from_slice(&body).unwrap_or_default()));
            let (status, reply) = script
                .next()
                .unwrap_or((500, serde_json::json!({"error": "script exhausted"})));
            let text = reply.to_string();
            let reason = if status == 200 { "OK" } else { "Error" };
            let extra = if status == 429 { "Retry-After: 0\r\n" } else { "" };
            let _ = write!(stream, "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{text}", text.len());
        }
    });
    (url, seen)
}

fn tool_call(id: &str, name: &str, args: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "id": "chatcmpl-test",
        "choices": [{
            "index": 0,
            "finish_reason": "tool_calls",
            "token_ids": [42, 43],
            "logprobs": { "content": [ { "token": "x", "logprob": -0.25, "top_logprobs": [] } ] },
            "message": { "role": "assistant", "content": null, "tool_calls": [
                { "id": id, "type": "function", "function": { "name": name, "arguments": args.to_string() } } ] }
        }],
        "usage": { "prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110 },
        "prompt_token_ids": [1, 2, 3]
    })
}

#[test]
fn tool_calls_drive_a_rollout_to_a_pass_and_everything_is_recorded() {
    let (url, seen) = serve(vec![
        (429, serde_json::json!({ "error": { "message": "slow down" } })),
        (
            200,
            tool_call("c1", "run_shell", serde_json::json!({ "command": "cat solution.py" })),
        ),
        (
            200,
            tool_call(
                "c2",
                "write_file",
                serde_json::json!({ "path": "solution.py", "content": "def add(a: int, b: int) -> int:\n    return a + b\n" }),
            ),
        ),
        (200, tool_call("c3", "submit", serde_json::json!({ "answer": "done" }))),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dataset = repo.join("configs/data/humaneval-sample.jsonl");
    let suite = dir.path().join("suite.toml");
    std::fs::write(
        &suite,
        format!(
            "[suite]\nname = \"openai-test\"\n[template]\nimage = \"python\"\n[dataset]\npath = \"{}\"\nformat = \"humaneval\"\ntasks = [\"farm/add\"]\n\
             [policy]\nkind = \"openai\"\nbase_url = \"{url}\"\nmodel = \"test-model\"\napi_key_env = \"FARM_TEST_KEY\"\ntemperature = 0.5\nlogprobs = true\nmax_retries = 3\n\
             [rollouts]\nretries = 0\n[scoring]\ntimeout_secs = 300\n[output]\ndir = \"out\"\n",
            dataset.display()
        ),
    )
    .unwrap();
    let mut farm = Command::new(env!("CARGO_BIN_EXE_farm"));
    farm.env("FARM_TEST_KEY", "sekret");
    let text = text(&farm_run(farm, &suite));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("out/summary.json")).unwrap()).unwrap();
    assert_eq!(summary["counts"]["passed"], 1, "{summary}\n{text}");

    let row = &journal_rows(&dir.path().join("out"))[0];
    assert_eq!(row["policy_name"], "openai");
    assert_eq!(
        row["usage"]["total_tokens"], 330,
        "usage summed over the three answered requests"
    );
    let steps = row["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3);
    assert!(
        steps[0]["stdout"].as_str().unwrap().contains("def add"),
        "the prompt file was read: {}",
        steps[0]
    );
    let messages: serde_json::Value = serde_json::from_str(row["messages"].as_str().unwrap()).unwrap();
    let messages = messages.as_array().unwrap();
    assert_eq!(messages[0]["role"], "system");
    assert!(messages.iter().any(|m| m["role"] == "tool"
        && m["tool_call_id"] == "c1"
        && m["content"].as_str().unwrap().contains("exit code: 0")));
    assert!(
        messages.iter().any(|m| m["logprobs"]["content"][0]["logprob"] == -0.25),
        "logprobs recorded"
    );
    assert!(
        messages
            .iter()
            .any(|m| m["token_ids"] == serde_json::json!([42, 43])
                && m["prompt_token_ids"] == serde_json::json!([1, 2, 3])),
        "token ids recorded"
    );

    let requests = seen.lock().unwrap();
    assert_eq!(requests.len(), 4, "one 429 retried, then three answered requests");
    assert!(
        requests
            .iter()
            .all(|(auth, _)| auth == "authorization: Bearer sekret" || auth == "Authorization: Bearer sekret"),
        "{:?}",
        requests.iter().map(|r| &r.0).collect::<Vec<_>>()
    );
    let first = &requests[1].1;
    assert_eq!(first["model"], "test-model");
    assert_eq!(first["temperature"], 0.5);
    assert_eq!(first["logprobs"], true);
    assert_eq!(first["tools"].as_array().unwrap().len(), 3);
    // Recorded extras (logprobs) are not sent back to the endpoint.
    assert!(requests[3].1["messages"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m.get("logprobs").is_none() && m.get("token_ids").is_none()));
}

#[test]
fn a_failing_endpoint_is_an_environment_error_not_a_model_failure() {
    let (url, _) = serve(vec![
        (500, serde_json::json!({"error": "boom"})),
        (500, serde_json::json!({"error": "boom"})),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let suite = dir.path().join("suite.toml");
    std::fs::write(
        &suite,
        format!(
            "[suite]\nname = \"openai-down\"\n[template]\nimage = \"python\"\n[dataset]\npath = \"{}\"\nformat = \"humaneval\"\ntasks = [\"farm/add\"]\n\
             [policy]\nkind = \"openai\"\nbase_url = \"{url}\"\nmodel = \"m\"\nmax_retries = 1\n[rollouts]\nretries = 0\n[scoring]\ntimeout_secs = 300\n[output]\ndir = \"out\"\n",
            repo.join("configs/data/humaneval-sample.jsonl").display()
        ),
    )
    .unwrap();
    farm_run(Command::new(env!("CARGO_BIN_EXE_farm")), &suite);
    let row = &journal_rows(&dir.path().join("out"))[0];
    assert_eq!(row["status"], "env_error");
    assert!(row["reward"].is_null());
    assert!(row["error"].as_str().unwrap().contains("500"), "{row}");
}
