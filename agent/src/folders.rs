//! A path's facts and a folder's entries ([`farm_protocol::folder`]), as `lstat` sees them:
//! no symbolic link is followed, in the folder or at the path itself.

use std::fs::Metadata;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use farm_protocol::folder::{Entry, EntryKind, FolderRequest, FolderResponse, MAX_FOLDER_ENTRIES};
use farm_protocol::{AgentError, ErrorKind};

/// The host names the path in what it tells its client.
fn failed(_path: &str, e: std::io::Error) -> AgentError {
    let kind = match e.kind() {
        std::io::ErrorKind::NotFound => ErrorKind::NotFound,
        _ => ErrorKind::Io,
    };
    AgentError {
        kind,
        message: e.to_string(),
    }
}

fn entry(name: String, meta: &Metadata, path: &Path) -> Entry {
    let kind = meta.file_type();
    let kind = if kind.is_symlink() {
        EntryKind::Symlink
    } else if kind.is_dir() {
        EntryKind::Dir
    } else if kind.is_file() {
        EntryKind::File
    } else {
        let _ = kind.is_fifo();
        EntryKind::Other
    };
    Entry {
        name,
        kind,
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        modified_unix_ms: meta.mtime() * 1000 + meta.mtime_nsec() / 1_000_000,
        target: match kind {
            EntryKind::Symlink => std::fs::read_link(path).ok().map(|t| t.to_string_lossy().into_owned()),
            _ => None,
        },
    }
}

/// Answers one request; a listing's entries are the body, as JSON.
pub fn handle(request: &FolderRequest) -> Result<(FolderResponse, Vec<u8>), AgentError> {
    match request {
        FolderRequest::Stat { path } => {
            let meta = std::fs::symlink_metadata(path).map_err(|e| failed(path, e))?;
            Ok((
                FolderResponse::Stat(entry(path.clone(), &meta, Path::new(path))),
                Vec::new(),
            ))
        }
        FolderRequest::List { path, max_entries } => {
            let max = (*max_entries).min(MAX_FOLDER_ENTRIES) as usize;
            let mut entries = Vec::new();
            let mut truncated = false;
            for item in std::fs::read_dir(path).map_err(|e| failed(path, e))? {
                let item = item.map_err(|e| failed(path, e))?;
                if entries.len() == max {
                    truncated = true;
                    break;
                }
                let full = item.path();
                // Gone since the listing began: left out.
                let Ok(meta) = std::fs::symlink_metadata(&full) else {
                    continue;
                };
                entries.push(entry(item.file_name().to_string_lossy().into_owned(), &meta, &full));
            }
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            let body = serde_json::to_vec(&entries).map_err(|e| failed(path, std::io::Error::other(e)))?;
            Ok((
                FolderResponse::List {
                    count: entries.len() as u32,
                    truncated,
                },
                body,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_reports_links_as_links_and_stops_at_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.txt"), "hello").unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", dir.path().join("c")).unwrap();
        let path = dir.path().to_string_lossy().into_owned();
        let (answer, body) = handle(&FolderRequest::List {
            path: path.clone(),
            max_entries: 100,
        })
        .unwrap();
        assert_eq!(
            answer,
            FolderResponse::List {
                count: 3,
                truncated: false
            }
        );
        let entries: Vec<Entry> = serde_json::from_slice(&body).unwrap();
        let kinds: Vec<(&str, EntryKind)> = entries.iter().map(|e| (e.name.as_str(), e.kind)).collect();
        assert_eq!(
            kinds,
            [
                ("a", EntryKind::Dir),
                ("b.txt", EntryKind::File),
                ("c", EntryKind::Symlink)
            ]
        );
        assert_eq!(entries[1].size, 5);
        assert_eq!(entries[2].target.as_deref(), Some("/etc/shadow"));
        let (answer, _) = handle(&FolderRequest::List { path, max_entries: 2 }).unwrap();
        assert!(matches!(
            answer,
            FolderResponse::List {
                count: 2,
                truncated: true
            }
        ));
        let missing = handle(&FolderRequest::Stat {
            path: "/no/such/path".into(),
        })
        .unwrap_err();
        assert_eq!(missing.kind, ErrorKind::NotFound);
    }
}
