//! Round five's holes, attacked against real guests (the minimal image), by another tenant
//! and by a client of the same tenant:
//! - a body with bytes after its JSON, or a key given twice, is refused on every front door
//!   (it used to pass the tenancy checks unread and reach the handler: another tenant's
//!   snapshot, network, build context, quotas and `force`);
//! - a request cut by a reset or a pause ends with a 409 saying so, and the sandbox lives
//!   (it used to be taken for a dead VM, and the sandbox removed);
//! - input a program does not read is refused to its writer, and the sandbox lives;
//! - streams, terminals and sockets count against the tenant's `connections`, and end when
//!   their key is revoked; ids are 128 random bits.

mod common;
use common::assert_no_qemu_of;
use common::serve::{farm_serve, farm_tenant, new_key, socket, sse_event, stop, suite_config, Api, Socket};
use common::tar_of;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

/// Bytes a careless or hostile client puts after its JSON.
const TAILS: &[&str] = &[" x", "\n{}", " 1", "{\"environment\":\"e\"}"];

/// The service: A's `net-a`, B's `net-b`, and A's `open-a` (reaching the test's upstream on
/// `upstream`) that a live sandbox may be tightened to `shut-a` (reaching nothing of it).
fn service_file(dir: &Path, upstream: u16) -> std::path::PathBuf {
    suite_config(
        dir,
        "holes.toml",
        &format!(
            "concurrency = 1\nmax_sessions = 8\n[serve.sandboxes]\n\
             [serve.sandboxes.networks.net-a]\nallow = [\"127.0.0.1:9\"]\n\
             [serve.sandboxes.networks.net-b]\nallow = [\"127.0.0.1:9\"]\n\
             [serve.sandboxes.networks.open-a]\nallow = [\"127.0.0.1:{upstream}\"]\n\
             [serve.sandboxes.networks.shut-a]\nallow = [\"127.0.0.1:9\"]\n\
             [serve.sandboxes.tighten]\nopen-a = [\"shut-a\"]\n"
        ),
    )
}

/// A TCP server on the host's loopback that keeps every connection open until its client
/// ends it: its port, and the news of each connection (`accepted`, then `ended`).
fn upstream() -> (u16, std::sync::mpsc::Receiver<&'static str>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (news, heard) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let news = news.clone();
            std::thread::spawn(move || {
                use std::io::Read;
                let _ = news.send("accepted");
                let mut stream = stream;
                let mut buf = [0u8; 4096];
                while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
                let _ = news.send("ended");
            });
        }
    });
    (port, heard)
}

/// Waits up to a minute for `what` from the upstream.
fn heard(news: &std::sync::mpsc::Receiver<&'static str>, what: &str) {
    match news.recv_timeout(Duration::from_secs(60)) {
        Ok(got) => assert_eq!(got, what),
        Err(e) => panic!("the upstream never said {what}: {e}"),
    }
}

/// A request whose body is `text` as it is: (status, answer).
async fn raw(api: &Api, method: &str, path: &str, text: &str) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let response = api
        .http
        .request(method, format!("{}{path}", api.url))
        .bearer_auth(api.token.as_ref().unwrap())
        .header("content-type", "application/json")
        .body(text.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let bytes = response.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or_else(|_| json!({ "raw": String::from_utf8_lossy(&bytes) })),
    )
}

/// An answer of server-sent events, read as they come.
struct Events {
    response: reqwest::Response,
    buffer: String,
}

impl Events {
    async fn open(api: &Api, method: &str, path: &str, body: Option<Value>) -> Result<Events, (u16, Value)> {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = api
            .http
            .request(method, format!("{}{path}", api.url))
            .bearer_auth(api.token.as_ref().unwrap());
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        if status != 200 {
            return Err((status, response.json().await.unwrap_or(Value::Null)));
        }
        Ok(Events {
            response,
            buffer: String::new(),
        })
    }

    /// The next event (name, data), or None when the stream ended.
    async fn next(&mut self) -> Option<(String, Value)> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let Some((name, data)) = sse_event(&block) else {
                    continue; // a keep-alive comment
                };
                return Some((name, serde_json::from_str(&data).unwrap_or(Value::String(data))));
            }
            let chunk = tokio::time::timeout(Duration::from_secs(120), self.response.chunk())
                .await
                .expect("the stream went quiet for two minutes")
                .ok()??;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// Events until one named `name` (which it returns); fails the test if the stream ends.
    async fn until(&mut self, name: &str) -> Value {
        loop {
            let (got, data) = self
                .next()
                .await
                .unwrap_or_else(|| panic!("the stream ended before {name}"));
            if got == name {
                return data;
            }
        }
    }
}

/// Text messages of a socket until one contains `text` (returned); fails if it closes first.
async fn text_until(socket: &mut Socket, text: &str) -> String {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(240), socket.next())
            .await
            .unwrap_or_else(|_| panic!("no message with {text:?} in four minutes"))
            .unwrap_or_else(|| panic!("the socket closed before {text:?}"))
            .unwrap();
        if let Message::Text(t) = message {
            if t.contains(text) {
                return t.to_string();
            }
        }
    }
}

/// A terminal of `sandbox` running `sleep 600` (which never reads its input), once started.
async fn sleeping_terminal(url: &str, sandbox: &str, key: &str) -> Socket {
    let mut terminal = socket(url, &format!("/v1/sandboxes/{sandbox}/pty?command=sleep%20600"), key).await;
    text_until(&mut terminal, "started").await;
    terminal
}

/// Whether a socket closes (or ends) within a minute.
async fn closes(socket: &mut Socket) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let next = tokio::time::timeout(Duration::from_secs(5), socket.next()).await;
        if let Ok(None | Some(Err(_)) | Some(Ok(Message::Close(_)))) = next {
            return true;
        }
    }
    false
}

/// A's things: an environment both tenants asked for, A's private snapshot of a sandbox
/// holding a secret, A's sandbox, A's build context.
struct Owned {
    env: String,
    private_env: String,
    sandbox: String,
    context: String,
}

async fn make_as_a(a: &Api, b: &Api) -> Owned {
    let env = a.environment("minimal").await;
    assert_eq!(
        b.environment("minimal").await,
        env,
        "content-addressed: B asked for it too"
    );
    let sandbox = a.new_sandbox(json!({ "environment": env })).await;
    a.sh_prints(&sandbox, "echo a-secret > /root/secret; echo ok", "ok")
        .await;
    let private_env = a
        .ok("POST", &format!("/v1/sandboxes/{sandbox}/snapshot"), None, 201)
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let uploaded = a
        .http
        .post(format!("{}/v1/contexts", a.url))
        .bearer_auth(a.token.as_ref().unwrap())
        .body(tar_of(&[(
            "Dockerfile",
            "FROM farm:minimal\nRUN echo a > /a-context\n",
        )]))
        .send()
        .await
        .unwrap();
    assert_eq!(uploaded.status().as_u16(), 201);
    let context = uploaded.json::<Value>().await.unwrap()["context"]
        .as_str()
        .unwrap()
        .to_string();
    Owned {
        env,
        private_env,
        sandbox,
        context,
    }
}

fn refused_as_trailing(status: u16, answer: &Value, what: &str) {
    assert_eq!(status, 400, "{what}: {answer}");
    let error = answer["error"].as_str().unwrap_or_default();
    assert!(error.contains("after the JSON value"), "{what}: {answer}");
}

/// B sends A's ids, A's network and past its quotas with bytes after the JSON, or with a
/// key twice: every one is a 400, and nothing was made.
async fn bodies_are_read_once(db: &Path, a: &Api, b: &Api, owned: &Owned) {
    let bodies = [
        ("/v1/sandboxes", json!({ "environment": owned.private_env })),
        ("/v1/sandboxes", json!({ "environment": owned.env, "network": "net-a" })),
        (
            "/v1/environments",
            json!({ "dockerfile": { "context": owned.context } }),
        ),
        ("/v1/environments", json!({ "image": "minimal", "force": true })),
    ];
    for (path, body) in &bodies {
        for tail in TAILS {
            let (status, answer) = raw(b, "POST", path, &format!("{body}{tail}")).await;
            refused_as_trailing(status, &answer, &format!("B: {path} {body}{tail:?}"));
        }
    }
    // A key twice: the checks and the handler could each take another.
    let twice = format!(
        "{{\"environment\": {:?}, \"environment\": {:?}}}",
        owned.env, owned.private_env
    );
    let (status, answer) = raw(b, "POST", "/v1/sandboxes", &twice).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("given twice"), "{answer}");
    let nested = format!(
        "{{\"environment\": {:?}, \"env\": {{\"A\": \"1\", \"A\": \"2\"}}}}",
        owned.env
    );
    let (status, answer) = raw(b, "POST", "/v1/sandboxes", &nested).await;
    assert_eq!((status, answer["field"].as_str()), (400, Some("env")), "{answer}");
    // Quotas: B's one live sandbox, then creates and branches past it.
    farm_tenant(db, &["quota", "set", "b", "live", "1"]);
    tokio::time::sleep(Duration::from_millis(1200)).await; // quotas are read every second
    let mine = b.new_sandbox(json!({ "environment": owned.env })).await;
    let body = json!({ "environment": owned.env });
    for tail in TAILS {
        let (status, answer) = raw(b, "POST", "/v1/sandboxes", &format!("{body}{tail}")).await;
        refused_as_trailing(status, &answer, &format!("create past the quota{tail:?}"));
        let branch = format!("/v1/sandboxes/{mine}/branch");
        let (status, answer) = raw(b, "POST", &branch, &format!("{}{tail}", json!({ "count": 3 }))).await;
        refused_as_trailing(status, &answer, &format!("branch past the quota{tail:?}"));
    }
    let (status, answer) = raw(
        b,
        "POST",
        &format!("/v1/sandboxes/{mine}/branch"),
        "{\"count\":1,\"count\":3}",
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    let listed = b.ok("GET", "/v1/sandboxes", None, 200).await;
    assert_eq!(
        listed["sandboxes"].as_array().unwrap().len(),
        1,
        "nothing more was made: {listed}"
    );
    b.ok("DELETE", &format!("/v1/sandboxes/{mine}"), None, 200).await;
    farm_tenant(db, &["quota", "set", "b", "live", "none"]);
    // A client of A's own: any body, any route.
    for (path, body) in [
        ("/v1/sandboxes".to_string(), json!({ "environment": owned.env })),
        (
            format!("/v1/sandboxes/{}/exec", owned.sandbox),
            json!({ "command": "true" }),
        ),
        (
            format!("/v1/sandboxes/{}/timeout", owned.sandbox),
            json!({ "idle_timeout_secs": 60 }),
        ),
        ("/v1/sessions".to_string(), json!({ "task_id": "answer" })),
    ] {
        let (status, answer) = raw(a, "POST", &path, &format!("{body} x")).await;
        refused_as_trailing(status, &answer, &format!("A: {path}"));
    }
    // A's environment was not rebuilt, and its snapshot holds its secret alone.
    let view = a.ok("GET", &format!("/v1/environments/{}", owned.env), None, 200).await;
    assert_eq!(view["state"], "ready", "{view}");
}

/// MCP's and OpenEnv's messages are read as strictly.
async fn protocols_read_once(url: &str, a: &Api, a_key: &str) {
    let session = a
        .ok("POST", "/v1/sessions", Some(json!({ "task_id": "answer" })), 201)
        .await["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let list = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list" });
    for text in [
        format!("{list} x"),
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"method\":\"tools/call\"}".to_string(),
    ] {
        let (status, answer) = raw(a, "POST", &format!("/v1/sessions/{session}/mcp"), &text).await;
        assert_eq!(
            (status, answer["error"]["code"].as_i64()),
            (400, Some(-32700)),
            "{text}: {answer}"
        );
    }
    let mut ws = socket(url, "/v1/openenv/ws", a_key).await;
    for text in ["{\"type\":\"state\"} x", "{\"type\":\"state\",\"type\":\"close\"}"] {
        ws.send(Message::text(text)).await.unwrap();
        let reply = text_until(&mut ws, "\"type\"").await;
        assert!(reply.contains("INVALID_JSON"), "{text}: {reply}");
    }
    a.ok("DELETE", &format!("/v1/sessions/{session}"), None, 200).await;
}

/// Runs `command` in the sandbox in a task of its own, and waits until it has started
/// (it touches `/tmp/started`, removed first): its answer, when it comes.
async fn in_flight(api: &Api, sandbox: &str, command: &str) -> tokio::task::JoinHandle<(u16, Value)> {
    api.run_sh(sandbox, "rm -f /tmp/started").await;
    let client = Api::new(&api.url, api.token.as_deref());
    let (path, body) = (
        format!("/v1/sandboxes/{sandbox}/exec"),
        json!({ "command": format!("touch /tmp/started; {command}") }),
    );
    let task = tokio::spawn(async move { client.call("POST", &path, Some(body)).await });
    let started = Instant::now();
    let stat = format!("/v1/sandboxes/{sandbox}/stat?path=/tmp/started");
    while api.call("GET", &stat, None).await.0 != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the command never started"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    task
}

/// A's requests in flight while A's other client resets or pauses the sandbox: each ends
/// with a 409 naming what cut it, and the sandbox lives, in its new state.
async fn a_change_is_not_a_death(url: &str, a: &Api, a_key: &str, env: &str) {
    let sandbox = a.new_sandbox(json!({ "environment": env })).await;
    // An exec, cut by a reset.
    let exec = in_flight(a, &sandbox, "sleep 60").await;
    let reset = a.ok("POST", &format!("/v1/sandboxes/{sandbox}/reset"), None, 200).await;
    let (status, cut) = exec.await.unwrap();
    assert_eq!(status, 409, "{cut}");
    assert!(cut["error"].as_str().unwrap().contains("was reset"), "{cut}");
    let view = a.ok("GET", &format!("/v1/sandboxes/{sandbox}"), None, 200).await;
    assert_eq!(view["state"], "running", "reset answered {reset}, then {view}");
    a.sh_prints(&sandbox, "echo alive", "alive").await;
    // An output stream and a terminal, cut by a reset.
    let started = a
        .start_process(&sandbox, "while true; do echo tick; sleep 1; done")
        .await;
    let pid = started["pid"].as_u64().unwrap();
    let mut stream = Events::open(
        a,
        "GET",
        &format!("/v1/sandboxes/{sandbox}/processes/{pid}/output/stream"),
        None,
    )
    .await
    .unwrap();
    stream.until("stdout").await;
    let mut terminal = sleeping_terminal(url, &sandbox, a_key).await;
    a.ok("POST", &format!("/v1/sandboxes/{sandbox}/reset"), None, 200).await;
    let error = stream.until("error").await;
    assert!(error.to_string().contains("was reset"), "{error}");
    let said = text_until(&mut terminal, "error").await;
    assert!(said.contains("was reset"), "{said}");
    let view = a.ok("GET", &format!("/v1/sandboxes/{sandbox}"), None, 200).await;
    assert_eq!(view["state"], "running", "{view}");
    // An exec, cut by a pause: the sandbox is paused, with its state, and resumes.
    a.run_sh(&sandbox, "echo kept > /root/state").await;
    let exec = in_flight(a, &sandbox, "sleep 60").await;
    a.ok("POST", &format!("/v1/sandboxes/{sandbox}/pause"), None, 200).await;
    let (status, cut) = exec.await.unwrap();
    assert_eq!(status, 409, "{cut}");
    assert!(cut["error"].as_str().unwrap().contains("was paused"), "{cut}");
    let view = a.ok("GET", &format!("/v1/sandboxes/{sandbox}"), None, 200).await;
    assert_eq!(view["state"], "paused", "{view}");
    a.ok("POST", &format!("/v1/sandboxes/{sandbox}/resume"), None, 200)
        .await;
    a.sh_prints(&sandbox, "cat /root/state", "kept").await;
    a.ok("DELETE", &format!("/v1/sandboxes/{sandbox}"), None, 200).await;
}

/// Input a program does not read: a 1 MiB write to a process that never reads its stdin,
/// and a flood of keys to a terminal whose program never reads. Each writer is told what was
/// not taken; the sandbox answers on.
async fn unread_input_is_refused_not_fatal(url: &str, a: &Api, a_key: &str, env: &str) {
    let sandbox = a.new_sandbox(json!({ "environment": env })).await;
    let started = a.start_process(&sandbox, "sleep 600").await;
    let pid = started["pid"].as_u64().unwrap();
    let mega = "x".repeat(1 << 20);
    let (status, refused) = a
        .call(
            "POST",
            &format!("/v1/sandboxes/{sandbox}/processes/{pid}/stdin"),
            Some(json!({ "data": mega })),
        )
        .await;
    assert_eq!((status, refused["field"].as_str()), (409, Some("data")), "{refused}");
    assert!(refused["error"].as_str().unwrap().contains("not reading"), "{refused}");
    a.sh_prints(&sandbox, "echo alive", "alive").await;
    let process = a
        .ok("GET", &format!("/v1/sandboxes/{sandbox}/processes/{pid}"), None, 200)
        .await;
    assert_eq!(process["state"], "running", "{process}");
    // A terminal: whole lines of keys past what its buffers hold (a line discipline drops
    // the rest of an unfinished line, but keeps whole ones for the reader), to a program that
    // never reads them.
    let mut terminal = sleeping_terminal(url, &sandbox, a_key).await;
    let lines = format!("{}\n", "k".repeat(63)).repeat(1024);
    for _ in 0..4 {
        terminal
            .send(Message::Binary(lines.clone().into_bytes().into()))
            .await
            .unwrap();
    }
    let said = text_until(&mut terminal, "not delivered").await;
    assert!(said.contains("\"error\""), "{said}");
    a.sh_prints(&sandbox, "echo still", "still").await;
    a.ok("GET", &format!("/v1/sandboxes/{sandbox}"), None, 200).await;
    a.ok("DELETE", &format!("/v1/sandboxes/{sandbox}"), None, 200).await;
}

/// A sandbox of B's with a chatty background process: (its id, the process's output stream).
async fn chatty(b: &Api, env: &str) -> (String, String) {
    let sandbox = b.new_sandbox(json!({ "environment": env })).await;
    let id = sandbox.strip_prefix("sb-").unwrap();
    assert!(
        id.len() == 32 && id.bytes().all(|c| c.is_ascii_hexdigit()),
        "128 random bits: {sandbox}"
    );
    let started = b
        .start_process(&sandbox, "while true; do echo tick; sleep 1; done")
        .await;
    let follow = format!(
        "/v1/sandboxes/{sandbox}/processes/{}/output/stream",
        started["pid"].as_u64().unwrap()
    );
    (sandbox, follow)
}

/// B's connections: at most its `connections` quota at once.
async fn connections_are_bounded(db: &Path, b: &Api, env: &str) {
    let (sandbox, follow) = chatty(b, env).await;
    farm_tenant(db, &["quota", "set", "b", "connections", "2"]);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let first = Events::open(b, "GET", &follow, None).await.unwrap();
    let _second = Events::open(b, "GET", &follow, None).await.unwrap();
    let (status, over) = Events::open(b, "GET", &follow, None).await.err().unwrap();
    assert_eq!(status, 429, "{over}");
    assert_eq!(over["quota"]["name"], "connections", "{over}");
    let (status, _) = b
        .call(
            "POST",
            &format!("/v1/sandboxes/{sandbox}/exec/stream"),
            Some(json!({ "command": "true" })),
        )
        .await;
    assert_eq!(status, 429, "an exec's stream counts too");
    // A connection through one of B's ports is B's too, whoever holds the port's token.
    let port = b
        .ok(
            "POST",
            &format!("/v1/sandboxes/{sandbox}/ports"),
            Some(json!({ "port": 8000 })),
            201,
        )
        .await;
    let through = reqwest::Client::new()
        .get(format!("http://{}/", port["address"].as_str().unwrap()))
        .header("Farm-Port-Token", port["token"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(through.status().as_u16(), 429, "{:?}", through.text().await);
    drop(first);
    // The service notices the dropped stream at its next write (output comes every second).
    let started_at = Instant::now();
    let third = loop {
        match Events::open(b, "GET", &follow, None).await {
            Ok(events) => break events,
            Err((429, _)) if started_at.elapsed() < Duration::from_secs(60) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("a closed stream's place was never given back: {e:?}"),
        }
    };
    drop((third, _second));
    farm_tenant(db, &["quota", "set", "b", "connections", "none"]);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    b.ok("DELETE", &format!("/v1/sandboxes/{sandbox}"), None, 200).await;
}

/// A key revoked while its output stream, its exec's stream, its terminal and its OpenEnv
/// socket are open: each ends, saying why.
async fn connections_end_with_their_key(db: &Path, url: &str, b: &Api, env: &str) {
    let (sandbox, follow) = chatty(b, env).await;
    let (key, key_id) = new_key(db, "b", &[]);
    let spare = Api::new(url, Some(&key));
    let mut stream = Events::open(&spare, "GET", &follow, None).await.unwrap();
    stream.until("stdout").await;
    let mut exec = Events::open(
        &spare,
        "POST",
        &format!("/v1/sandboxes/{sandbox}/exec/stream"),
        Some(json!({ "command": "while true; do echo tock; sleep 1; done" })),
    )
    .await
    .unwrap();
    exec.until("stdout").await;
    let mut terminal = sleeping_terminal(url, &sandbox, &key).await;
    let mut openenv = socket(url, "/v1/openenv/ws", &key).await;
    farm_tenant(db, &["key", "revoke", &key_id]);
    for events in [&mut stream, &mut exec] {
        let error = events.until("error").await;
        assert!(error.to_string().contains("revoked"), "{error}");
        assert!(events.next().await.is_none(), "the stream ends");
    }
    let said = text_until(&mut terminal, "revoked").await;
    assert!(said.contains("\"error\""), "{said}");
    assert!(closes(&mut terminal).await, "the terminal's socket closes");
    let said = text_until(&mut openenv, "revoked").await;
    assert!(said.contains("error"), "{said}");
    assert!(closes(&mut openenv).await, "the OpenEnv socket closes");
    b.ok("DELETE", &format!("/v1/sandboxes/{sandbox}"), None, 200).await;
}

/// A live sandbox's egress only tightens: A's sandbox on `open-a` holds a tunnel to the
/// upstream; moved to `shut-a`, the tunnel is cut at once and a new request is refused by the
/// proxy; a branch of it has `shut-a` too. Back to `open-a`, from no network to any, or to a
/// policy not listed after its own: refused. B cannot move A's sandbox (404 alike a sandbox
/// that never was), nor its own onto a policy of A's. Every move is in the audit.
async fn a_network_only_tightens(
    db: &Path,
    a: &Api,
    b: &Api,
    env: &str,
    news: &std::sync::mpsc::Receiver<&'static str>,
    upstream: u16,
) {
    let sandbox = a.new_sandbox(json!({ "environment": env, "network": "open-a" })).await;
    let tunnel = format!("(printf 'CONNECT 127.0.0.1:{upstream} HTTP/1.1\\r\\n\\r\\n'; sleep 600) | nc 127.0.0.1 3128");
    a.start_process(&sandbox, &tunnel).await;
    heard(news, "accepted");
    let network = format!("/v1/sandboxes/{sandbox}/network");
    // B: A's sandbox is one that never was; its own may not take A's policies.
    let (status, theirs) = b.call("POST", &network, Some(json!({ "network": null }))).await;
    let (never_status, never) = b
        .call(
            "POST",
            "/v1/sandboxes/sb-never/network",
            Some(json!({ "network": null })),
        )
        .await;
    assert_eq!((status, never_status), (404, 404), "{theirs} {never}");
    assert_eq!(
        theirs.to_string().replace(&sandbox, "X"),
        never.to_string().replace("sb-never", "X")
    );
    let own = b.new_sandbox(json!({ "environment": env, "network": "net-b" })).await;
    let (status, refused) = b
        .call(
            "POST",
            &format!("/v1/sandboxes/{own}/network"),
            Some(json!({ "network": "open-a" })),
        )
        .await;
    assert_eq!((status, refused["field"].as_str()), (400, Some("network")), "{refused}");
    b.ok("DELETE", &format!("/v1/sandboxes/{own}"), None, 200).await;
    // A: a body past the JSON, and a policy not listed after its own, are refused.
    let (status, _) = raw(a, "POST", &network, "{\"network\":\"shut-a\"} x").await;
    assert_eq!(status, 400);
    let (status, refused) = a.call("POST", &network, Some(json!({ "network": "net-a" }))).await;
    assert_eq!((status, refused["field"].as_str()), (409, Some("network")), "{refused}");
    // Tightened: the tunnel is cut, a new request refused, a branch as strict.
    let moved = a.ok("POST", &network, Some(json!({ "network": "shut-a" })), 200).await;
    assert_eq!(moved["network"], "shut-a", "{moved}");
    heard(news, "ended");
    let probe = format!("wget -q -O- http://127.0.0.1:{upstream}/ 2>&1; echo rc=$?");
    let (_, said) = a.run_sh(&sandbox, &probe).await;
    assert!(said.contains("403") && !said.contains("rc=0"), "{said}");
    let branch = a
        .ok("POST", &format!("/v1/sandboxes/{sandbox}/branch"), None, 201)
        .await;
    assert_eq!(branch["network"], "shut-a", "{branch}");
    let (_, said) = a.run_sh(branch["id"].as_str().unwrap(), &probe).await;
    assert!(said.contains("403") && !said.contains("rc=0"), "{said}");
    // Never looser: back to `open-a`, or from no network to anything.
    let (status, refused) = a.call("POST", &network, Some(json!({ "network": "open-a" }))).await;
    assert_eq!((status, refused["field"].as_str()), (409, Some("network")), "{refused}");
    a.ok("POST", &network, Some(json!({ "network": null })), 200).await;
    let (status, _) = a.call("POST", &network, Some(json!({ "network": "shut-a" }))).await;
    assert_eq!(status, 409);
    let records: Value = serde_json::from_str(&farm_tenant(db, &["--json", "audit", "--limit", "100000"])).unwrap();
    let moves = records
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["route"] == "POST /v1/sandboxes/{id}/network" && r["tenant"] == "a" && r["status"] == 200)
        .count();
    assert_eq!(moves, 2, "both moves are in the audit");
    for id in [sandbox.as_str(), branch["id"].as_str().unwrap()] {
        a.ok("DELETE", &format!("/v1/sandboxes/{id}"), None, 200).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_five_holes_stay_shut() {
    let dir = tempfile::tempdir().unwrap();
    let (out, run_dir) = (dir.path().join("out"), dir.path().join("run"));
    let db = out.join("tenants.db");
    for (tenant, network) in [("a", "net-a"), ("b", "net-b"), ("a", "open-a"), ("a", "shut-a")] {
        if network.starts_with("net") {
            farm_tenant(&db, &["add", tenant]);
        }
        farm_tenant(&db, &["grant", tenant, network]);
    }
    let (a_key, _) = new_key(&db, "a", &[]);
    let (b_key, _) = new_key(&db, "b", &[]);
    let (upstream_port, news) = upstream();
    let (mut service, url) = farm_serve(
        &service_file(dir.path(), upstream_port),
        &out,
        &run_dir,
        "127.0.0.1:0",
        Some("operator"),
    );
    let (a, b) = (Api::new(&url, Some(&a_key)), Api::new(&url, Some(&b_key)));
    let owned = make_as_a(&a, &b).await;
    bodies_are_read_once(&db, &a, &b, &owned).await;
    protocols_read_once(&url, &a, &a_key).await;
    a_change_is_not_a_death(&url, &a, &a_key, &owned.env).await;
    unread_input_is_refused_not_fatal(&url, &a, &a_key, &owned.env).await;
    connections_are_bounded(&db, &b, &owned.env).await;
    connections_end_with_their_key(&db, &url, &b, &owned.env).await;
    a_network_only_tightens(&db, &a, &b, &owned.env, &news, upstream_port).await;
    // B never reached A's secret, and A's sandbox is as A left it.
    a.sh_prints(&owned.sandbox, "cat /root/secret", "a-secret").await;
    stop(&mut service);
    assert_no_qemu_of(&run_dir);
}
