//! The sandbox API of `farm serve` against real guests (`configs/sandboxes.toml`, the minimal
//! image): environments from an image and from an uploaded Dockerfile context (reused by
//! content; a failed build names its line; host paths refused), sandboxes with their
//! settings, exec whole and streamed, files and folders, branch, pause and resume,
//! snapshot into a new environment, idle expiry, deletes, bad requests naming their field,
//! and no QEMU left after the service stops.

mod common;
use common::serve::{farm_serve, sse_event, stop, Api};
use common::{assert_no_qemu_of, pytest_args, tar_of};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

impl Api {
    async fn raw(&self, method: &str, path: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let resp = self
            .http
            .request(method, format!("{}{path}", self.url))
            .body(body)
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.bytes().await.unwrap().to_vec())
    }

    /// Waits for an environment's build to end; returns it.
    async fn built(&self, id: &str) -> Value {
        let started = Instant::now();
        let mut offset = 0;
        loop {
            let logs = self
                .ok(
                    "GET",
                    &format!("/v1/environments/{id}/logs?offset={offset}&wait=30"),
                    None,
                    200,
                )
                .await;
            offset = logs["next"].as_u64().unwrap() as usize;
            if logs["state"] != "building" {
                return self.ok("GET", &format!("/v1/environments/{id}"), None, 200).await;
            }
            assert!(
                started.elapsed() < Duration::from_secs(900),
                "the build of {id} never ended"
            );
        }
    }
}

/// Server-sent events as (event, data) pairs.
fn events(body: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for block in body.split("\n\n") {
        if let Some((name, data)) = sse_event(block) {
            out.push((name, serde_json::from_str(&data).unwrap()));
        }
    }
    out
}

/// The snapshot store `farm serve` uses here (its default).
fn store_dir() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("FARM_SNAPSHOT_DIR") {
        return dir.into();
    }
    std::env::var_os("FARM_CACHE_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/farm"))
        .join("snapshots")
}

/// Waits for `path` to be removed (the service removes a snapshot once its last holder is done).
async fn gone_soon(path: &std::path::Path) {
    for _ in 0..600 {
        if !path.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{} is still there", path.display());
}

/// An HTTP server on the host's loopback: `/hello` answers, anything else redirects to the
/// address set in the returned cell. Its port, and the cell.
fn upstream_with_redirect() -> (u16, std::sync::Arc<std::sync::Mutex<String>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let location = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let to = location.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let mut header = String::new();
            while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                header.clear();
            }
            let answer = if line.contains(" /hello ") {
                "HTTP/1.1 200 OK\r\nContent-Length: 20\r\nConnection: close\r\n\r\nhello from upstream\n".to_string()
            } else {
                let location = to.lock().unwrap().clone();
                format!("HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            };
            let _ = (&stream).write_all(answer.as_bytes());
        }
    });
    (port, location)
}

/// A sandbox whose policy allows `"*"` (and names one upstream by address and port) tries
/// every way to the host: every spelling of loopback, the host's other addresses, a name that
/// resolves to loopback, the cloud metadata address, a redirect from the allowed upstream to
/// the service, CONNECT to a private address. Each gets the proxy's 403 (the service here has
/// no token: reaching it would answer 200 with its sandboxes); the named upstream still works.
async fn a_star_policy_never_reaches_the_host(api: &Api, env_id: &str, service_port: &str, upstream: u16) {
    let star = api
        .ok(
            "POST",
            "/v1/sandboxes",
            Some(json!({ "environment": env_id, "network": "star" })),
            201,
        )
        .await;
    let star = star["id"].as_str().unwrap().to_string();
    let allowed = api
        .stdout(&star, &format!("wget -q -O- http://127.0.0.1:{upstream}/hello"))
        .await;
    assert_eq!(allowed, "hello from upstream\n");
    let host_addresses = std::process::Command::new("hostname").arg("-I").output().unwrap();
    let mut hosts: Vec<String> = [
        "127.0.0.1",
        "localhost",
        "127.1",
        "2130706433",
        "0x7f000001",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "0.0.0.0",
        "host.farm.internal",
    ]
    .map(String::from)
    .to_vec();
    for address in String::from_utf8_lossy(&host_addresses.stdout).split_whitespace() {
        hosts.push(if address.contains(':') {
            format!("[{address}]")
        } else {
            address.to_string()
        });
    }
    let mut targets: Vec<String> = hosts
        .iter()
        .map(|h| format!("http://{h}:{service_port}/v1/sandboxes"))
        .collect();
    targets.push("http://169.254.169.254/latest/meta-data/".into());
    // Allowed, then redirected to the service: the guest's next hop is refused.
    targets.push(format!("http://127.0.0.1:{upstream}/redirect"));
    let mut script = String::new();
    for t in &targets {
        script.push_str(&format!("echo '== {t}'; wget -q -O- '{t}' 2>&1; echo rc=$?\n"));
    }
    for t in ["10.0.0.1:443", &format!("127.0.0.1:{service_port}")] {
        script.push_str(&format!(
            "echo '== CONNECT {t}'; (printf 'CONNECT {t} HTTP/1.1\\r\\n\\r\\n'; sleep 5) | timeout 20 nc 127.0.0.1 3128 2>&1; echo rc=$?\n"
        ));
    }
    let out = api.stdout(&star, &script).await;
    let blocks: Vec<&str> = out.split("== ").skip(1).collect();
    assert_eq!(blocks.len(), targets.len() + 2, "{out}");
    for block in blocks {
        assert!(
            block.contains("403") && !block.contains("\"sandboxes\"") && !block.contains("200 Connection established"),
            "not refused by the proxy: {block}"
        );
    }
    api.ok("DELETE", &format!("/v1/sandboxes/{star}"), None, 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environments_sandboxes_and_every_verb() {
    let dir = tempfile::tempdir().unwrap();
    let (out, run_dir) = (dir.path().join("out"), dir.path().join("run"));
    let config = dir.path().join("sandboxes.toml");
    // An upstream the "star" policy names explicitly (as a test stands in for the internet),
    // which also redirects to the service's own API.
    let (upstream, redirect_to) = upstream_with_redirect();
    std::fs::write(
        &config,
        format!(
            "[serve]\nsuites = []\n[serve.sandboxes]\nwarm_pool = 1\n\
             [serve.sandboxes.networks.loopback]\nallow = [\"127.0.0.1:9\"]\n\
             [serve.sandboxes.networks.star]\nallow = [\"*\", \"127.0.0.1:{upstream}\"]\n"
        ),
    )
    .unwrap();
    let (mut service, url) = farm_serve(&config, &out, &run_dir, "127.0.0.1:0", None);
    *redirect_to.lock().unwrap() = format!("{url}/v1/sandboxes");
    let api = Api::new(&url, None);

    // The OpenAPI document names the routes.
    let doc = api.ok("GET", "/v1/openapi.json", None, 200).await;
    assert!(doc["paths"]["/v1/sandboxes/{id}/exec"]["post"].is_object());

    // An environment from an image: built in the background, then found again by content.
    let created = api
        .ok("POST", "/v1/environments", Some(json!({ "image": "minimal" })), 202)
        .await;
    let env_id = created["id"].as_str().unwrap().to_string();
    let env = api.built(&env_id).await;
    assert_eq!(env["state"], "ready", "{env}");
    let again = api
        .ok("POST", "/v1/environments", Some(json!({ "image": "minimal" })), 200)
        .await;
    assert_eq!(again["id"], env_id);
    for (body, field) in [
        (json!({ "image": "oci-archive:/etc/passwd" }), "image"),
        (json!({ "image": "/srv/rootfs" }), "image"),
        (json!({}), "image"),
        (json!({ "image": "minimal", "cpus": 0 }), "cpus"),
        (json!({ "image": "minimal", "colour": "red" }), "colour"),
        (json!({ "dockerfile": { "context": "ctx-00" } }), "dockerfile.context"),
    ] {
        let (status, v) = api.call("POST", "/v1/environments", Some(body.clone())).await;
        assert!(status == 400 || status == 404, "{body}: {status} {v}");
        assert!(
            v["field"].as_str().unwrap_or("").contains(field) || v["error"].as_str().unwrap().contains(field),
            "{body}: {v}"
        );
    }

    // Bad sandbox requests name their field; nothing is made. Every field has a bound, and
    // the answer names the field, the bound and the value.
    let wide_metadata = json!({ "notes": "x".repeat(200_000) });
    let many_keys: serde_json::Map<String, Value> = (0..65).map(|i| (format!("k{i}"), json!("v"))).collect();
    for (body, field, bound) in [
        (
            json!({ "environment": env_id, "disk_mib": 1_000_000_000_000u64 }),
            "disk_mib",
            "1 to 1048576 MiB",
        ),
        (
            json!({ "environment": env_id, "metadata": wide_metadata }),
            "metadata",
            "65536 bytes",
        ),
        (
            json!({ "environment": env_id, "metadata": many_keys }),
            "metadata",
            "at most 64 keys",
        ),
        (
            json!({ "environment": env_id, "lifetime_secs": 1_000_000_000u64 }),
            "lifetime_secs",
            "1 to 86400",
        ),
        (
            json!({ "environment": env_id, "idle_timeout_secs": 100_000 }),
            "idle_timeout_secs",
            "1 to 600",
        ),
        (
            json!({ "environment": env_id, "workdir": format!("/{}", "d".repeat(5000)) }),
            "workdir",
            "at most 4095 bytes",
        ),
        (
            json!({ "environment": env_id, "env": { "BIG": "v".repeat(20_000) } }),
            "env",
            "16384 bytes",
        ),
        (
            json!({ "environment": env_id, "memory_mib": 1u64 << 40 }),
            "memory_mib",
            "128 to 262144",
        ),
    ] {
        let (status, v) = api.call("POST", "/v1/sandboxes", Some(body.clone())).await;
        assert_eq!((status, v["field"].as_str()), (400, Some(field)), "{v}");
        assert!(v["error"].as_str().unwrap().contains(bound), "{field}: {v}");
    }
    let (status, v) = api
        .call(
            "POST",
            "/v1/environments",
            Some(json!({ "image": "minimal", "disk_mib": 1u64 << 50 })),
        )
        .await;
    assert_eq!((status, v["field"].as_str()), (400, Some("disk_mib")), "{v}");
    let (status, v) = api
        .call("GET", &format!("/v1/sandboxes/{}", "x".repeat(300)), None)
        .await;
    assert_eq!((status, v["field"].as_str()), (400, Some("id")), "{v}");
    for (body, field) in [
        (json!({ "environment": "env-nope" }), "environment"),
        (json!({ "environment": env_id, "cpus": 4 }), "cpus"),
        (json!({ "environment": env_id, "memory_mib": 4096 }), "memory_mib"),
        (json!({ "environment": env_id, "network": "internet" }), "network"),
        (json!({ "environment": env_id, "workdir": "rel" }), "workdir"),
        (
            json!({ "environment": env_id, "idle_timeout_secs": 0 }),
            "idle_timeout_secs",
        ),
        (json!({ "environment": env_id, "gpus": 1 }), "gpus"),
        // A client names a policy of the service's; it never brings its own rules.
        (
            json!({ "environment": env_id, "network": { "allow": ["*"] } }),
            "network",
        ),
    ] {
        let (status, v) = api.call("POST", "/v1/sandboxes", Some(body.clone())).await;
        assert!((400..500).contains(&status), "{body}: {status} {v}");
        assert!(v.to_string().contains(field), "{body}: {v}");
    }
    assert_eq!(api.ok("GET", "/v1/sandboxes", None, 200).await["sandboxes"], json!([]));

    // A sandbox with its settings; a retried create (same key) is the same sandbox.
    let body = json!({ "environment": env_id, "env": { "GREETING": "hi" }, "workdir": "/tmp", "network": "loopback",
                       "metadata": { "trial": "7" } });
    let (status, _, made) = api
        .send(
            "POST",
            "/v1/sandboxes",
            Some(body.clone()),
            &[("Idempotency-Key", "k1")],
        )
        .await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&made));
    let sb: Value = serde_json::from_slice(&made).unwrap();
    let id = sb["id"].as_str().unwrap().to_string();
    let (status, _, retried) = api
        .send("POST", "/v1/sandboxes", Some(body), &[("Idempotency-Key", "k1")])
        .await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_slice::<Value>(&retried).unwrap()["id"], id.as_str());
    assert_eq!(sb["metadata"]["trial"], "7");
    assert_eq!(sb["network"], "loopback");
    // Sessions and sandboxes share one book of forks, but a sandbox's id is no session's.
    for (method, path, body) in [
        ("GET", format!("/v1/sessions/{id}"), None),
        (
            "POST",
            format!("/v1/sessions/{id}/exec"),
            Some(json!({ "command": "true" })),
        ),
        ("POST", format!("/v1/sessions/{id}/pause"), None),
        ("DELETE", format!("/v1/sessions/{id}"), None),
    ] {
        let (status, v) = api.call(method, &path, body).await;
        assert_eq!(status, 404, "{method} {path}: {v}");
    }

    // exec: shell and argv, env, cwd, stdin, timeouts, caps.
    assert_eq!(api.stdout(&id, "echo $GREETING; pwd").await, "hi\n/tmp\n");
    let argv = api
        .ok("POST", &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({ "argv": ["/bin/sh", "-c", "cat; echo \"$X\" >&2; exit 3"], "stdin": "in", "env": { "X": "y" }, "cwd": "/" })), 200)
        .await;
    assert_eq!(
        (
            argv["exit_code"].clone(),
            argv["stdout"].clone(),
            argv["stderr"].clone()
        ),
        (json!(3), json!("in"), json!("y\n"))
    );
    let slow = api
        .ok(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({ "command": "sleep 30", "timeout_secs": 1 })),
            200,
        )
        .await;
    assert_eq!(
        (slow["timed_out"].clone(), slow["exit_code"].clone()),
        (json!(true), Value::Null),
        "{slow}"
    );
    let chatty = api
        .ok(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({ "command": "yes | head -c 100000", "max_output_bytes": 1000 })),
            200,
        )
        .await;
    assert_eq!(
        (
            chatty["stdout"].as_str().unwrap().len(),
            chatty["stdout_truncated"].clone(),
            chatty["output_cap_bytes"].clone()
        ),
        (1000, json!(true), json!(1000))
    );
    let (status, v) = api
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({ "command": "a", "argv": ["b"] })),
        )
        .await;
    assert_eq!((status, v["field"].clone()), (400, json!("argv")));

    // A sandbox reaches only what its named policy allows: never the service's own API on
    // the host, with its policy or without any network.
    let port = url.rsplit(':').next().unwrap().trim_end_matches('/');
    let probe = format!("wget -O- http://host.farm.internal:{port}/v1/sandboxes 2>&1; echo rc=$?");
    let through_proxy = api.stdout(&id, &probe).await;
    assert!(
        through_proxy.contains("403") && !through_proxy.contains("rc=0"),
        "refused by the proxy: {through_proxy}"
    );
    let offline = api
        .ok("POST", "/v1/sandboxes", Some(json!({ "environment": env_id })), 201)
        .await;
    let offline = offline["id"].as_str().unwrap().to_string();
    let direct = api.stdout(&offline, &probe.replace("wget", "http_proxy= wget")).await;
    assert!(
        !direct.contains("\"sandboxes\"") && !direct.contains("rc=0"),
        "{direct}"
    );
    api.ok("DELETE", &format!("/v1/sandboxes/{offline}"), None, 200).await;
    a_star_policy_never_reaches_the_host(&api, &env_id, port, upstream).await;
    let (status, v) = api
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({ "command": "x".repeat(200_000) })),
        )
        .await;
    assert_eq!((status, v["field"].as_str()), (400, Some("command")), "{v}");

    // A streamed command: output as it comes, then its end.
    let (status, headers, body) = api
        .send(
            "POST",
            &format!("/v1/sandboxes/{id}/exec/stream"),
            Some(json!({ "command": "for i in 1 2 3; do echo line$i; sleep 1.5; done; echo oops >&2; exit 4" })),
            &[],
        )
        .await;
    assert_eq!(status, 200);
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let got = events(&String::from_utf8(body).unwrap());
    let text = |kind: &str| -> String {
        got.iter()
            .filter(|(e, _)| e == kind)
            .map(|(_, d)| d["data"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(text("stdout"), "line1\nline2\nline3\n", "{got:?}");
    assert_eq!(text("stderr"), "oops\n");
    assert!(
        got.iter().filter(|(e, _)| e == "stdout").count() >= 2,
        "the output came in pieces: {got:?}"
    );
    let (last, end) = got.last().unwrap();
    assert_eq!((last.as_str(), end["exit_code"].clone()), ("exit", json!(4)));
    assert_eq!(
        api.stdout(&id, "ls -a /tmp | grep -c farm-stream || true").await,
        "0\n",
        "the stream's folder is removed"
    );

    // Files and folders.
    let (status, _) = api
        .raw(
            "PUT",
            &format!("/v1/sandboxes/{id}/files?path=/srv/a/b.txt&mode=600"),
            b"bytes\x00\xff".to_vec(),
        )
        .await;
    assert_eq!(status, 200);
    let (status, read) = api
        .raw("GET", &format!("/v1/sandboxes/{id}/files?path=/srv/a/b.txt"), vec![])
        .await;
    assert_eq!((status, read.as_slice()), (200, b"bytes\x00\xff".as_slice()));
    assert_eq!(api.stdout(&id, "stat -c %a /srv/a/b.txt").await, "600\n");
    let (status, missing) = api
        .raw("GET", &format!("/v1/sandboxes/{id}/files?path=/nope"), vec![])
        .await;
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&missing));
    let (status, _) = api
        .raw("GET", &format!("/v1/sandboxes/{id}/files?path=relative"), vec![])
        .await;
    assert_eq!(status, 400);
    let archive = tar_of(&[("top.txt", "top\n"), ("sub/inner.txt", "inner\n")]);
    let (status, v) = api
        .raw("PUT", &format!("/v1/sandboxes/{id}/folders?path=/srv/tree"), archive)
        .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&v));
    assert_eq!(
        api.stdout(&id, "cat /srv/tree/top.txt /srv/tree/sub/inner.txt").await,
        "top\ninner\n"
    );
    let (status, packed) = api
        .raw("GET", &format!("/v1/sandboxes/{id}/folders?path=/srv/tree"), vec![])
        .await;
    assert_eq!(status, 200);
    let mut names: Vec<String> = tar::Archive::new(packed.as_slice())
        .entries()
        .unwrap()
        .map(|e| {
            e.unwrap()
                .path()
                .unwrap()
                .to_string_lossy()
                .trim_start_matches("./")
                .trim_end_matches('/')
                .to_string()
        })
        .filter(|n| !n.is_empty())
        .collect();
    names.sort();
    assert_eq!(names, ["sub", "sub/inner.txt", "top.txt"]);
    let (status, _) = api
        .raw("GET", &format!("/v1/sandboxes/{id}/folders?path=/no/such"), vec![])
        .await;
    assert_eq!(status, 404);

    // Branch: the child continues from the parent's state; the two go on apart.
    api.stdout(&id, "mkdir -p /srv && echo before > /srv/state").await;
    let child = api.ok("POST", &format!("/v1/sandboxes/{id}/branch"), None, 201).await;
    let child = child["id"].as_str().unwrap().to_string();
    assert_eq!(
        api.stdout(&child, "cat /srv/state; echo $GREETING").await,
        "before\nhi\n"
    );
    api.stdout(&child, "echo child > /srv/state").await;
    assert_eq!(api.stdout(&id, "cat /srv/state").await, "before\n");

    // Reset: back to the environment's snapshot, same id. The sandbox forked from the
    // environment is put back in place (the same VM); the branch gets a new fork, and says why.
    api.stdout(&id, "echo planted > /srv/planted; sleep 1000 >/dev/null 2>&1 &")
        .await;
    let reset = api.ok("POST", &format!("/v1/sandboxes/{id}/reset"), None, 200).await;
    assert_eq!(reset["in_place"], true, "{reset}");
    assert_eq!(reset["sandbox"]["id"], id.as_str());
    let look = "cat /srv/planted /srv/state 2>/dev/null; pgrep -x sleep || echo no-sleep; echo $GREETING";
    assert_eq!(api.stdout(&id, look).await, "no-sleep\nhi\n");
    let twig = api.ok("POST", &format!("/v1/sandboxes/{id}/branch"), None, 201).await;
    let twig = twig["id"].as_str().unwrap().to_string();
    api.stdout(
        &twig,
        "mkdir -p /srv; echo planted > /srv/planted; sleep 1000 >/dev/null 2>&1 &",
    )
    .await;
    let reset = api.ok("POST", &format!("/v1/sandboxes/{twig}/reset"), None, 200).await;
    assert_eq!(reset["in_place"], false, "{reset}");
    assert!(reset["why"].as_str().unwrap().contains("branch"), "{reset}");
    assert_eq!(api.stdout(&twig, look).await, "no-sleep\nhi\n");
    api.ok("DELETE", &format!("/v1/sandboxes/{twig}"), None, 200).await;
    api.stdout(&id, "mkdir -p /srv && echo before > /srv/state").await;

    // Pause and resume: processes and files as they were.
    api.stdout(&id, "sleep 1000 >/dev/null 2>&1 & echo $! > /srv/pid").await;
    let paused = api.ok("POST", &format!("/v1/sandboxes/{id}/pause"), None, 200).await;
    assert_eq!(paused["state"], "paused");
    let (status, _) = api
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({ "command": "true" })),
        )
        .await;
    assert_eq!(status, 409);
    let (status, v) = api.call("POST", &format!("/v1/sandboxes/{id}/reset"), None).await;
    assert_eq!(status, 409, "a paused sandbox was reset: {v}");
    let resumed = api.ok("POST", &format!("/v1/sandboxes/{id}/resume"), None, 200).await;
    assert_eq!(resumed["state"], "running");
    assert_eq!(
        api.stdout(&id, "kill -0 $(cat /srv/pid) && echo alive; cat /srv/state")
            .await,
        "alive\nbefore\n"
    );

    // Snapshot into a new environment: set up once, fork N. A resumed sandbox cannot be.
    let (status, v) = api.call("POST", &format!("/v1/sandboxes/{id}/snapshot"), None).await;
    assert_eq!(status, 409, "{v}");
    api.stdout(&child, "echo set-up > /srv/ready").await;
    let snap = api
        .ok("POST", &format!("/v1/sandboxes/{child}/snapshot"), None, 201)
        .await;
    assert_eq!(snap["state"], "ready");
    let snap_id = snap["id"].as_str().unwrap().to_string();
    let mut group = Vec::new();
    for _ in 0..2 {
        let sb = api
            .ok("POST", "/v1/sandboxes", Some(json!({ "environment": snap_id })), 201)
            .await;
        group.push(sb["id"].as_str().unwrap().to_string());
    }
    for sb in &group {
        assert_eq!(api.stdout(sb, "cat /srv/ready").await, "set-up\n");
    }

    // Deletes: an environment with live sandboxes stays; a sandbox goes at once.
    let (status, v) = api.call("DELETE", &format!("/v1/environments/{snap_id}"), None).await;
    assert_eq!(status, 409, "{v}");
    for sb in &group {
        api.ok("DELETE", &format!("/v1/sandboxes/{sb}"), None, 200).await;
    }
    // The sandbox's state is the environment's own: deleting the environment removes it
    // from the store; the branch it was taken from goes once its sandbox ends.
    let own = store_dir().join(snap["snapshot"].as_str().unwrap());
    let manifest: Value = serde_json::from_slice(&std::fs::read(own.join("manifest.json")).unwrap()).unwrap();
    let branch = store_dir().join(manifest["parent"].as_str().unwrap());
    assert_eq!(manifest["label"], "sandbox", "{manifest}");
    api.ok("DELETE", &format!("/v1/environments/{snap_id}"), None, 200)
        .await;
    assert_eq!(
        api.call("GET", &format!("/v1/environments/{snap_id}"), None).await.0,
        404
    );
    gone_soon(&own).await;
    assert!(branch.is_dir(), "the branch went while its sandbox {child} lives");
    api.ok("DELETE", &format!("/v1/sandboxes/{child}"), None, 200).await;
    gone_soon(&branch).await;
    assert_eq!(
        api.call("GET", &format!("/v1/sandboxes/{}", group[0]), None).await.0,
        404
    );

    // A Dockerfile context: built step by step, its files copied; a failing step names its
    // line and output; a host path in FROM is refused.
    let context = tar_of(&[
        ("Dockerfile", "FROM farm:minimal\nARG WHO=nobody\nCOPY app/hello.txt /app/hello.txt\nRUN echo built-by-$WHO > /app/built\nWORKDIR /app\n"),
        ("app/hello.txt", "hello\n"),
    ]);
    let (status, up) = api.raw("POST", "/v1/contexts", context.clone()).await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&up));
    let ctx: Value = serde_json::from_slice(&up).unwrap();
    assert_eq!(ctx["files"], 2);
    let request = json!({ "dockerfile": { "context": ctx["context"], "build_args": { "WHO": "farm" } } });
    let made = api.ok("POST", "/v1/environments", Some(request.clone()), 202).await;
    let built = api.built(made["id"].as_str().unwrap()).await;
    assert_eq!(built["state"], "ready", "{built}");
    let sb = api
        .ok(
            "POST",
            "/v1/sandboxes",
            Some(json!({ "environment": built["id"] })),
            201,
        )
        .await;
    let sb = sb["id"].as_str().unwrap().to_string();
    assert_eq!(
        api.stdout(&sb, "pwd; cat hello.txt built").await,
        "/app\nhello\nbuilt-by-farm\n"
    );
    api.ok("DELETE", &format!("/v1/sandboxes/{sb}"), None, 200).await;
    let (status, up) = api
        .raw(
            "POST",
            "/v1/contexts",
            tar_of(&[(
                "Dockerfile",
                "FROM farm:minimal\nRUN echo going\nRUN echo broken >&2; exit 3\n",
            )]),
        )
        .await;
    assert_eq!(status, 201);
    let broken_ctx: Value = serde_json::from_slice(&up).unwrap();
    let broken = api
        .ok(
            "POST",
            "/v1/environments",
            Some(json!({ "dockerfile": { "context": broken_ctx["context"] } })),
            202,
        )
        .await;
    let broken = api.built(broken["id"].as_str().unwrap()).await;
    assert_eq!(broken["state"], "failed");
    assert_eq!(broken["error"]["dockerfile_line"], 3, "{broken}");
    assert!(
        broken["error"]["output_tail"].as_str().unwrap().contains("broken"),
        "{broken}"
    );
    let (status, _) = api
        .call("POST", "/v1/sandboxes", Some(json!({ "environment": broken["id"] })))
        .await;
    assert_eq!(status, 409);
    let host_ctx: Value = serde_json::from_slice(
        &api.raw("POST", "/v1/contexts", tar_of(&[("Dockerfile", "FROM rootfs:/\n")]))
            .await
            .1,
    )
    .unwrap();
    let host = api
        .ok(
            "POST",
            "/v1/environments",
            Some(json!({ "dockerfile": { "context": host_ctx["context"] } })),
            202,
        )
        .await;
    let host = api.built(host["id"].as_str().unwrap()).await;
    assert_eq!(host["state"], "failed");
    assert!(
        host["error"]["message"].as_str().unwrap().contains("no host paths"),
        "{host}"
    );

    // Idle sandboxes go.
    let idle = api
        .ok(
            "POST",
            "/v1/sandboxes",
            Some(json!({ "environment": env_id, "idle_timeout_secs": 1 })),
            201,
        )
        .await;
    let idle = idle["id"].as_str().unwrap().to_string();
    let started = Instant::now();
    while api.call("GET", &format!("/v1/sandboxes/{idle}"), None).await.0 == 200 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the idle sandbox was never removed"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // A sandbox whose VM dies under a command (here it resets, and QEMU exits): the command
    // ends with farm's reason, whole or streamed, and the sandbox is gone, saying why.
    for streamed in [false, true] {
        let sb = api
            .ok("POST", "/v1/sandboxes", Some(json!({ "environment": env_id })), 201)
            .await;
        let sb = sb["id"].as_str().unwrap().to_string();
        let command = json!({ "command": "sync; sleep 1; reboot -f; sleep 60" });
        if streamed {
            let (status, _, body) = api
                .send("POST", &format!("/v1/sandboxes/{sb}/exec/stream"), Some(command), &[])
                .await;
            assert_eq!(status, 200);
            let events = events(&String::from_utf8_lossy(&body));
            let (kind, data) = events.last().unwrap();
            assert_eq!(kind, "error", "{events:?}");
            assert!(data.to_string().contains("VM died"), "{data}");
        } else {
            let (status, v) = api
                .call("POST", &format!("/v1/sandboxes/{sb}/exec"), Some(command))
                .await;
            assert_eq!(status, 502, "{v}");
            assert!(v["error"].as_str().unwrap().contains("VM died"), "{v}");
        }
        let (status, v) = api.call("GET", &format!("/v1/sandboxes/{sb}"), None).await;
        assert_eq!(status, 410, "{v}");
        assert!(v["error"].as_str().unwrap().contains("VM died"), "{v}");
    }

    // The Python SDK (clients/python): it installs with pip, and its tests pass, the live
    // ones against this service (none skipped).
    let (site, source) = (dir.path().join("site"), dir.path().join("farm-sdk"));
    // From a copy: a build leaves build/ and *.egg-info beside the sources.
    assert!(std::process::Command::new("cp")
        .arg("-r")
        .arg(common::serve::repo().join("clients/python"))
        .arg(&source)
        .status()
        .unwrap()
        .success());
    let pip = tokio::process::Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
        ])
        .args(["--no-build-isolation", "--target"])
        .arg(&site)
        .arg(&source)
        .output()
        .await
        .unwrap();
    assert!(
        pip.status.success(),
        "pip install ./clients/python: {}",
        String::from_utf8_lossy(&pip.stderr)
    );
    let installed = tokio::process::Command::new("python3")
        .args(["-c", "import farm_sdk; print(farm_sdk.__file__)"])
        .env("PYTHONPATH", &site)
        .current_dir(&site)
        .output()
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&installed.stdout).starts_with(&site.display().to_string()),
        "{installed:?}"
    );
    let pytest = tokio::process::Command::new("python3")
        .args(pytest_args(&[
            "clients/python/tests",
            // Harbor's backend needs Harbor's Python: tests/harbor.rs runs it there.
            "--ignore=clients/python/tests/test_harbor.py",
        ]))
        .current_dir(common::serve::repo())
        .env("FARM_TEST_URL", &url)
        .env("FARM_TEST_ENV", &env_id)
        .env_remove("FARM_SERVE_TOKEN")
        .output()
        .await
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&pytest.stdout),
        String::from_utf8_lossy(&pytest.stderr)
    );
    assert!(pytest.status.success(), "the SDK's tests:\n{said}");
    assert!(!said.contains("skipped"), "the SDK's tests:\n{said}");

    // A deleted sandbox's command ends with an error, not a hang.
    let doomed = api
        .ok("POST", "/v1/sandboxes", Some(json!({ "environment": env_id })), 201)
        .await;
    let doomed = doomed["id"].as_str().unwrap().to_string();
    let running = {
        let (url, doomed) = (url.clone(), doomed.clone());
        tokio::spawn(async move {
            Api::new(&url, None)
                .call(
                    "POST",
                    &format!("/v1/sandboxes/{doomed}/exec"),
                    Some(json!({ "command": "touch /tmp/started; sleep 600" })),
                )
                .await
        })
    };
    // Deleted only once the command runs (a request that arrives after the delete is a 404).
    let started = Instant::now();
    while api.stdout(&doomed, "test -e /tmp/started && echo yes || true").await != "yes\n" {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the command never started"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    api.ok("DELETE", &format!("/v1/sandboxes/{doomed}"), None, 200).await;
    let (status, v) = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 410, "{v}");

    // The environment survives a restart, and so do the sandboxes left, paused (their
    // restarts are sandbox_restart.rs's); no QEMU is left.
    let left: Vec<String> = api.ok("GET", "/v1/sandboxes", None, 200).await["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    stop(&mut service);
    assert_no_qemu_of(&run_dir);
    let (mut service, url) = farm_serve(&config, &out, &run_dir, "127.0.0.1:0", None);
    let api = Api::new(&url, None);
    let env = api.ok("GET", &format!("/v1/environments/{env_id}"), None, 200).await;
    assert_eq!(env["state"], "ready");
    let back = api.ok("GET", "/v1/sandboxes", None, 200).await;
    let mut back_ids: Vec<String> = back["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            assert_eq!(s["state"], "paused", "{s}");
            s["id"].as_str().unwrap().to_string()
        })
        .collect();
    let mut left = left;
    left.sort();
    back_ids.sort();
    assert_eq!(back_ids, left);
    for id in &left {
        api.ok("DELETE", &format!("/v1/sandboxes/{id}"), None, 200).await;
    }
    let sb = api
        .ok("POST", "/v1/sandboxes", Some(json!({ "environment": env_id })), 201)
        .await;
    assert_eq!(api.stdout(sb["id"].as_str().unwrap(), "echo again").await, "again\n");
    stop(&mut service);
    assert_no_qemu_of(&run_dir);
}
