//! A `farm serve` process for the tests, and a client of its API.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub use super::repo;

/// A child process killed when dropped, and what it printed on stderr.
pub struct Proc {
    pub child: Child,
    pub log: Arc<Mutex<String>>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

/// Starts `command` and waits for a line of its output starting with `marker`; returns the
/// rest of that line.
pub fn start(command: Command, marker: &str, from_stdout: bool) -> (Proc, String) {
    let mut command = super::dies_with_test(command);
    command.stdin(Stdio::null());
    if from_stdout {
        command.stdout(Stdio::piped()).stderr(Stdio::inherit());
    } else {
        command.stderr(Stdio::piped()).stdout(Stdio::inherit());
    }
    let mut child = command.spawn().unwrap();
    let stream: Box<dyn std::io::Read + Send> = if from_stdout {
        Box::new(child.stdout.take().unwrap())
    } else {
        Box::new(child.stderr.take().unwrap())
    };
    let log = Arc::new(Mutex::new(String::new()));
    let (found_tx, found_rx) = std::sync::mpsc::channel();
    let (log2, wanted) = (log.clone(), marker.to_string());
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            log2.lock().unwrap().push_str(&format!("{line}\n"));
            if let Some(i) = line.find(&wanted) {
                let rest = line[i + wanted.len()..]
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_string();
                let _ = found_tx.send(rest);
            }
        }
    });
    let proc = Proc { child, log };
    match found_rx.recv_timeout(Duration::from_secs(600)) {
        Ok(rest) => (proc, rest),
        Err(_) => panic!("never printed {marker:?}:\n{}", proc.log()),
    }
}

pub fn fake_model() -> (Proc, String) {
    let mut c = Command::new("python3");
    c.arg(repo().join("farm/tests/fake_model.py"));
    let (p, port) = start(c, "listening on ", true);
    (p, format!("http://127.0.0.1:{port}/v1"))
}

pub fn farm_serve(config: &Path, out: &Path, run_dir: &Path, listen: &str, token: Option<&str>) -> (Proc, String) {
    farm_serve_with(config, out, run_dir, listen, token, &[])
}

/// `farm serve` of `configs/serve.toml` (the minimal image) on a loopback port.
#[allow(dead_code)] // not every test binary serves that suite
pub fn serve_suite(out: &Path, run_dir: &Path, token: Option<&str>) -> (Proc, String) {
    farm_serve(&repo().join("configs/serve.toml"), out, run_dir, "127.0.0.1:0", token)
}

/// A service file `dir/name` with no suite, serving sandboxes: `[serve.sandboxes]`, then `rest`.
#[allow(dead_code)] // not every test binary serves sandboxes alone
pub fn sandboxes_config(dir: &Path, name: &str, rest: &str) -> PathBuf {
    let config = dir.join(name);
    std::fs::write(&config, format!("[serve]\nsuites = []\n[serve.sandboxes]\n{rest}")).unwrap();
    config
}

/// `farm serve` of sandboxes alone (`dir/sandboxes.toml`, see `sandboxes_config`; its `out` and
/// `run` folders in `dir` too) on a loopback port, with no token: the service and a client.
#[allow(dead_code)] // not every test binary serves sandboxes alone
pub fn serve_sandboxes(dir: &Path, rest: &str) -> (Proc, Api) {
    let config = sandboxes_config(dir, "sandboxes.toml", rest);
    let (proc, url) = farm_serve(&config, &dir.join("out"), &dir.join("run"), "127.0.0.1:0", None);
    (proc, Api::new(&url, None))
}

/// `farm serve` with variables of its own (set on it alone: the test binary's environment
/// is shared by the tests running beside it).
pub fn farm_serve_with(
    config: &Path,
    out: &Path,
    run_dir: &Path,
    listen: &str,
    token: Option<&str>,
    vars: &[(&str, &std::ffi::OsStr)],
) -> (Proc, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_farm"));
    c.envs(vars.iter().copied());
    c.arg("serve")
        .arg(config)
        .arg("--out")
        .arg(out)
        .arg("--listen")
        .arg(listen)
        .env("FARM_RUN_DIR", run_dir)
        .env_remove("FARM_SERVE_TOKEN");
    if let Some(t) = token {
        c.env("FARM_SERVE_TOKEN", t);
    }
    let (p, url) = start(c, "listening on ", false);
    let url = url.replace("0.0.0.0", "127.0.0.1");
    (p, url)
}

pub struct Api {
    pub url: String,
    pub http: reqwest::Client,
    pub token: Option<String>,
}

impl Api {
    /// An environment of a built-in image (`minimal`, `python`), once its build is done.
    #[allow(dead_code)] // not every test binary makes environments
    pub async fn environment(&self, image: &str) -> String {
        let (_, env) = self
            .call("POST", "/v1/environments", Some(json!({ "image": image })))
            .await;
        let id = env["id"].as_str().unwrap_or_else(|| panic!("{env}")).to_string();
        self.wait_built(&id).await;
        id
    }

    /// Waits until environment `id` is ready (fails the test when its build fails).
    #[allow(dead_code)]
    pub async fn wait_built(&self, id: &str) {
        let started = Instant::now();
        loop {
            let env = self.ok("GET", &format!("/v1/environments/{id}"), None, 200).await;
            if env["state"] == "ready" {
                return;
            }
            assert_eq!(env["state"], "building", "{env}");
            assert!(started.elapsed() < Duration::from_secs(900), "the build never ended");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// A POST of a shell command (`{"command": ...}`) to `path`, answered `expect`: the answer.
    async fn post_command(&self, path: &str, command: &str, expect: u16) -> Value {
        self.ok("POST", path, Some(json!({ "command": command })), expect).await
    }

    /// One exec of a shell command in a sandbox, answered 200: the answer.
    #[allow(dead_code)]
    pub async fn sandbox_exec(&self, sandbox: &str, command: &str) -> Value {
        self.post_command(&format!("/v1/sandboxes/{sandbox}/exec"), command, 200)
            .await
    }

    /// A background process of a shell command in a sandbox, started: the answer.
    #[allow(dead_code)]
    pub async fn start_process(&self, sandbox: &str, command: &str) -> Value {
        self.post_command(&format!("/v1/sandboxes/{sandbox}/processes"), command, 201)
            .await
    }

    /// The stdout of a shell command in a sandbox, which must exit with 0.
    #[allow(dead_code)]
    pub async fn stdout(&self, sandbox: &str, command: &str) -> String {
        let out = self.sandbox_exec(sandbox, command).await;
        assert_eq!(out["exit_code"], 0, "{command}: {out}");
        out["stdout"].as_str().unwrap().to_string()
    }

    /// A shell command in a sandbox: (its exit code, its stdout).
    #[allow(dead_code)]
    pub async fn run_sh(&self, sandbox: &str, command: &str) -> (i64, String) {
        let out = self.sandbox_exec(sandbox, command).await;
        (
            out["exit_code"].as_i64().unwrap_or(-1),
            out["stdout"].as_str().unwrap_or_default().to_string(),
        )
    }

    /// Runs `command` in a sandbox, which must print `expected` (white space around it aside).
    #[allow(dead_code)]
    pub async fn sh_prints(&self, sandbox: &str, command: &str, expected: &str) {
        assert_eq!(self.run_sh(sandbox, command).await.1.trim(), expected, "{command}");
    }

    /// A new sandbox of environment `env` is refused: the caller's `live` quota of one is used up.
    #[allow(dead_code)]
    pub async fn over_live_quota(&self, env: &str) {
        let (status, over) = self
            .call("POST", "/v1/sandboxes", Some(json!({ "environment": env })))
            .await;
        assert_eq!(status, 429, "{over}");
        assert_eq!(
            over["quota"],
            json!({ "name": "live", "limit": 1, "used": 1 }),
            "{over}"
        );
    }

    /// A new sandbox (`body` is the request's: its environment and settings): its id.
    #[allow(dead_code)]
    pub async fn new_sandbox(&self, body: Value) -> String {
        self.ok("POST", "/v1/sandboxes", Some(body), 201).await["id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// A new session (`body` is the request's: its task and settings): its id.
    #[allow(dead_code)]
    pub async fn new_session(&self, body: Value) -> String {
        self.ok("POST", "/v1/sessions", Some(body), 201).await["session_id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// One exec of `command` in session `session`, answered 200: the answer.
    #[allow(dead_code)]
    pub async fn session_exec(&self, session: &str, command: &str) -> Value {
        self.post_command(&format!("/v1/sessions/{session}/exec"), command, 200)
            .await
    }

    /// The status of a call to exec `true` in session `session`.
    #[allow(dead_code)]
    pub async fn session_exec_status(&self, session: &str) -> u16 {
        self.call(
            "POST",
            &format!("/v1/sessions/{session}/exec"),
            Some(json!({ "command": "true" })),
        )
        .await
        .0
    }

    /// Writes `content` to `path` in session `session`.
    #[allow(dead_code)]
    pub async fn session_write(&self, session: &str, path: &str, content: &str) {
        self.ok(
            "POST",
            &format!("/v1/sessions/{session}/write_file"),
            Some(json!({ "path": path, "content": content })),
            200,
        )
        .await;
    }

    pub fn new(url: &str, token: Option<&str>) -> Api {
        Api {
            url: url.to_string(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(600))
                .build()
                .unwrap(),
            token: token.map(String::from),
        }
    }

    pub async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut r = self.http.request(method, format!("{}{path}", self.url));
        if let Some(t) = &self.token {
            r = r.bearer_auth(t);
        }
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        if let Some(b) = body {
            r = r.body(b.to_string()).header("content-type", "application/json");
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        (status, headers, resp.bytes().await.unwrap().to_vec())
    }

    /// A POST of `body` to `path` under `Idempotency-Key: key`: (status, answer).
    #[allow(dead_code)]
    pub async fn post_keyed(&self, path: &str, body: Value, key: &str) -> (u16, Vec<u8>) {
        let (status, _, answer) = self.send("POST", path, Some(body), &[("Idempotency-Key", key)]).await;
        (status, answer)
    }

    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let (status, _, bytes) = self.send(method, path, body, &[]).await;
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or_else(|_| json!({ "raw": String::from_utf8_lossy(&bytes) })),
        )
    }

    /// A call that must succeed with `expect`.
    pub async fn ok(&self, method: &str, path: &str, body: Option<Value>, expect: u16) -> Value {
        let (status, v) = self.call(method, path, body).await;
        assert_eq!(status, expect, "{method} {path}: {v}");
        v
    }

    /// Rows from `cursor` until every id in `ids` has one (or 10 minutes pass).
    pub async fn rows_for(&self, ids: &[String], cursor: usize) -> Vec<Value> {
        let started = Instant::now();
        let mut cursor = cursor;
        let mut rows: Vec<Value> = Vec::new();
        while !ids.iter().all(|id| rows.iter().any(|r| r["rollout_id"] == *id)) {
            assert!(
                started.elapsed() < Duration::from_secs(600),
                "rows never came for {ids:?}; got {rows:?}"
            );
            let (status, headers, body) = self
                .send("GET", &format!("/v1/results?cursor={cursor}&wait=20"), None, &[])
                .await;
            assert_eq!(status, 200);
            let next: usize = headers["farm-next-cursor"].to_str().unwrap().parse().unwrap();
            for (i, line) in String::from_utf8(body).unwrap().lines().enumerate() {
                let row: Value = serde_json::from_str(line).unwrap();
                assert_eq!(row["cursor"], cursor + i, "rows come in cursor order");
                rows.push(row);
            }
            cursor = next;
        }
        rows.retain(|r| ids.iter().any(|id| r["rollout_id"] == *id));
        rows
    }
}

pub fn stop(proc: &mut Proc) {
    let pid = proc.child.id();
    assert!(Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .unwrap()
        .success());
    let started = Instant::now();
    loop {
        if let Some(status) = proc.child.try_wait().unwrap() {
            assert_eq!(
                status.code(),
                Some(128 + 15),
                "farm serve exits with 143 after SIGTERM:\n{}",
                proc.log()
            );
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "farm serve did not stop on SIGTERM:\n{}",
            proc.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `farm tenant --db DB ARGS...`: its standard output (the test fails if it does).
#[allow(dead_code)] // not every test binary has tenants
pub fn farm_tenant(db: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_farm"))
        .arg("tenant")
        .arg("--db")
        .arg(db)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "farm tenant {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A tenant made with `farm tenant` in database `db` (made if need be; the service's is
/// `OUT/tenants.db`), granted these network policies, and a key of it: its secret.
#[allow(dead_code)] // not every test binary has tenants
pub fn tenant_key(db: &Path, tenant: &str, grants: &[&str]) -> String {
    farm_tenant(db, &["add", tenant]);
    for policy in grants {
        farm_tenant(db, &["grant", tenant, policy]);
    }
    farm_tenant(db, &["key", "add", tenant]).trim().to_string()
}

/// One block of server-sent events (the lines between two blank lines): its event's name
/// and its data lines joined, or None for a block with no name (a keep-alive comment).
#[allow(dead_code)] // not every test binary reads event streams
pub fn sse_event(block: &str) -> Option<(String, String)> {
    let mut name = String::new();
    let mut data = String::new();
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            name = v.trim().to_string();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.trim_start());
        }
    }
    (!name.is_empty()).then_some((name, data))
}

/// A service file `dir/name` serving the suite of `configs/serve.toml` (the minimal image),
/// with `rest` (TOML) after its `suites` line.
#[allow(dead_code)] // not every test binary serves that suite
pub fn suite_config(dir: &Path, name: &str, rest: &str) -> PathBuf {
    let config = dir.join(name);
    let suite = repo().join("configs/serve.toml");
    std::fs::write(
        &config,
        format!("[serve]\nsuites = [{:?}]\n{rest}", suite.display().to_string()),
    )
    .unwrap();
    config
}

/// A new key of `tenant` in database `db`, with these options of `farm tenant key add`: (its
/// secret, its id).
#[allow(dead_code)] // not every test binary has tenants
pub fn new_key(db: &Path, tenant: &str, options: &[&str]) -> (String, String) {
    let mut args = vec!["--json", "key", "add", tenant];
    args.extend_from_slice(options);
    let key: Value = serde_json::from_str(&farm_tenant(db, &args)).unwrap();
    (
        key["secret"].as_str().unwrap().to_string(),
        key["id"].as_str().unwrap().to_string(),
    )
}

pub type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The service's web socket at `path`, opened with `key`.
#[allow(dead_code)] // not every test binary opens sockets
pub async fn socket(url: &str, path: &str, key: &str) -> Socket {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = format!("{}{path}", url.replacen("http", "ws", 1))
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    tokio_tungstenite::connect_async(request).await.unwrap().0
}
