//! A sandbox's terminal over a WebSocket, against real guests (the python image, which has
//! bash, tmux, vim and Python): a shell's state and size, a resize, Python's REPL, tmux
//! detached and listed, vim writing a file; a client that never reads; and the small
//! conveniences beside it: timers moved within the caps, a folder listed and a path stated
//! without exec, the list filtered by metadata, many branches in one call.

mod common;
use common::assert_no_qemu_of;
use common::serve::{serve_sandboxes, stop, Api};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// One terminal: its socket, and everything it printed so far.
struct Terminal {
    socket: Socket,
    screen: String,
    /// Where the next search starts: past the last text found.
    from: usize,
    pid: u64,
}

impl Terminal {
    async fn open(url: &str, sandbox: &str, query: &str) -> Terminal {
        let ws = format!("{}/v1/sandboxes/{sandbox}/pty?{query}", url.replacen("http", "ws", 1));
        let (mut socket, _) = tokio_tungstenite::connect_async(ws).await.unwrap();
        let first = socket.next().await.unwrap().unwrap();
        let started: Value = serde_json::from_str(first.to_text().unwrap()).unwrap();
        assert_eq!(started["type"], "started", "{started}");
        Terminal {
            socket,
            screen: String::new(),
            from: 0,
            pid: started["pid"].as_u64().unwrap(),
        }
    }

    async fn keys(&mut self, keys: &str) {
        self.socket
            .send(Message::Binary(keys.as_bytes().to_vec().into()))
            .await
            .unwrap();
    }

    async fn control(&mut self, control: Value) {
        self.socket
            .send(Message::Text(control.to_string().into()))
            .await
            .unwrap();
    }

    /// Reads until the screen shows `text` past the last text found. Text messages other
    /// than output fail the test unless they are `exit`.
    async fn until(&mut self, text: &str) {
        let started = Instant::now();
        loop {
            if let Some(at) = self.screen[self.from..].find(text) {
                self.from += at + text.len();
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "never saw {text:?}; the screen:\n{}",
                self.screen
            );
            let message = tokio::time::timeout(Duration::from_secs(120), self.socket.next())
                .await
                .expect("the terminal went quiet")
                .expect("the socket ended")
                .unwrap();
            match message {
                Message::Binary(bytes) => self.screen.push_str(&String::from_utf8_lossy(&bytes)),
                Message::Text(text) => {
                    let event: Value = serde_json::from_str(&text).unwrap();
                    assert_eq!(event["type"], "exit", "{event}; screen:\n{}", self.screen);
                    self.screen.push_str(&format!("\n<exit {}>\n", event["exit_code"]));
                }
                _ => {}
            }
        }
    }

    /// Types a command line and waits for `marker` (which its echo must not contain).
    async fn run(&mut self, command: &str, marker: &str) {
        self.keys(&format!("{command}\n")).await;
        self.until(marker).await;
    }
}

async fn sandbox(api: &Api, env: &str, metadata: Value) -> String {
    let sb = api
        .ok(
            "POST",
            "/v1/sandboxes",
            Some(json!({ "environment": env, "metadata": metadata })),
            201,
        )
        .await;
    sb["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_and_the_conveniences_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut service, api) = serve_sandboxes(dir.path(), "idle_timeout_secs = 600\nmax_lifetime_secs = 3600\n");
    let env = api.environment("python").await;
    let sb = sandbox(&api, &env, json!({ "owner": "ann" })).await;
    shell_python_tmux_and_vim(&api.url, &api, &sb).await;
    a_client_that_never_reads(&api.url, &api, &sb).await;
    a_websocket_through_a_port(&api, &sb).await;
    folders_without_exec(&api, &sb).await;
    timers_filters_and_branches(&api, &env, &sb).await;
    stop(&mut service);
    assert_no_qemu_of(&dir.path().join("run"));
}

async fn shell_python_tmux_and_vim(url: &str, api: &Api, sb: &str) {
    let mut t = Terminal::open(url, sb, "rows=24&cols=80").await;
    // A shell with state across lines, on a terminal of the size asked for.
    t.run("X=$((6*7)); stty size; tty; echo \"got-$X\"", "got-42").await;
    assert!(t.screen.contains("24 80"), "{}", t.screen);
    assert!(t.screen.contains("/dev/pts/"), "{}", t.screen);
    t.control(json!({ "type": "resize", "rows": 40, "cols": 100 })).await;
    t.run("stty size | sed 's/ /x/'", "40x100").await;
    // Keys as text work too; a bad control message is answered, and the terminal goes on.
    t.control(json!({ "type": "input", "data": "echo text-$X\n" })).await;
    t.until("text-42").await;
    // Python's REPL. (Each program's line ends with a marker the shell prints once it has
    // exited, so no keys are typed while one program hands the terminal to the next.)
    t.run("python3 -q; echo py-$((2+2))-out", ">>> ").await;
    t.keys("y = [i * i for i in range(5)]\n").await;
    t.keys("print('sum', sum(y))\n").await;
    t.until("sum 30").await;
    t.keys("exit()\n").await;
    t.until("py-4-out").await;
    // tmux: a session inside the terminal, detached, still listed, and its state kept.
    t.run("tmux new-session -s work; echo tmux-$((3+3))-back", "[work]")
        .await;
    t.keys("Z=tmux-kept; echo inside-$((2+3))\n").await;
    t.until("inside-5").await;
    t.keys("\x02d").await; // C-b d
    t.until("tmux-6-back").await;
    t.run(
        "tmux ls; tmux send-keys -t work 'echo $Z > /tmp/z' Enter",
        "work: 1 windows",
    )
    .await;
    // vim (vi from vim-tiny): a file written by keys alone, once its screen is up.
    t.run("vi -u NONE /tmp/note.txt; echo vi-$((1+1))-done", "[New").await;
    t.keys("ihello from vi\x1b:wq\r").await;
    t.until("vi-2-done").await;
    assert_eq!(api.stdout(sb, "cat /tmp/note.txt").await, "hello from vi\n");
    let z = "for i in $(seq 1200); do test -s /tmp/z && break; sleep 0.1; done; cat /tmp/z";
    assert_eq!(
        api.stdout(sb, z).await,
        "tmux-kept\n",
        "the detached session ran the keys sent to it"
    );
    // The shell is a background process with a terminal; closing the socket hangs up on it.
    let pid = t.pid;
    let view = api
        .ok("GET", &format!("/v1/sandboxes/{sb}/processes/{pid}"), None, 200)
        .await;
    assert_eq!(
        (view["pty"].clone(), view["state"].clone()),
        (json!(true), json!("running"))
    );
    t.socket.close(None).await.unwrap();
    let ended = api
        .ok(
            "POST",
            &format!("/v1/sandboxes/{sb}/processes/{pid}/wait?timeout=60"),
            None,
            200,
        )
        .await;
    assert_eq!(ended["state"], "exited", "hung up: {ended}");
    // A kept terminal (keep=true) survives its socket, and a second socket attaches to it,
    // replaying what it printed.
    let mut kept = Terminal::open(url, sb, "keep=true&command=bash").await;
    kept.run("echo kept-$((40+2))", "kept-42").await;
    let pid = kept.pid;
    drop(kept);
    let mut again = Terminal::open(url, sb, &format!("pid={pid}&rows=30&cols=90")).await;
    again.until("kept-42").await;
    again.run("stty size | sed 's/ /x/'", "30x90").await;
    again.keys("exit\n").await;
    again.until("<exit 0>").await;
    // Attaching to a process without a terminal, or asking for both, is refused up front.
    let plain = api
        .ok(
            "POST",
            &format!("/v1/sandboxes/{sb}/processes"),
            Some(json!({ "command": "sleep 60" })),
            201,
        )
        .await["pid"]
        .clone();
    for (query, status) in [
        (format!("pid={plain}"), 409),
        (format!("pid={plain}&command=ls"), 400),
        ("rows=0".to_string(), 400),
        ("nonsense=1".to_string(), 400),
    ] {
        let ws = format!("{}/v1/sandboxes/{sb}/pty?{query}", url.replacen("http", "ws", 1));
        match tokio_tungstenite::connect_async(ws).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                assert_eq!(response.status().as_u16(), status, "{query}")
            }
            other => panic!("{query}: {:?}", other.map(|_| ())),
        }
    }
    // A terminal is a WebSocket: a plain GET is told so.
    let (status, body) = api.call("GET", &format!("/v1/sandboxes/{sb}/pty"), None).await;
    assert!(
        status >= 400 && body.to_string().contains("WebSocket"),
        "{status} {body}"
    );
}

/// A client that never reads: the program runs on (its output overflows the ring, not the
/// service), the sandbox answers, and closing the socket hangs up on it.
async fn a_client_that_never_reads(url: &str, api: &Api, sb: &str) {
    let t = Terminal::open(url, sb, "command=yes+flood").await;
    let pid = t.pid;
    let path = format!("/v1/sandboxes/{sb}/processes/{pid}");
    let started = Instant::now();
    loop {
        let view = api.ok("GET", &path, None, 200).await;
        if view["stdout_bytes"].as_u64().unwrap() > 4 << 20 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(300), "{view}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(api.stdout(sb, "echo still-here").await, "still-here\n");
    let chunk = api
        .ok("GET", &format!("{path}/output?offset=0&max=16"), None, 200)
        .await;
    assert!(chunk["dropped"].as_u64().unwrap() > 0, "{chunk}");
    let mut other = Terminal::open(url, sb, "").await;
    other.run("echo other-$((1+1))", "other-2").await;
    drop(other);
    drop(t);
    let ended = api.ok("POST", &format!("{path}/wait?timeout=60"), None, 200).await;
    assert_eq!(ended["state"], "exited", "{ended}");
}

/// A WebSocket echo server of the standard library alone (the python image has no packages).
const ECHO_SERVER: &str = r#"
import base64, hashlib, socket, struct, threading
def exact(c, n):
    b = b""
    while len(b) < n:
        part = c.recv(n - len(b))
        if not part:
            raise EOFError
        b += part
    return b
def frame(opcode, payload):
    n = len(payload)
    size = bytes([n]) if n < 126 else (bytes([126]) + struct.pack(">H", n) if n < 65536 else bytes([127]) + struct.pack(">Q", n))
    return bytes([0x80 | opcode]) + size + payload
def serve(c):
    head = b""
    while b"\r\n\r\n" not in head:
        head += c.recv(4096)
    key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key")][0]
    accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    try:
        while True:
            b0, b1 = exact(c, 2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", exact(c, 2))[0]
            elif n == 127:
                n = struct.unpack(">Q", exact(c, 8))[0]
            mask = exact(c, 4) if b1 & 0x80 else b"\0\0\0\0"
            data = bytes(x ^ mask[i % 4] for i, x in enumerate(exact(c, n)))
            if b0 & 0x0F == 8:
                c.sendall(frame(8, b""))
                return
            c.sendall(frame(b0 & 0x0F, (b"echo: " if b0 & 0x0F == 1 else b"") + data))
    except EOFError:
        pass
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8765))
s.listen()
while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
"#;

/// A WebSocket through an open port: the upgrade, then messages both ways, as they are.
async fn a_websocket_through_a_port(api: &Api, sb: &str) {
    let written = api
        .ok(
            "POST",
            &format!("/v1/sandboxes/{sb}/exec"),
            Some(json!({ "command": "cat > /tmp/ws.py", "stdin": ECHO_SERVER })),
            200,
        )
        .await;
    assert_eq!(written["exit_code"], 0, "{written}");
    let server = api
        .ok(
            "POST",
            &format!("/v1/sandboxes/{sb}/processes"),
            Some(json!({ "argv": ["python3", "/tmp/ws.py"] })),
            201,
        )
        .await["pid"]
        .clone();
    let port = api
        .ok(
            "POST",
            &format!("/v1/sandboxes/{sb}/ports"),
            Some(json!({ "port": 8765 })),
            201,
        )
        .await;
    let ws = format!(
        "ws://{}/chat?farm_token={}",
        port["address"].as_str().unwrap(),
        port["token"].as_str().unwrap()
    );
    let started = Instant::now();
    let mut socket = loop {
        match tokio_tungstenite::connect_async(ws.as_str()).await {
            Ok((socket, response)) => {
                assert_eq!(response.status().as_u16(), 101);
                break socket;
            }
            Err(e) => {
                if started.elapsed() > Duration::from_secs(120) {
                    let path = format!("/v1/sandboxes/{sb}/processes/{server}/output?stream=stderr");
                    panic!(
                        "never upgraded: {e}; the server: {}",
                        api.ok("GET", &path, None, 200).await
                    );
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    socket.send(Message::Text("hi".into())).await.unwrap();
    let echo = socket.next().await.unwrap().unwrap();
    assert_eq!(echo.to_text().unwrap(), "echo: hi");
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    socket.send(Message::Binary(big.clone().into())).await.unwrap();
    let echo = socket.next().await.unwrap().unwrap();
    assert_eq!(echo.into_data().to_vec(), big, "200 KB each way, byte for byte");
    socket.close(None).await.unwrap();
}

async fn folders_without_exec(api: &Api, sb: &str) {
    api.stdout(sb,
        "mkdir -p /tmp/d/sub && printf hello > /tmp/d/b.txt && chmod 640 /tmp/d/b.txt && ln -s /etc/hostname /tmp/d/link",
    )
    .await;
    let listing = api
        .ok("GET", &format!("/v1/sandboxes/{sb}/entries?path=/tmp/d"), None, 200)
        .await;
    let names: Vec<(&str, &str)> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["type"].as_str().unwrap()))
        .collect();
    assert_eq!(names, [("b.txt", "file"), ("link", "symlink"), ("sub", "dir")]);
    assert_eq!(listing["entries"][0]["size"], 5);
    assert_eq!(listing["entries"][0]["mode"], 0o640);
    assert_eq!(listing["entries"][1]["target"], "/etc/hostname");
    let limited = api
        .ok(
            "GET",
            &format!("/v1/sandboxes/{sb}/entries?path=/tmp/d&max=1"),
            None,
            200,
        )
        .await;
    assert_eq!(limited["truncated"], true);
    let stat = api
        .ok("GET", &format!("/v1/sandboxes/{sb}/stat?path=/tmp/d/link"), None, 200)
        .await;
    assert_eq!(
        (stat["type"].clone(), stat["target"].clone()),
        (json!("symlink"), json!("/etc/hostname"))
    );
    for (path, status) in [
        ("stat?path=/tmp/none", 404),
        ("entries?path=/tmp/none", 404),
        ("entries?path=tmp/d", 400),
        ("entries?path=/tmp/d&max=0", 400),
        ("entries?path=/tmp/d/b.txt", 400),
        ("stat", 400),
    ] {
        let (got, body) = api.call("GET", &format!("/v1/sandboxes/{sb}/{path}"), None).await;
        assert_eq!(got, status, "{path}: {body}");
    }
}

async fn timers_filters_and_branches(api: &Api, env: &str, sb: &str) {
    let path = format!("/v1/sandboxes/{sb}/timeout");
    let view = api
        .ok(
            "POST",
            &path,
            Some(json!({ "idle_timeout_secs": 300, "expires_in_secs": 1800 })),
            200,
        )
        .await;
    assert_eq!(view["idle_timeout_secs"], 300);
    let left = view["expires_at_ms"].as_u64().unwrap() as i64 - common_now_ms();
    assert!((1_700_000..=1_800_000).contains(&left), "{left} ms left: {view}");
    for (body, field) in [
        (json!({ "idle_timeout_secs": 601 }), "idle_timeout_secs"),
        (json!({ "lifetime_secs": 3601 }), "lifetime_secs"),
        (json!({ "expires_in_secs": 3600 }), "expires_in_secs"),
        (json!({}), "idle_timeout_secs"),
        (json!({ "forever": true }), ""),
    ] {
        let (status, answer) = api.call("POST", &path, Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer["error"].as_str().unwrap().contains(field), "{body}: {answer}");
    }
    let brief = sandbox(api, env, json!({ "owner": "bob" })).await;
    // The list, filtered.
    let owners = |list: &Value| -> Vec<String> {
        list["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["metadata"]["owner"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let ann = api.ok("GET", "/v1/sandboxes?metadata.owner=ann", None, 200).await;
    assert_eq!(owners(&ann), ["ann"]);
    let running = api.ok("GET", "/v1/sandboxes?state=running", None, 200).await;
    assert_eq!(running["sandboxes"].as_array().unwrap().len(), 2);
    let paused = api.ok("GET", "/v1/sandboxes?state=paused", None, 200).await;
    assert_eq!(paused["sandboxes"], json!([]));
    let (status, _) = api.call("GET", "/v1/sandboxes?owner=ann", None).await;
    assert_eq!(status, 400);
    // A short life ends it.
    api.ok(
        "POST",
        &format!("/v1/sandboxes/{brief}/timeout"),
        Some(json!({ "expires_in_secs": 2 })),
        200,
    )
    .await;
    let started = Instant::now();
    while api.call("GET", &format!("/v1/sandboxes/{brief}"), None).await.0 != 404 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "its lifetime never ended it"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Three branches in one call, each with the parent's files.
    api.stdout(sb, "echo before-branch > /tmp/mark").await;
    let branched = api
        .ok(
            "POST",
            &format!("/v1/sandboxes/{sb}/branch"),
            Some(json!({ "count": 3 })),
            201,
        )
        .await;
    let children = branched["sandboxes"].as_array().unwrap();
    assert_eq!(children.len(), 3, "{branched}");
    for child in children {
        assert_eq!(child["parent"], sb);
        assert_eq!(child["metadata"]["owner"], "ann", "metadata is inherited");
        let id = child["id"].as_str().unwrap();
        assert_eq!(api.stdout(id, "cat /tmp/mark").await, "before-branch\n");
        api.ok("DELETE", &format!("/v1/sandboxes/{id}"), None, 200).await;
    }
    for count in [0, 33] {
        let (status, body) = api
            .call(
                "POST",
                &format!("/v1/sandboxes/{sb}/branch"),
                Some(json!({ "count": count })),
            )
            .await;
        assert_eq!(status, 400, "{count}: {body}");
    }
    let one = api.ok("POST", &format!("/v1/sandboxes/{sb}/branch"), None, 201).await;
    assert_eq!(one["parent"], sb, "no body: one branch, as before");
    let one = one["id"].as_str().unwrap();
    api.ok("DELETE", &format!("/v1/sandboxes/{one}"), None, 200).await;
    // A retried branch with its Idempotency-Key makes nothing new; another body is a 422.
    let path = format!("/v1/sandboxes/{sb}/branch");
    let key = [("Idempotency-Key", "branch-twice")];
    let body = json!({ "count": 2 });
    let (first, _, made) = api.send("POST", &path, Some(body.clone()), &key).await;
    let (again, _, retried) = api.send("POST", &path, Some(body), &key).await;
    assert_eq!((first, again), (201, 200));
    let ids = |bytes: &[u8]| -> Vec<String> {
        let v: Value = serde_json::from_slice(bytes).unwrap();
        v["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&made), ids(&retried));
    assert_eq!(ids(&made).len(), 2);
    let (other, _, _) = api.send("POST", &path, Some(json!({ "count": 3 })), &key).await;
    assert_eq!(other, 422);
    for id in ids(&made) {
        api.ok("DELETE", &format!("/v1/sandboxes/{id}"), None, 200).await;
    }
    api.ok("DELETE", &format!("/v1/sandboxes/{sb}"), None, 200).await;
}

fn common_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
