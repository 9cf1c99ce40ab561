//! Sandboxes that host a running program, against real guests (the minimal image):
//! background processes (their output, stdin, signals, exit; kept by a branch, a pause and a
//! resume), open ports (HTTP through a token, seen by headless Chromium), and the hostile
//! cases: unknown pids and ports, an output flood, more processes than an agent keeps, a
//! guest that accepts and never answers or answers forever, tokens that are not a port's.

mod common;
use common::assert_no_qemu_of;
use common::serve::{serve_sandboxes, stop, Api};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The service, an environment of the minimal image, and a sandbox of it.
struct Hosting {
    api: Api,
    env: String,
}

impl Hosting {
    async fn sandbox(&self) -> String {
        let sb = self
            .api
            .ok("POST", "/v1/sandboxes", Some(json!({ "environment": self.env })), 201)
            .await;
        sb["id"].as_str().unwrap().to_string()
    }

    async fn start(&self, sandbox: &str, body: Value) -> u64 {
        let p = self
            .api
            .ok("POST", &format!("/v1/sandboxes/{sandbox}/processes"), Some(body), 201)
            .await;
        assert_eq!(p["state"], "running", "{p}");
        p["pid"].as_u64().unwrap()
    }

    async fn process(&self, sandbox: &str, pid: u64, what: &str) -> String {
        format!("/v1/sandboxes/{sandbox}/processes/{pid}{what}")
    }

    /// All of a stream's output from `offset` once the process wrote at least `at_least` bytes.
    async fn output(&self, sandbox: &str, pid: u64, query: &str) -> Value {
        let path = self.process(sandbox, pid, &format!("/output?{query}")).await;
        self.api.ok("GET", &path, None, 200).await
    }

    async fn open_port(&self, sandbox: &str, port: u16) -> Value {
        self.api
            .ok(
                "POST",
                &format!("/v1/sandboxes/{sandbox}/ports"),
                Some(json!({ "port": port })),
                201,
            )
            .await
    }
}

/// A plain GET through the port listener with these headers: (status, body).
async fn get(address: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut request = client.get(format!("http://{address}{path}"));
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_and_ports_of_running_sandboxes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut service, api) = serve_sandboxes(dir.path(), "");
    let env = api.environment("minimal").await;
    let h = Hosting { api, env };
    background_processes(&h).await;
    processes_through_branch_pause_and_resume(&h).await;
    hostile_processes(&h).await;
    open_ports(&h).await;
    hostile_ports(&h).await;
    stop(&mut service);
    assert_no_qemu_of(&dir.path().join("run"));
}

/// A process outlives its request: its stdin, output (from an offset, waiting, followed),
/// signals and exit code.
async fn background_processes(h: &Hosting) {
    let sb = h.sandbox().await;
    let echo = "i=0; while read l; do i=$((i+1)); echo \"got $i: $l\"; echo e$i >&2; done; echo bye; exit 7";
    let pid = h.start(&sb, json!({ "command": echo })).await;
    let stdin = h.process(&sb, pid, "/stdin").await;
    h.api.ok("POST", &stdin, Some(json!({ "data": "a\nb\n" })), 200).await;
    let first = h.output(&sb, pid, "wait=30").await;
    assert!(first["data"].as_str().unwrap().starts_with("got 1: a\n"), "{first}");
    let next = first["next"].as_u64().unwrap();
    h.api
        .ok("POST", &stdin, Some(json!({ "data": "c\n", "close": true })), 200)
        .await;
    let waited = h
        .api
        .ok("POST", &h.process(&sb, pid, "/wait?timeout=60").await, None, 200)
        .await;
    assert_eq!(
        (waited["state"].clone(), waited["exit_code"].clone()),
        (json!("exited"), json!(7)),
        "{waited}"
    );
    let all = h.output(&sb, pid, "offset=0").await;
    assert_eq!(all["data"], "got 1: a\ngot 2: b\ngot 3: c\nbye\n");
    assert_eq!((all["eof"].clone(), all["dropped"].clone()), (json!(true), json!(0)));
    let rest = h.output(&sb, pid, &format!("offset={next}")).await;
    assert!(rest["data"].as_str().unwrap().ends_with("bye\n"), "{rest}");
    assert_eq!(h.output(&sb, pid, "stream=stderr").await["data"], "e1\ne2\ne3\n");
    // A stdin write to a closed stdin is refused, naming it.
    let (status, v) = h.api.call("POST", &stdin, Some(json!({ "data": "late" }))).await;
    assert_eq!((status, v["field"].as_str()), (409, Some("data")), "{v}");

    // A server-like process: listed, followed as events, ended by a signal.
    let pid = h
        .start(
            &sb,
            json!({ "command": "i=0; while true; do i=$((i+1)); echo tick$i; sleep 0.2; done" }),
        )
        .await;
    let list = h
        .api
        .ok("GET", &format!("/v1/sandboxes/{sb}/processes"), None, 200)
        .await;
    assert!(
        list["processes"].as_array().unwrap().iter().any(|p| p["pid"] == pid),
        "{list}"
    );
    let (status, _, events) = tokio::time::timeout(Duration::from_secs(120), async {
        let follow = h.process(&sb, pid, "/output/stream").await;
        let signal = h.process(&sb, pid, "/signal").await;
        let api = Api::new(&h.api.url, None);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            api.ok("POST", &signal, Some(json!({ "signal": "TERM" })), 200).await;
        });
        h.api.send("GET", &follow, None, &[]).await
    })
    .await
    .expect("the followed output ends with the process");
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&events);
    assert!(text.contains("event: stdout") && text.contains("tick1\\n"), "{text}");
    assert!(text.contains("event: exit") && text.contains("\"signal\":15"), "{text}");
    h.api.ok("DELETE", &format!("/v1/sandboxes/{sb}"), None, 200).await;
}

/// A branch, and a pause with its resume, keep running processes as the guest had them: the
/// same pids, the same output, still running; each branch goes on apart.
async fn processes_through_branch_pause_and_resume(h: &Hosting) {
    let sb = h.sandbox().await;
    let pid = h
        .start(
            &sb,
            json!({ "command": "i=0; while true; do i=$((i+1)); echo n$i; sleep 0.2; done" }),
        )
        .await;
    let before = h.output(&sb, pid, "wait=30").await;
    assert!(before["data"].as_str().unwrap().starts_with("n1\n"), "{before}");
    let branch = h.api.ok("POST", &format!("/v1/sandboxes/{sb}/branch"), None, 201).await;
    let branch = branch["id"].as_str().unwrap().to_string();
    let on_branch = h.api.ok("GET", &h.process(&branch, pid, "").await, None, 200).await;
    assert_eq!(on_branch["state"], "running", "{on_branch}");
    let kept = h.output(&branch, pid, "offset=0").await;
    let seen = before["data"].as_str().unwrap();
    assert!(
        kept["data"].as_str().unwrap().starts_with(seen),
        "{kept} keeps {seen:?}"
    );
    // Killed on the branch, it runs on in the parent.
    let signal = h.process(&branch, pid, "/signal").await;
    h.api.ok("POST", &signal, Some(json!({ "signal": 9 })), 200).await;
    let gone = h
        .api
        .ok("POST", &h.process(&branch, pid, "/wait?timeout=30").await, None, 200)
        .await;
    assert_eq!(gone["signal"], 9, "{gone}");
    assert_eq!(
        h.api.ok("GET", &h.process(&sb, pid, "").await, None, 200).await["state"],
        "running"
    );
    // Paused, then resumed: the process is there, running, its output kept.
    h.api.ok("POST", &format!("/v1/sandboxes/{sb}/pause"), None, 200).await;
    let (status, _) = h.api.call("GET", &h.process(&sb, pid, "").await, None).await;
    assert_eq!(status, 409, "a paused sandbox's processes wait for its resume");
    h.api.ok("POST", &format!("/v1/sandboxes/{sb}/resume"), None, 200).await;
    let resumed = h.api.ok("GET", &h.process(&sb, pid, "").await, None, 200).await;
    assert_eq!(resumed["state"], "running", "{resumed}");
    let grown = resumed["stdout_bytes"].as_u64().unwrap();
    let later = h.output(&sb, pid, &format!("offset={grown}&wait=30")).await;
    assert!(
        !later["data"].as_str().unwrap().is_empty(),
        "it goes on after the resume: {later}"
    );
    let all = h.output(&sb, pid, "offset=0").await;
    assert!(all["data"].as_str().unwrap().starts_with(seen), "{all}");
    for id in [&sb, &branch] {
        h.api.ok("DELETE", &format!("/v1/sandboxes/{id}"), None, 200).await;
    }
}

/// Unknown pids, bad requests, a flood of output, more processes than an agent keeps: each a
/// clear answer, and the sandbox and the service go on.
async fn hostile_processes(h: &Hosting) {
    let sb = h.sandbox().await;
    for (path, status, field) in [
        (h.process(&sb, 99999, "").await, 404, "pid"),
        (format!("/v1/sandboxes/{sb}/processes/abc"), 400, "pid"),
        (h.process(&sb, 99999, "/output").await, 404, "pid"),
    ] {
        let (got, v) = h.api.call("GET", &path, None).await;
        assert_eq!((got, v["field"].as_str()), (status, Some(field)), "{path}: {v}");
    }
    for (body, field) in [
        (json!({ "command": "true", "ring_bytes": 0 }), "ring_bytes"),
        (json!({ "command": "true", "ring_bytes": 1u64 << 30 }), "ring_bytes"),
        (json!({}), "command"),
        (
            json!({ "command": "true", "pty": { "rows": 0, "cols": 80 } }),
            "pty.rows",
        ),
    ] {
        let (status, v) = h
            .api
            .call("POST", &format!("/v1/sandboxes/{sb}/processes"), Some(body.clone()))
            .await;
        assert_eq!((status, v["field"].as_str()), (400, Some(field)), "{body}: {v}");
    }
    for bad in [json!("NOPE"), json!(0), json!(65), json!(-9)] {
        let (status, v) = h
            .api
            .call(
                "POST",
                &h.process(&sb, 1, "/signal").await,
                Some(json!({ "signal": bad })),
            )
            .await;
        assert_eq!((status, v["field"].as_str()), (400, Some("signal")), "{bad}: {v}");
    }
    // A flood: the ring keeps the newest 4 KiB and says how much fell out.
    let flood = h
        .start(
            &sb,
            json!({ "command": "yes flood | head -c 3000000", "ring_bytes": 4096 }),
        )
        .await;
    let done = h
        .api
        .ok("POST", &h.process(&sb, flood, "/wait?timeout=120").await, None, 200)
        .await;
    assert_eq!(
        (done["exit_code"].clone(), done["stdout_bytes"].clone()),
        (json!(0), json!(3_000_000)),
        "{done}"
    );
    let tail = h.output(&sb, flood, "offset=0").await;
    assert_eq!(
        (tail["dropped"].clone(), tail["offset"].clone()),
        (json!(3_000_000 - 4096), json!(3_000_000 - 4096))
    );
    assert_eq!(tail["data"].as_str().unwrap().len(), 4096);
    // More processes than an agent keeps: the one past it is refused, the rest go on.
    let mut refused = None;
    for i in 0..1100 {
        let (status, v) = h
            .api
            .call(
                "POST",
                &format!("/v1/sandboxes/{sb}/processes"),
                Some(json!({ "argv": ["sleep", "600"], "ring_bytes": 16 })),
            )
            .await;
        if status != 201 {
            refused = Some((i, status, v));
            break;
        }
    }
    let (at, status, v) = refused.expect("some start past the agent's limit is refused");
    assert!(at >= 1000 && status == 400, "refused at {at}: {status} {v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("background processes are running"),
        "{v}"
    );
    assert_eq!(h.api.stdout(&sb, "echo still").await, "still\n");
    h.api.ok("DELETE", &format!("/v1/sandboxes/{sb}"), None, 200).await;
}

/// A web server in a sandbox, through its open port: by the token's host name, a header or
/// the query; in headless Chromium; refused without a token or after the port closes.
async fn open_ports(h: &Hosting) {
    let sb = h.sandbox().await;
    h.api
        .stdout(
            &sb,
            "mkdir -p /www && echo '<html><body><h1>hello from the sandbox</h1></body></html>' > /www/index.html",
        )
        .await;
    h.start(
        &sb,
        json!({ "argv": ["httpd", "-f", "-v", "-p", "127.0.0.1:8000", "-h", "/www"] }),
    )
    .await;
    let opened = h.open_port(&sb, 8000).await;
    let (token, address, page) = (
        opened["token"].as_str().unwrap().to_string(),
        opened["address"].as_str().unwrap().to_string(),
        opened["url"].as_str().unwrap().to_string(),
    );
    assert_eq!(
        page,
        format!("http://{token}.localhost:{}/", address.rsplit(':').next().unwrap())
    );
    let host = format!("{token}.localhost");
    let started = Instant::now();
    loop {
        let (status, body) = get(&address, "/", &[("Host", host.as_str())]).await;
        if status == 200 {
            assert!(body.contains("hello from the sandbox"), "{body}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the server never answered: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (status, body) = get(&address, "/index.html", &[("Farm-Port-Token", token.as_str())]).await;
    assert!(status == 200 && body.contains("hello"), "{status} {body}");
    let (status, _) = get(&address, &format!("/?farm_token={token}"), &[]).await;
    assert_eq!(status, 200);
    // As a person would see it: headless Chromium, by the URL alone.
    let shots = tempfile::tempdir().unwrap();
    let chromium = |what: &str| {
        std::process::Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
            ])
            .args([
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ])
            .arg(format!("--user-data-dir={}", shots.path().join("profile").display()))
            .arg(what)
            .arg(&page)
            .output()
            .unwrap()
    };
    let shot = shots.path().join("page.png");
    let taken = chromium(&format!("--screenshot={}", shot.display()));
    let png =
        std::fs::read(&shot).unwrap_or_else(|_| panic!("no screenshot: {}", String::from_utf8_lossy(&taken.stderr)));
    assert!(png.starts_with(b"\x89PNG") && png.len() > 1000, "{} bytes", png.len());
    let dom = chromium("--dump-dom");
    assert!(
        String::from_utf8_lossy(&dom.stdout).contains("hello from the sandbox"),
        "{dom:?}"
    );
    // Listed, closed: its token stops working, without reaching the guest.
    let ports = h.api.ok("GET", &format!("/v1/sandboxes/{sb}/ports"), None, 200).await;
    assert_eq!(ports["ports"][0]["port"], 8000, "{ports}");
    h.api
        .ok("DELETE", &format!("/v1/sandboxes/{sb}/ports/8000"), None, 200)
        .await;
    let (status, _) = get(&address, "/", &[("Host", host.as_str())]).await;
    assert_eq!(status, 404);
    h.api.ok("DELETE", &format!("/v1/sandboxes/{sb}"), None, 200).await;
}

/// No token, a made-up one, another sandbox's, an unopened port, a port out of range, a guest
/// that accepts and never answers or answers forever: each refused or bounded, and the
/// service and other sandboxes go on.
async fn hostile_ports(h: &Hosting) {
    let (a, b) = (h.sandbox().await, h.sandbox().await);
    let mut servers = Vec::new();
    for (sb, text) in [(&a, "page of a"), (&b, "page of b")] {
        h.api
            .stdout(sb, &format!("mkdir -p /www && echo '{text}' > /www/index.html"))
            .await;
        let pid = h
            .start(
                sb,
                json!({ "argv": ["httpd", "-f", "-vv", "-p", "127.0.0.1:8000", "-h", "/www"] }),
            )
            .await;
        servers.push(pid);
    }
    let (pa, pb) = (h.open_port(&a, 8000).await, h.open_port(&b, 8000).await);
    let address = pa["address"].as_str().unwrap().to_string();
    let (ta, tb) = (pa["token"].as_str().unwrap(), pb["token"].as_str().unwrap());
    assert_ne!(ta, tb);
    let mut served = 0;
    for _ in 0..100 {
        let (status, body) = get(&address, "/", &[("Farm-Port-Token", ta)]).await;
        if status == 200 {
            assert_eq!(body, "page of a\n", "a's token reaches a's port alone");
            served += 1;
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(served, 1, "a's server never answered");
    let (_, body) = get(&address, "/", &[("Farm-Port-Token", tb)]).await;
    assert_eq!(body, "page of b\n");
    let fake = "0123456789abcdef0123456789abcdef";
    for (headers, status) in [
        (vec![], 401),
        (vec![("Farm-Port-Token", fake)], 404),
        (vec![("Host", "www.example.org")], 401),
    ] {
        let (got, body) = get(&address, "/", &headers).await;
        assert_eq!(got, status, "{headers:?}: {body}");
    }
    // Refused requests never reached a guest: a's server saw the one request let through.
    let log = h.output(&a, servers[0], "stream=stderr").await;
    let seen = log["data"].as_str().unwrap().matches("url:").count();
    assert_eq!(seen, 1, "a's server saw only the request with a's token: {log}");
    for (body, status) in [
        (json!({ "port": 0 }), 400),
        (json!({ "port": 70000 }), 400),
        (json!({ "port": "x" }), 400),
    ] {
        let (got, v) = h
            .api
            .call("POST", &format!("/v1/sandboxes/{a}/ports"), Some(body.clone()))
            .await;
        assert_eq!(got, status, "{body}: {v}");
    }
    let (status, _) = h
        .api
        .call("DELETE", &format!("/v1/sandboxes/{a}/ports/9999"), None)
        .await;
    assert_eq!(status, 404);
    // Nothing listening: 502. A server that accepts and never answers holds only its own
    // client; one that answers forever is cut by its client; the service goes on.
    let (got, body) = get(
        &address,
        "/",
        &[(
            "Farm-Port-Token",
            h.open_port(&a, 8100).await["token"].as_str().unwrap(),
        )],
    )
    .await;
    assert_eq!(got, 502, "{body}");
    h.start(&a, json!({ "argv": ["nc", "-l", "-p", "9000"] })).await;
    h.start(&a, json!({ "command": "yes forever | nc -l -p 9001" })).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (silent, endless) = (h.open_port(&a, 9000).await, h.open_port(&a, 9001).await);
    let silent = silent["token"].as_str().unwrap().to_string();
    let endless = endless["token"].as_str().unwrap().to_string();
    let quick = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let hung = quick
        .get(format!("http://{address}/"))
        .header("Farm-Port-Token", &silent)
        .send()
        .await;
    assert!(hung.is_err(), "a server that never answers times its client out");
    // Not HTTP, and endless: the client gives up on it (an error or a cut body), and that is all.
    let forever = quick
        .get(format!("http://{address}/"))
        .header("Farm-Port-Token", &endless)
        .send()
        .await;
    if let Ok(response) = forever {
        let _ = response.bytes().await;
    }
    let (status, body) = get(&address, "/", &[("Farm-Port-Token", tb)]).await;
    assert_eq!(
        (status, body.as_str()),
        (200, "page of b\n"),
        "other sandboxes' ports go on"
    );
    assert_eq!(h.api.stdout(&a, "echo alive").await, "alive\n");
    // A deleted sandbox's tokens stop working.
    h.api.ok("DELETE", &format!("/v1/sandboxes/{b}"), None, 200).await;
    let (status, _) = get(&address, "/", &[("Farm-Port-Token", tb)]).await;
    assert_eq!(status, 404);
    h.api.ok("DELETE", &format!("/v1/sandboxes/{a}"), None, 200).await;
}
