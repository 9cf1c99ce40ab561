//! Tenants of `farm serve`, against real guests (the minimal image): two tenants, A and B,
//! with keys made by `farm tenant` while the service runs. B guesses and replays A's ids on
//! every route, uses MCP session tokens, branches A's session over OpenEnv, asks for A's
//! environment, names A's network policy, uses a revoked and an expired key, floods the queue
//! and goes over its quotas. Nothing of A's leaks, and A's work is unharmed. The audit has
//! every call that changed state, and no secret.

mod common;
use common::assert_no_qemu_of;
use common::serve::{farm_serve, farm_tenant, new_key, socket, stop, suite_config, Api, Socket};
use common::tar_of;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};

/// A's things, made as A.
struct Owned {
    env: String,
    sandbox: String,
    session: String,
    session_rollout: String,
    mcp_token: String,
    rollouts: Vec<String>,
    context: String,
}

async fn make_as_a(a: &Api) -> Owned {
    let created = a
        .ok("POST", "/v1/environments", Some(json!({ "image": "minimal" })), 202)
        .await;
    let env = created["id"].as_str().unwrap().to_string();
    a.wait_built(&env).await;
    let sandbox = a
        .ok(
            "POST",
            "/v1/sandboxes",
            Some(json!({ "environment": env, "network": "net-a" })),
            201,
        )
        .await;
    let sandbox = sandbox["id"].as_str().unwrap().to_string();
    a.sh_prints(&sandbox, "echo a-was-here > /tmp/mark; echo ok", "ok")
        .await;
    let session = a
        .ok("POST", "/v1/sessions", Some(json!({ "task_id": "answer" })), 201)
        .await;
    let submitted = a
        .ok(
            "POST",
            "/v1/rollouts",
            Some(json!({ "items": [ { "task_id": "answer", "n": 2, "policy_version": 1,
                "policy": { "kind": "replay", "actions": [ { "kind": "submit", "answer": "42" } ] } } ] })),
            202,
        )
        .await;
    let rollouts = submitted["groups"][0]["rollout_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let uploaded = a
        .http
        .post(format!("{}/v1/contexts", a.url))
        .bearer_auth(a.token.as_ref().unwrap())
        .body(tar_of(&[("Dockerfile", "FROM minimal\nRUN echo a > /a\n")]))
        .send()
        .await
        .unwrap();
    assert_eq!(uploaded.status().as_u16(), 201);
    let context: Value = uploaded.json().await.unwrap();
    Owned {
        env,
        sandbox,
        session: session["session_id"].as_str().unwrap().to_string(),
        session_rollout: session["rollout_id"].as_str().unwrap().to_string(),
        mcp_token: session["mcp"]["token"].as_str().unwrap().to_string(),
        rollouts,
        context: context["context"].as_str().unwrap().to_string(),
    }
}

/// Every route that takes an id, with `ID` for it.
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/v1/sandboxes/ID"),
    ("GET", "/v1/sandboxes/ID/metrics"),
    ("POST", "/v1/sandboxes/ID/workspaces/sync"),
    ("DELETE", "/v1/sandboxes/ID"),
    ("POST", "/v1/sandboxes/ID/exec"),
    ("POST", "/v1/sandboxes/ID/exec/stream"),
    ("GET", "/v1/sandboxes/ID/files?path=/tmp/mark"),
    ("PUT", "/v1/sandboxes/ID/files?path=/tmp/x"),
    ("GET", "/v1/sandboxes/ID/folders?path=/tmp"),
    ("GET", "/v1/sandboxes/ID/stat?path=/tmp"),
    ("GET", "/v1/sandboxes/ID/entries?path=/tmp"),
    ("POST", "/v1/sandboxes/ID/branch"),
    ("POST", "/v1/sandboxes/ID/snapshot"),
    ("POST", "/v1/sandboxes/ID/pause"),
    ("POST", "/v1/sandboxes/ID/resume"),
    ("POST", "/v1/sandboxes/ID/reset"),
    ("POST", "/v1/sandboxes/ID/checkpoint"),
    ("POST", "/v1/sandboxes/ID/timeout"),
    ("POST", "/v1/sandboxes/ID/processes"),
    ("GET", "/v1/sandboxes/ID/processes"),
    ("GET", "/v1/sandboxes/ID/processes/1/output"),
    ("GET", "/v1/sandboxes/ID/pty"),
    ("POST", "/v1/sandboxes/ID/ports"),
    ("GET", "/v1/sandboxes/ID/ports"),
    ("GET", "/v1/sessions/ID"),
    ("DELETE", "/v1/sessions/ID"),
    ("POST", "/v1/sessions/ID/exec"),
    ("POST", "/v1/sessions/ID/write_file"),
    ("POST", "/v1/sessions/ID/branch"),
    ("POST", "/v1/sessions/ID/submit"),
    ("POST", "/v1/sessions/ID/pause"),
    ("POST", "/v1/sessions/ID/resume"),
    ("POST", "/v1/sessions/ID/mcp"),
    ("GET", "/v1/rollouts/ID"),
    ("POST", "/v1/rollouts/ID/cancel"),
    ("GET", "/v1/environments/ID"),
    ("GET", "/v1/environments/ID/logs"),
    ("DELETE", "/v1/environments/ID"),
];

/// B asks for each of A's ids on every route that takes one: each answer is the one for an
/// id that never existed (status and body, the id aside).
async fn b_guesses_a_ids(b: &Api, owned: &Owned) {
    let of_kind = |path: &str| -> Vec<&str> {
        if path.starts_with("/v1/sandboxes/") {
            vec![owned.sandbox.as_str()]
        } else if path.starts_with("/v1/sessions/") {
            vec![owned.session.as_str()]
        } else if path.starts_with("/v1/rollouts/") {
            owned
                .rollouts
                .iter()
                .map(String::as_str)
                .chain([owned.session_rollout.as_str()])
                .collect()
        } else {
            vec![owned.env.as_str()]
        }
    };
    for (method, route) in ROUTES {
        for id in of_kind(route) {
            let body = Some(match route.ends_with("/mcp") {
                true => json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {} }),
                false => json!({ "command": "cat /tmp/mark" }),
            });
            let (status, theirs) = b.call(method, &route.replace("ID", id), body.clone()).await;
            let never = format!("{}-never", &id[..id.len().min(20)]);
            let (never_status, none) = b.call(method, &route.replace("ID", &never), body).await;
            assert_eq!(status, 404, "{method} {route} with A's {id}: {theirs}");
            assert_eq!(never_status, 404, "{method} {route}: {none}");
            assert_eq!(
                theirs.to_string().replace(id, "X"),
                none.to_string().replace(&never, "X"),
                "{method} {route}: A's id and one that never was answer alike"
            );
        }
    }
}

/// B's lists and rows hold nothing of A's; B's metrics are its own series.
async fn b_sees_none_of_a(b: &Api, owned: &Owned) {
    for (path, key) in [
        ("/v1/sandboxes", "sandboxes"),
        ("/v1/sessions", "sessions"),
        ("/v1/environments", "environments"),
        ("/v1/events?limit=1000", "events"),
    ] {
        let list = b.ok("GET", path, None, 200).await;
        let text = list.to_string();
        for id in [&owned.sandbox, &owned.session, &owned.env] {
            assert!(!text.contains(id.as_str()), "{path}: {list}");
        }
        assert!(list[key].is_array(), "{list}");
    }
    let (status, _, rows) = b.send("GET", "/v1/results?cursor=0&max=10000", None, &[]).await;
    assert_eq!(status, 200);
    let rows = String::from_utf8(rows).unwrap();
    for id in &owned.rollouts {
        assert!(!rows.contains(id.as_str()), "B's rows hold A's rollout {id}");
    }
    let (status, _, metrics) = b.send("GET", "/metrics", None, &[]).await;
    assert_eq!(status, 200);
    let metrics = String::from_utf8(metrics).unwrap();
    assert!(metrics.contains("tenant=\"b\""), "{metrics}");
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        assert!(
            line.starts_with("farm_tenant_") && line.contains("tenant=\"b\""),
            "{line}"
        );
    }
    let capacity = b.ok("GET", "/v1/capacity", None, 200).await;
    assert_eq!(
        (capacity["sessions"].as_u64(), capacity["sandboxes"].as_u64()),
        (Some(0), Some(0))
    );
}

/// B names A's ids in request bodies: A's environment, A's build context, A's policy.
async fn b_names_a_ids_in_bodies(b: &Api, owned: &Owned) {
    let theirs = b
        .call("POST", "/v1/sandboxes", Some(json!({ "environment": owned.env })))
        .await;
    let never = b
        .call("POST", "/v1/sandboxes", Some(json!({ "environment": "env-never" })))
        .await;
    assert_eq!(theirs.0, 404, "{}", theirs.1);
    assert_eq!(
        theirs.1.to_string().replace(&owned.env, "X"),
        never.1.to_string().replace("env-never", "X")
    );
    let dockerfile = |context: &str| json!({ "dockerfile": { "context": context } });
    let theirs = b
        .call("POST", "/v1/environments", Some(dockerfile(&owned.context)))
        .await;
    let never = b.call("POST", "/v1/environments", Some(dockerfile("ctx-0000"))).await;
    assert_eq!(
        (theirs.0, theirs.1["field"].clone()),
        (404, json!("dockerfile.context")),
        "{}",
        theirs.1
    );
    assert_eq!(
        theirs.1.to_string().replace(&owned.context, "X"),
        never.1.to_string().replace("ctx-0000", "X")
    );
}

/// OpenEnv's socket, opened with `key`.
async fn openenv_socket(url: &str, key: &str) -> Socket {
    socket(url, "/v1/openenv/ws", key).await
}

/// One message on the socket, and its answer.
async fn openenv_call(ws: &mut Socket, message: Value) -> Value {
    ws.send(tokio_tungstenite::tungstenite::Message::text(message.to_string()))
        .await
        .unwrap();
    let answer = ws.next().await.unwrap().unwrap().into_text().unwrap().to_string();
    serde_json::from_str(&answer).unwrap()
}

/// An OpenEnv reset as B that branches A's session fails as for a session that never was.
async fn b_branches_a_over_openenv(url: &str, b_key: &str, a_session: &str) {
    let mut ws = openenv_socket(url, b_key).await;
    let mut answers = Vec::new();
    for branch in [a_session, "s-never"] {
        answers.push(openenv_call(&mut ws, json!({ "type": "reset", "data": { "branch_of": branch } })).await);
    }
    assert_eq!(answers[0]["type"], "error", "{}", answers[0]);
    assert_eq!(
        answers[0].to_string().replace(a_session, "X"),
        answers[1].to_string().replace("s-never", "X")
    );
}

/// MCP: B's key on A's session's MCP route is a 404; A's MCP token opens that route only.
async fn mcp_tokens(url: &str, b: &Api, owned: &Owned) {
    let list = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list" });
    let path = format!("/v1/sessions/{}/mcp", owned.session);
    assert_eq!(b.call("POST", &path, Some(list.clone())).await.0, 404);
    let agent = Api::new(url, Some(&owned.mcp_token));
    let (status, _, _) = agent
        .send(
            "POST",
            &path,
            Some(list),
            &[("accept", "application/json, text/event-stream")],
        )
        .await;
    assert_eq!(status, 200, "A's MCP token opens A's session's MCP route");
    for (method, other) in [
        ("GET", "/v1/sandboxes".to_string()),
        ("GET", format!("/v1/sessions/{}", owned.session)),
    ] {
        assert_eq!(agent.call(method, &other, None).await.0, 401, "{other}");
    }
}

/// Uploads a build context as the caller: its id.
async fn upload(api: &Api, files: &[(&str, &str)]) -> String {
    let uploaded = api
        .http
        .post(format!("{}/v1/contexts", api.url))
        .bearer_auth(api.token.as_ref().unwrap())
        .body(tar_of(files))
        .send()
        .await
        .unwrap();
    assert_eq!(uploaded.status().as_u16(), 201);
    uploaded.json::<Value>().await.unwrap()["context"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A timing probe: A builds an environment that takes at least 4 s; B asks for the same
/// content and sees a build of its own, still building 2 s later (the build it would have
/// run could not be done), giving nothing away by DELETE either, then ready.
async fn timing_probe(a: &Api, b: &Api) {
    // A step no earlier run has cached (the build's step cache is the host's).
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dockerfile_text = format!("FROM farm:minimal\nRUN sleep 4 && echo {nonce} > /slow\n");
    let files = [("Dockerfile", dockerfile_text.as_str())];
    let dockerfile = |context: &str| json!({ "dockerfile": { "context": context } });
    let context = upload(a, &files).await;
    let made = a.ok("POST", "/v1/environments", Some(dockerfile(&context)), 202).await;
    let env = made["id"].as_str().unwrap().to_string();
    a.wait_built(&env).await;
    assert_eq!(upload(b, &files).await, context, "contexts are content-addressed too");
    let asked = b.ok("POST", "/v1/environments", Some(dockerfile(&context)), 202).await;
    assert_eq!(
        (asked["id"].as_str(), asked["state"].as_str()),
        (Some(env.as_str()), Some("building"))
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let view = b.ok("GET", &format!("/v1/environments/{env}"), None, 200).await;
    assert_eq!(view["state"], "building", "a 4 s build cannot be done in 2 s: {view}");
    let logs = b.ok("GET", &format!("/v1/environments/{env}/logs"), None, 200).await;
    assert_eq!(logs["state"], "building", "{logs}");
    let (status, refused) = b.call("DELETE", &format!("/v1/environments/{env}"), None).await;
    assert_eq!(status, 409, "as a build of B's own still running: {refused}");
    b.wait_built(&env).await;
    let lines = b.ok("GET", &format!("/v1/environments/{env}/logs"), None, 200).await;
    assert!(lines["lines"].as_array().is_some_and(|l| !l.is_empty()), "{lines}");
}

/// B's environment of the same content as A's looks to B like a build of its own.
async fn same_content_looks_built_by_b(b: &Api, owned: &Owned) -> String {
    let asked = Instant::now();
    let mine = b
        .ok("POST", "/v1/environments", Some(json!({ "image": "minimal" })), 202)
        .await;
    assert_eq!(mine["id"], json!(owned.env), "content-addressed: the same id");
    assert_eq!(mine["state"], "building", "{mine}");
    assert_eq!(mine["sandboxes"], 0, "{mine}");
    let since = mine["created_at_ms"].as_u64().unwrap();
    let asked_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        - asked.elapsed().as_millis() as u64;
    assert!(
        since + 1000 >= asked_ms,
        "B's environment dates from B's request: {mine}"
    );
    // Then `building` for as long as A's build took (a sandbox of it is a 409 meanwhile:
    // not asserted, as that time may be a few milliseconds here), then ready.
    b.wait_built(&owned.env).await;
    owned.env.clone()
}

fn service_file(dir: &Path) -> std::path::PathBuf {
    suite_config(
        dir,
        "tenants.toml",
        "concurrency = 2\nmax_sessions = 6\n[serve.sandboxes]\n\
         [serve.sandboxes.networks.net-a]\nallow = [\"127.0.0.1:9\"]\n\
         [serve.sandboxes.networks.net-b]\nallow = [\"127.0.0.1:9\"]\n",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_see_and_touch_only_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let (out, run_dir) = (dir.path().join("out"), dir.path().join("run"));
    let db = out.join("tenants.db");
    farm_tenant(&db, &["add", "a"]);
    farm_tenant(&db, &["add", "b"]);
    farm_tenant(&db, &["grant", "a", "net-a"]);
    farm_tenant(&db, &["grant", "b", "net-b"]);
    let (a_key, _) = new_key(&db, "a", &[]);
    let (mut service, url) = farm_serve(
        &service_file(dir.path()),
        &out,
        &run_dir,
        "127.0.0.1:0",
        Some("operator"),
    );
    // B's key is made while the service runs.
    let (b_key, _) = new_key(&db, "b", &[]);
    let (a, b) = (Api::new(&url, Some(&a_key)), Api::new(&url, Some(&b_key)));
    let operator = Api::new(&url, Some("operator"));

    let owned = make_as_a(&a).await;
    b_guesses_a_ids(&b, &owned).await;
    b_sees_none_of_a(&b, &owned).await;
    b_names_a_ids_in_bodies(&b, &owned).await;
    b_branches_a_over_openenv(&url, &b_key, &owned.session).await;
    mcp_tokens(&url, &b, &owned).await;
    // The operator's token is the default tenant: A's things are not its either, however
    // the id is spelled; and no HEAD gives the length of an answer B may not see.
    assert_eq!(
        operator
            .call("GET", &format!("/v1/sandboxes/{}", owned.sandbox), None)
            .await
            .0,
        404
    );
    let encoded = format!("/v1/sandboxes/%73{}/exec", &owned.sandbox[1..]);
    let (status, v) = operator
        .call("POST", &encoded, Some(json!({ "command": "cat /tmp/mark" })))
        .await;
    assert_eq!(status, 404, "a percent-encoded id reached A's sandbox: {v}");
    assert_eq!(b.send("HEAD", "/v1/environments", None, &[]).await.0, 405);

    // Network policies: B may name only its own.
    let env = same_content_looks_built_by_b(&b, &owned).await;
    let (status, named) = b
        .call(
            "POST",
            "/v1/sandboxes",
            Some(json!({ "environment": env, "network": "net-a" })),
        )
        .await;
    assert_eq!((status, named["field"].clone()), (400, json!("network")), "{named}");
    assert!(
        !named.to_string().contains("net-a\","),
        "no list of others' policies: {named}"
    );
    // B's Idempotency-Key that A used is B's own key.
    let (_, _, first) = a
        .send(
            "POST",
            "/v1/sandboxes",
            Some(json!({ "environment": env })),
            &[("Idempotency-Key", "same")],
        )
        .await;
    let (status, _, second) = b
        .send(
            "POST",
            "/v1/sandboxes",
            Some(json!({ "environment": env, "network": "net-b" })),
            &[("Idempotency-Key", "same")],
        )
        .await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&second));
    let (first, second): (Value, Value) = (
        serde_json::from_slice(&first).unwrap(),
        serde_json::from_slice(&second).unwrap(),
    );
    assert_ne!(first["id"], second["id"]);
    let b_sandbox = second["id"].as_str().unwrap().to_string();
    // A's `force` rebuild of content B uses too looks like a rebuild to A, and is none: B's
    // sandbox of it goes on, and no 409 tells A of B's live sandbox.
    let snapshot = a.ok("GET", &format!("/v1/environments/{env}"), None, 200).await["snapshot"].clone();
    let forced = a
        .ok(
            "POST",
            "/v1/environments",
            Some(json!({ "image": "minimal", "force": true })),
            202,
        )
        .await;
    assert_eq!(forced["state"], "building", "{forced}");
    b.sh_prints(&b_sandbox, "echo still", "still").await;
    a.wait_built(&env).await;
    let after = a.ok("GET", &format!("/v1/environments/{env}"), None, 200).await;
    assert_eq!(after["snapshot"], snapshot, "not rebuilt: {after}");
    // B may not give up its share while it has a sandbox of it (as for its own environment).
    let (status, kept) = b.call("DELETE", &format!("/v1/environments/{env}"), None).await;
    assert_eq!(status, 409, "{kept}");
    b.ok("DELETE", &format!("/v1/sandboxes/{b_sandbox}"), None, 200).await;
    // Then B deleting the environment it shares gives up its own share only.
    timing_probe(&a, &b).await;
    quotas_and_keys(&db, &url, &a, &b, &owned).await;
    b.ok("DELETE", &format!("/v1/environments/{env}"), None, 200).await;
    assert_eq!(b.call("GET", &format!("/v1/environments/{env}"), None).await.0, 404);
    assert_eq!(
        a.ok("GET", &format!("/v1/environments/{env}"), None, 200).await["state"],
        "ready"
    );
    a_is_unharmed(&a, &owned).await;
    a_full_node_says_nothing_of_others(&b).await;
    audit_has_no_secret(&db, &out, &[&a_key, &b_key]);
    stop(&mut service);
    assert_no_qemu_of(&run_dir);
}

/// B fills what is left of the node (`max_sessions = 6`, two of them A's): the refusal that is
/// not about B's quota tells B nothing of the node's figures; B's metrics count its own.
async fn a_full_node_says_nothing_of_others(b: &Api) {
    let mut mine = Vec::new();
    let refusal = loop {
        let (status, v) = b
            .call("POST", "/v1/sessions", Some(json!({ "task_id": "answer" })))
            .await;
        if status != 201 {
            break (status, v);
        }
        mine.push(v["session_id"].as_str().unwrap().to_string());
        assert!(mine.len() <= 6, "max_sessions = 6 never refused");
    };
    assert_eq!(refusal.0, 429, "{}", refusal.1);
    let text = refusal.1["error"].as_str().unwrap();
    assert!(
        text.contains("no room") && !text.chars().any(|c| c.is_ascii_digit()),
        "{text}"
    );
    let (_, _, metrics) = b.send("GET", "/metrics", None, &[]).await;
    let metrics = String::from_utf8(metrics).unwrap();
    let live = format!("farm_tenant_forks{{state=\"live\",tenant=\"b\"}} {}", mine.len());
    assert!(metrics.contains(&live), "{live} in {metrics}");
    for id in mine {
        b.ok("DELETE", &format!("/v1/sessions/{id}"), None, 200).await;
    }
}

/// Quotas (429 naming one), a flood by B while A works, and keys revoked or expired.
async fn quotas_and_keys(db: &Path, url: &str, a: &Api, b: &Api, owned: &Owned) {
    farm_tenant(db, &["quota", "set", "b", "live", "1"]);
    tokio::time::sleep(Duration::from_millis(1200)).await; // the service reads quotas every second
    let env = &owned.env;
    let one = b
        .ok("POST", "/v1/sandboxes", Some(json!({ "environment": env })), 201)
        .await;
    b.over_live_quota(env).await;
    b.ok(
        "DELETE",
        &format!("/v1/sandboxes/{}", one["id"].as_str().unwrap()),
        None,
        200,
    )
    .await;
    farm_tenant(db, &["quota", "set", "b", "live", "none"]);

    // A flood of B's rollouts, then A's: A's start while B's still wait in the queue.
    let sleeper = |n: u32| {
        json!({ "items": [ { "task_id": "double", "n": n, "policy_version": 1,
        "policy": { "kind": "replay", "actions": [ { "kind": "exec", "command": "sleep 10" } ] } } ] })
    };
    b.ok("POST", "/v1/rollouts", Some(sleeper(40)), 202).await;
    let mine = a.ok("POST", "/v1/rollouts", Some(sleeper(2)), 202).await;
    let ids: Vec<String> = mine["groups"][0]["rollout_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let started = Instant::now();
    loop {
        let mut phases: Vec<Value> = Vec::new();
        for id in &ids {
            phases.push(a.ok("GET", &format!("/v1/rollouts/{id}"), None, 200).await);
        }
        if phases.iter().all(|p| p["phase"] != "queued") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "A's rollouts never started: {phases:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let b_capacity = b.ok("GET", "/v1/capacity", None, 200).await;
    assert!(
        b_capacity["queued"].as_u64().unwrap() > 30,
        "A's started ahead of B's flood: {b_capacity}"
    );
    // B cancels its own flood, never A's (same policy version).
    let cancelled = b
        .ok("POST", "/v1/cancel", Some(json!({ "policy_version_below": 2 })), 200)
        .await;
    assert!(cancelled["cancelled"].as_u64().unwrap() >= 30, "{cancelled}");
    for id in &ids {
        let view = a.ok("GET", &format!("/v1/rollouts/{id}"), None, 200).await;
        let cancelled = view["row"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("policy_version below"));
        assert!(!cancelled, "B's cancel reached A's rollout: {view}");
    }
    a.ok("POST", "/v1/cancel", Some(json!({ "policy_version_below": 2 })), 200)
        .await;

    // Requests a second.
    farm_tenant(db, &["quota", "set", "b", "requests_per_second", "3"]);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut refused = None;
    for _ in 0..10 {
        let (status, headers, body) = b.send("GET", "/v1/sandboxes", None, &[]).await;
        if status == 429 {
            refused = Some((headers, body));
            break;
        }
    }
    let (headers, body) = refused.expect("a burst past 3 a second is refused");
    assert!(headers.contains_key("retry-after"));
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["quota"]["name"],
        "requests_per_second"
    );
    farm_tenant(db, &["quota", "set", "b", "requests_per_second", "none"]);
    tokio::time::sleep(Duration::from_millis(1200)).await;

    // A key revoked while the service runs, and one that expired.
    let (spare, spare_id) = new_key(db, "b", &[]);
    let spare = Api::new(url, Some(&spare));
    spare.ok("GET", "/v1/sandboxes", None, 200).await;
    farm_tenant(db, &["key", "revoke", &spare_id]);
    let (status, why) = spare.call("GET", "/v1/sandboxes", None).await;
    assert_eq!(status, 401, "{why}");
    // A socket opened with a key that is then revoked takes no more messages.
    let (socket_key, socket_id) = new_key(db, "b", &[]);
    let mut ws = openenv_socket(url, &socket_key).await;
    farm_tenant(db, &["key", "revoke", &socket_id]);
    let reply = openenv_call(&mut ws, json!({ "type": "state" })).await;
    assert_eq!(reply["type"], "error", "{reply}");
    assert!(reply.to_string().contains("revoked"), "{reply}");
    let (brief, _) = new_key(db, "b", &["--expires-in", "1s"]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        Api::new(url, Some(&brief)).call("GET", "/v1/sandboxes", None).await.0,
        401
    );
    assert_eq!(
        Api::new(url, Some("farm_0000"))
            .call("GET", "/v1/sandboxes", None)
            .await
            .0,
        401
    );
}

/// A's sandbox, session and rows are as A left them.
async fn a_is_unharmed(a: &Api, owned: &Owned) {
    a.sh_prints(&owned.sandbox, "cat /tmp/mark", "a-was-here").await;
    let scored = a
        .ok(
            "POST",
            &format!("/v1/sessions/{}/submit", owned.session),
            Some(json!({ "answer": "42" })),
            200,
        )
        .await;
    assert_eq!(scored["reward"], 1.0, "{scored}");
    let (_, _, rows) = a.send("GET", "/v1/results?cursor=0&max=10000&wait=5", None, &[]).await;
    let rows = String::from_utf8(rows).unwrap();
    assert!(rows.contains(&owned.session_rollout), "{rows}");
    let sandboxes = a.ok("GET", "/v1/sandboxes", None, 200).await;
    assert!(sandboxes.to_string().contains(&owned.sandbox));
}

/// Every call that changed state is in the audit, with tenant, key, route and result; no
/// secret is in it or anywhere in the database.
fn audit_has_no_secret(db: &Path, out: &Path, secrets: &[&str]) {
    let records: Value = serde_json::from_str(&farm_tenant(db, &["--json", "audit", "--limit", "100000"])).unwrap();
    let records = records.as_array().unwrap();
    let by = |tenant: &str, route: &str, status: u64| {
        records
            .iter()
            .any(|r| r["tenant"] == tenant && r["route"] == route && r["status"] == status)
    };
    assert!(by("a", "POST /v1/sandboxes", 201), "{records:?}");
    assert!(by("b", "POST /v1/sandboxes/{id}/exec", 404));
    assert!(by("b", "POST /v1/sandboxes", 429));
    assert!(records
        .iter()
        .all(|r| r["key_id"].as_str().is_some_and(|k| !k.is_empty())));
    for entry in std::fs::read_dir(out).unwrap().flatten() {
        if entry.file_name().to_string_lossy().starts_with("tenants.db") {
            let bytes = std::fs::read(entry.path()).unwrap();
            for secret in secrets {
                assert!(
                    !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                    "{}",
                    entry.path().display()
                );
            }
        }
    }
    let text = serde_json::to_string(records).unwrap();
    for secret in secrets {
        assert!(!text.contains(secret));
    }
}
