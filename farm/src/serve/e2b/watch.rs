//! envd's folder watchers as E2B's sync SDK polls them (`files.watch_dir`):
//! `CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`. A watcher is a listing of the folder
//! (recursive: 16 levels down) kept by the transport; each poll lists it again and answers
//! what was created, written (size or time changed), had its mode changed, or was removed
//! since. Events are of paths relative to the folder. Changes that undo themselves between
//! two polls are not seen.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use axum::body::Bytes;
use axum::extract::State;
use serde::Deserialize;
use serde_json::{json, Value};

use super::envd::{message, sandboxes, InSandbox};
use super::filesystem::walk;
use super::{connect, refused};
use crate::serve::http::{App, Reply};
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

/// `POST /filesystem.Filesystem/CreateWatcher`: a watcher of a folder from now on.
pub(in crate::serve) async fn create(State(app): State<App>, InSandbox(id): InSandbox, body: Bytes) -> Reply {
    let request: WatchRequest = connect::unary(&body)?;
    let root = request
        .path
        .filter(|p| !p.is_empty())
        .ok_or_else(|| refused(ErrorKind::Invalid, "path: the folder to watch"))?;
    let entry = sandboxes(&app)?.stat(&id, &root).await?;
    if entry.kind != "dir" {
        return Err(refused(ErrorKind::Invalid, format!("{root} is not a folder")));
    }
    let depth = if request.recursive { 16 } else { 1 };
    let seen = listing(&app, &id, &root, depth).await?;
    let mut all = app.watchers.lock();
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
pub(in crate::serve) async fn events(State(app): State<App>, InSandbox(id): InSandbox, body: Bytes) -> Reply {
    let request: WatchRequest = connect::unary(&body)?;
    let watcher_id = named(&request)?;
    let not_found = || refused(ErrorKind::NotFound, format!("no watcher {watcher_id:?}"));
    let (root, depth) = match app.watchers.lock().get(&watcher_id) {
        Some(w) if w.sandbox == *id => (w.root.clone(), w.depth),
        _ => return Err(not_found()),
    };
    let now = listing(&app, &id, &root, depth).await?;
    let mut all = app.watchers.lock();
    let watcher = all.get_mut(&watcher_id).ok_or_else(not_found)?;
    let mut events: Vec<Value> = Vec::new();
    let event = |name: &str, kind: &str| json!({ "name": name, "type": kind });
    for (path, was) in &watcher.seen {
        match now.get(path) {
            None => events.push(event(path, "EVENT_TYPE_REMOVE")),
            Some(is) if (is.1, is.2) != (was.1, was.2) => events.push(event(path, "EVENT_TYPE_WRITE")),
            Some(is) if is.3 != was.3 => events.push(event(path, "EVENT_TYPE_CHMOD")),
            Some(_) => {}
        }
    }
    for path in now.keys().filter(|p| !watcher.seen.contains_key(*p)) {
        events.push(event(path, "EVENT_TYPE_CREATE"));
    }
    watcher.seen = now;
    message(json!({ "events": events }))
}

/// `POST /filesystem.Filesystem/RemoveWatcher`.
pub(in crate::serve) async fn remove(State(app): State<App>, InSandbox(id): InSandbox, body: Bytes) -> Reply {
    let request: WatchRequest = connect::unary(&body)?;
    let watcher_id = named(&request)?;
    let mut all = app.watchers.lock();
    match all.get(&watcher_id) {
        Some(w) if w.sandbox == *id => {
            all.remove(&watcher_id);
            message(json!({}))
        }
        _ => Err(refused(ErrorKind::NotFound, format!("no watcher {watcher_id:?}"))),
    }
}
