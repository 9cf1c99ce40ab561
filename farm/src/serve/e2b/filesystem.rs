//! envd's filesystem RPCs (`/filesystem.Filesystem/*`, JSON in and out), in a sandbox: a
//! path's entry, a folder's entries, and making, moving and removing paths.

use axum::body::Bytes;
use axum::extract::State;
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect;
use super::envd::{message, sandboxes, InSandbox};
use super::refused;
use crate::serve::error::HttpError;
use crate::serve::http::{App, Reply};
use service::sandbox::SandboxId;
use service::wire::EntryView;
use service::ErrorKind;

/// A path of a filesystem RPC.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(in crate::serve) struct PathRequest {
    path: Option<String>,
    source: Option<String>,
    destination: Option<String>,
    depth: Option<u32>,
}

impl PathRequest {
    fn field(value: &Option<String>, name: &str) -> Result<String, HttpError> {
        value
            .clone()
            .filter(|p| !p.is_empty())
            .ok_or_else(|| refused(ErrorKind::Invalid, format!("{name}: an absolute path is required")))
    }
}

/// `filesystem.EntryInfo` of farm's entry at `path`.
fn entry_info(path: &str, entry: &EntryView) -> Value {
    let kind = match entry.kind.as_str() {
        "dir" => "FILE_TYPE_DIRECTORY",
        "symlink" => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_FILE",
    };
    let name = path.rsplit('/').find(|s| !s.is_empty()).unwrap_or("/");
    json!({
        "name": name,
        "type": kind,
        "path": path,
        "size": entry.size.to_string(),
        "mode": entry.mode & 0o7777,
        "permissions": permissions(entry),
        "owner": entry.uid.to_string(),
        "group": entry.gid.to_string(),
        "modifiedTime": super::rfc3339(entry.modified_at_ms.max(0) as u64),
        "symlinkTarget": entry.target,
        "isSymlink": entry.kind == "symlink",
    })
}

/// `drwxr-xr-x` of an entry.
fn permissions(entry: &EntryView) -> String {
    let kind = match entry.kind.as_str() {
        "dir" => 'd',
        "symlink" => 'l',
        _ => '-',
    };
    let mut text = String::from(kind);
    for shift in [6, 3, 0] {
        let bits = (entry.mode >> shift) & 7;
        text.push(if bits & 4 != 0 { 'r' } else { '-' });
        text.push(if bits & 2 != 0 { 'w' } else { '-' });
        text.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    text
}

/// `POST /filesystem.Filesystem/Stat`.
pub(in crate::serve) async fn stat(State(app): State<App>, InSandbox(id): InSandbox, body: Bytes) -> Reply {
    let request: PathRequest = connect::unary(&body)?;
    let path = PathRequest::field(&request.path, "path")?;
    let entry = sandboxes(&app)?.stat(&id, &path).await?;
    message(json!({ "entry": entry_info(&path, &entry) }))
}

/// Entries one listing answers, at most, whatever its depth (the agent's bound on one folder).
const MAX_LISTED: usize = farm_protocol::folder::MAX_FOLDER_ENTRIES as usize;

/// `POST /filesystem.Filesystem/ListDir`: a folder's entries (depth 1; a deeper listing
/// walks the folders below, up to `depth`, at most 16). A folder truncated by the core's
/// bound, or more than [`MAX_LISTED`] entries in all, is refused rather than half-answered.
pub(in crate::serve) async fn list_dir(State(app): State<App>, InSandbox(id): InSandbox, body: Bytes) -> Reply {
    let request: PathRequest = connect::unary(&body)?;
    let root = PathRequest::field(&request.path, "path")?;
    let depth = request.depth.unwrap_or(1).clamp(1, 16);
    let found = walk(sandboxes(&app)?, &id, &root, depth).await?;
    let entries: Vec<Value> = found.iter().map(|(path, entry)| entry_info(path, entry)).collect();
    message(json!({ "entries": entries }))
}

/// The entries below `root`, `depth` levels down, each with its path: at most
/// [`MAX_LISTED`], else refused whole.
pub(super) async fn walk(
    sandboxes: &service::sandbox::Sandboxes,
    id: &SandboxId,
    root: &str,
    depth: u32,
) -> Result<Vec<(String, EntryView)>, HttpError> {
    let mut entries = Vec::new();
    let mut folders = vec![(root.trim_end_matches('/').to_string(), 1)];
    while let Some((folder, level)) = folders.pop() {
        let path = if folder.is_empty() { "/" } else { &folder };
        let listing = sandboxes.list_folder(id, path, Some(MAX_LISTED as u64)).await?;
        if listing.truncated || entries.len() + listing.entries.len() > MAX_LISTED {
            return Err(refused(
                ErrorKind::Invalid,
                format!("more than {MAX_LISTED} entries below {root} (or one folder past the sandbox API's bound): list a smaller depth or a folder further down"),
            ));
        }
        for entry in listing.entries {
            let path = format!("{folder}/{}", entry.name);
            if entry.kind == "dir" && level < depth {
                folders.push((path.clone(), level + 1));
            }
            entries.push((path, entry));
        }
    }
    Ok(entries)
}

/// A command of the filesystem RPCs that have no call of their own in the core (`mkdir`,
/// `rm`, `mv`), run as argv (no shell): its exit code and stderr.
async fn run_argv(app: &App, id: &SandboxId, argv: &[&str]) -> Result<(i32, String), HttpError> {
    let request: service::sandbox::sandboxes::ExecRequest =
        serde_json::from_value(json!({ "argv": argv })).map_err(|e| refused(ErrorKind::Internal, e.to_string()))?;
    let out = sandboxes(app)?.exec(id, request).await?;
    Ok((out.exit_code.unwrap_or(-1), out.stderr))
}

/// `POST /filesystem.Filesystem/MakeDir`: the folder and its parents; `already_exists` when
/// it is there.
pub(in crate::serve) async fn make_dir(State(app): State<App>, InSandbox(id): InSandbox, body: Bytes) -> Reply {
    let request: PathRequest = connect::unary(&body)?;
    let path = PathRequest::field(&request.path, "path")?;
    if sandboxes(&app)?.stat(&id, &path).await.is_ok() {
        return Err(refused(ErrorKind::Conflict, format!("{path} exists")));
    }
    let (code, stderr) = run_argv(&app, &id, &["mkdir", "-p", "--", &path]).await?;
    if code != 0 {
        return Err(refused(ErrorKind::Invalid, format!("making {path}: {}", stderr.trim())));
    }
    let entry = sandboxes(&app)?.stat(&id, &path).await?;
    message(json!({ "entry": entry_info(&path, &entry) }))
}

/// `POST /filesystem.Filesystem/Remove`: a file, or a folder and all in it.
pub(in crate::serve) async fn remove(State(app): State<App>, InSandbox(id): InSandbox, body: Bytes) -> Reply {
    let request: PathRequest = connect::unary(&body)?;
    let path = PathRequest::field(&request.path, "path")?;
    sandboxes(&app)?.stat(&id, &path).await?;
    let (code, stderr) = run_argv(&app, &id, &["rm", "-rf", "--", &path]).await?;
    if code != 0 {
        return Err(refused(
            ErrorKind::Invalid,
            format!("removing {path}: {}", stderr.trim()),
        ));
    }
    message(json!({}))
}

/// `POST /filesystem.Filesystem/Move`.
pub(in crate::serve) async fn rename(State(app): State<App>, InSandbox(id): InSandbox, body: Bytes) -> Reply {
    let request: PathRequest = connect::unary(&body)?;
    let source = PathRequest::field(&request.source, "source")?;
    let destination = PathRequest::field(&request.destination, "destination")?;
    sandboxes(&app)?.stat(&id, &source).await?;
    let (code, stderr) = run_argv(&app, &id, &["mv", "-T", "--", &source, &destination]).await?;
    if code != 0 {
        return Err(refused(
            ErrorKind::Invalid,
            format!("moving {source}: {}", stderr.trim()),
        ));
    }
    let entry = sandboxes(&app)?.stat(&id, &destination).await?;
    message(json!({ "entry": entry_info(&destination, &entry) }))
}
