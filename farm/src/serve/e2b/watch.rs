//! envd's folder watchers: as E2B's sync SDK polls them (`files.watch_dir`:
//! `CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`), and as its async SDK streams them
//! (`WatchDir`). A watcher is a listing of the folder
//! (recursive: 16 levels down) kept by the transport; each poll lists it again and answers
//! what was created, written (size or time changed), had its mode changed, or was removed
//! since. Events are of paths relative to the folder. Changes that undo themselves between
//! two polls are not seen.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Value};

use super::envd::{message, sandboxes, InSandbox};
use super::filesystem::walk;
use super::{connect, refused};
use crate::serve::http::{App, Reply};
use crate::serve::tenancy::Who;
use service::ErrorKind;

/// Watchers a sandbox may hold at once.
const PER_SANDBOX: usize = 32;
/// Watchers the service holds at once (a sandbox that ends leaves its own until removed).
const IN_ALL: usize = 4096;

/// What a watcher saw of a path last: (kind, size, modified, mode).
type Seen = (String, u64, i64, u32);

struct Watcher {
    sandbox: String,
    root: String,
    depth: u32,
    seen: BTreeMap<String, Seen>,
}

/// Every watcher of the service, by id.
#[derive(Default)]
pub(in crate::serve) struct Watchers(Mutex<HashMap<String, Watcher>>);

impl Watchers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watcher>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `CreateWatcherRequest`, `GetWatcherEventsRequest`, `RemoveWatcherRequest`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(in crate::serve) struct WatchRequest {
    path: Option<String>,
    #[serde(default)]
    recursive: bool,
    watcher_id: Option<String>,
}

/// A folder's listing as a watcher keeps it.
async fn listing(
    app: &App,
    id: &service::sandbox::SandboxId,
    root: &str,
    depth: u32,
) -> Result<BTreeMap<String, Seen>, crate::serve::error::HttpError> {
    let entries = walk(sandboxes(app)?, id, root, depth).await?;
    let prefix = format!("{}/", root.trim_end_matches('/'));
    Ok(entries
        .into_iter()
        .map(|(path, e)| {
            let relative = path.strip_prefix(&prefix).unwrap_or(&path).to_string();
            (relative, (e.kind, e.size, e.modified_at_ms, e.mode))
        })
        .collect())
}

/// The folder a watch request names (it must be one), how deep it is watched, and its
/// listing now.
async fn watched(
    app: &App,
    id: &service::sandbox::SandboxId,
    request: WatchRequest,
) -> Result<(String, u32, BTreeMap<String, Seen>), crate::serve::error::HttpError> {
    let root = request
        .path
        .filter(|p| !p.is_empty())
        .ok_or_else(|| refused(ErrorKind::Invalid, "path: the folder to watch"))?;
    if sandboxes(app)?.stat(id, &root).await?.kind != "dir" {
        return Err(refused(ErrorKind::Invalid, format!("{root} is not a folder")));
    }
    let depth = if request.recursive { 16 } else { 1 };
    let seen = listing(app, id, &root, depth).await?;
    Ok((root, depth, seen))
}

/// `POST /filesystem.Filesystem/CreateWatcher`: a watcher of a folder from now on.
pub(in crate::serve) async fn create(
    State(app): State<App>,
    Extension(watchers): Extension<Arc<Watchers>>,
    InSandbox(id): InSandbox,
    body: Bytes,
) -> Reply {
    let (root, depth, seen) = watched(&app, &id, connect::unary(&body)?).await?;
    let mut all = watchers.lock();
    if all.len() >= IN_ALL || all.values().filter(|w| w.sandbox == *id).count() >= PER_SANDBOX {
        return Err(refused(
            ErrorKind::Busy,
            format!("at most {PER_SANDBOX} watchers a sandbox ({IN_ALL} in all): remove one"),
        ));
    }
    let watcher_id = service::ids::random_hex();
    all.insert(
        watcher_id.clone(),
        Watcher {
            sandbox: id.to_string(),
            root,
            depth,
            seen,
        },
    );
    message(json!({ "watcherId": watcher_id }))
}

/// The watcher a request names, of this sandbox (another sandbox's is not found).
fn named(request: &WatchRequest) -> Result<String, crate::serve::error::HttpError> {
    request
        .watcher_id
        .clone()
        .filter(|w| !w.is_empty())
        .ok_or_else(|| refused(ErrorKind::Invalid, "watcherId: the watcher"))
}

/// `POST /filesystem.Filesystem/GetWatcherEvents`: what changed since the last poll.
pub(in crate::serve) async fn events(
    State(app): State<App>,
    Extension(watchers): Extension<Arc<Watchers>>,
    InSandbox(id): InSandbox,
    body: Bytes,
) -> Reply {
    let request: WatchRequest = connect::unary(&body)?;
    let watcher_id = named(&request)?;
    let not_found = || refused(ErrorKind::NotFound, format!("no watcher {watcher_id:?}"));
    let (root, depth) = match watchers.lock().get(&watcher_id) {
        Some(w) if w.sandbox == *id => (w.root.clone(), w.depth),
        _ => return Err(not_found()),
    };
    let now = listing(&app, &id, &root, depth).await?;
    let mut all = watchers.lock();
    let watcher = all.get_mut(&watcher_id).ok_or_else(not_found)?;
    let events = changes(&watcher.seen, &now);
    watcher.seen = now;
    message(json!({ "events": events }))
}

/// The events between two listings of a folder: its `FilesystemEvent`s.
fn changes(seen: &BTreeMap<String, Seen>, now: &BTreeMap<String, Seen>) -> Vec<Value> {
    let event = |name: &str, kind: &str| json!({ "name": name, "type": kind });
    let mut events = Vec::new();
    for (path, was) in seen {
        match now.get(path) {
            None => events.push(event(path, "EVENT_TYPE_REMOVE")),
            Some(is) if (is.1, is.2) != (was.1, was.2) => events.push(event(path, "EVENT_TYPE_WRITE")),
            Some(is) if is.3 != was.3 => events.push(event(path, "EVENT_TYPE_CHMOD")),
            Some(_) => {}
        }
    }
    for path in now.keys().filter(|p| !seen.contains_key(*p)) {
        events.push(event(path, "EVENT_TYPE_CREATE"));
    }
    events
}

/// How often a watch stream lists its folder again.
const POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// `POST /filesystem.Filesystem/WatchDir` (the async client's `watch_dir`): a stream, `start`
/// first, then each change as the folder is listed again every quarter second, a keepalive
/// every 30 s; it ends with the client, with the sandbox, or past `connect-timeout-ms`.
pub(in crate::serve) async fn stream(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    InSandbox(id): InSandbox,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let (root, depth, mut seen) = watched(&app, &id, connect::request(&body)?).await?;
    let held = app.service.tenancy.hold(&who)?;
    let deadline = super::envd::deadline_of(&headers);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
    tokio::spawn(async move {
        let _held = held;
        let send = |message: Value| {
            let tx = tx.clone();
            async move { tx.send(Bytes::from(connect::frame(&message))).await.is_ok() }
        };
        if !send(json!({ "start": {} })).await {
            return;
        }
        let mut quiet = std::time::Duration::ZERO;
        loop {
            tokio::time::sleep(POLL).await;
            if deadline.is_some_and(|at| tokio::time::Instant::now() >= at) {
                let _ = tx.send(Bytes::from(connect::end(None))).await;
                return;
            }
            let now = match listing(&app, &id, &root, depth).await {
                Ok(now) => now,
                Err(e) => {
                    let _ = tx
                        .send(Bytes::from(connect::end(Some(("unavailable", &e.0.message)))))
                        .await;
                    return;
                }
            };
            let events = changes(&seen, &now);
            seen = now;
            quiet = if events.is_empty() {
                quiet + POLL
            } else {
                std::time::Duration::ZERO
            };
            for event in events {
                if !send(json!({ "filesystem": event })).await {
                    return;
                }
            }
            if quiet >= std::time::Duration::from_secs(30) {
                quiet = std::time::Duration::ZERO;
                if !send(json!({ "keepalive": {} })).await {
                    return;
                }
            }
        }
    });
    Ok(super::envd::event_stream(rx))
}

/// `POST /filesystem.Filesystem/RemoveWatcher`.
pub(in crate::serve) async fn remove(
    Extension(watchers): Extension<Arc<Watchers>>,
    InSandbox(id): InSandbox,
    body: Bytes,
) -> Reply {
    let request: WatchRequest = connect::unary(&body)?;
    let watcher_id = named(&request)?;
    let mut all = watchers.lock();
    match all.get(&watcher_id) {
        Some(w) if w.sandbox == *id => {
            all.remove(&watcher_id);
            message(json!({}))
        }
        _ => Err(refused(ErrorKind::NotFound, format!("no watcher {watcher_id:?}"))),
    }
}
