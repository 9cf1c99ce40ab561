//! Files and folders in a sandbox: uploads and downloads of one file, and of a folder as a
//! tar archive, each within its size limit (the guest's: [`engine::guest`]).

use farm_protocol::folder::{Entry, EntryKind};

use super::{SandboxId, Sandboxes};
use crate::error::ErrorKind;
use crate::error::{ApiError, ApiResult};
use crate::wire::{EntryView, FileWritten, FolderListing};

/// Entries one listing returns when the client does not say, and at most.
const DEFAULT_ENTRIES: u64 = 1000;
const MAX_ENTRIES: u64 = farm_protocol::folder::MAX_FOLDER_ENTRIES as u64;

fn entry_view(entry: Entry) -> EntryView {
    EntryView {
        name: entry.name,
        kind: match entry.kind {
            EntryKind::File => "file",
            EntryKind::Dir => "dir",
            EntryKind::Symlink => "symlink",
            EntryKind::Other => "other",
        }
        .into(),
        size: entry.size,
        mode: entry.mode,
        uid: entry.uid,
        gid: entry.gid,
        modified_at_ms: entry.modified_unix_ms,
        target: entry.target,
    }
}

/// A guest path a client names: absolute, without NUL.
fn check_path(path: &str) -> ApiResult<()> {
    crate::bounds::text("path", path, crate::bounds::PATH_BYTES)?;
    if !path.starts_with('/') || path.contains('\0') {
        return Err(ApiError::field(
            ErrorKind::Invalid,
            "path",
            "must be an absolute guest path",
        ));
    }
    Ok(())
}

impl Sandboxes {
    /// `PUT /v1/sandboxes/{id}/files`.
    pub async fn write_file(&self, id: &SandboxId, path: &str, mode: u32, bytes: Vec<u8>) -> ApiResult<FileWritten> {
        check_path(path)?;
        self.room_to_run()?;
        let _in_use = self.begin(id);
        let len = bytes.len();
        let guest = self.guest(id).await?;
        if let Err(e) = guest.write_file(path, mode, bytes).await {
            return Err(self.guest_error(id, &guest, e, Some(path)).await);
        }
        Ok(FileWritten {
            path: path.to_string(),
            bytes: len,
        })
    }

    /// `GET /v1/sandboxes/{id}/files`.
    pub async fn read_file(&self, id: &SandboxId, path: &str) -> ApiResult<Vec<u8>> {
        check_path(path)?;
        let _in_use = self.begin(id);
        let guest = self.guest(id).await?;
        match guest.read_file(path).await {
            Ok(bytes) => Ok(bytes),
            Err(e) => Err(self.guest_error(id, &guest, e, Some(path)).await),
        }
    }

    /// `GET /v1/sandboxes/{id}/stat`: a path's facts, without running a command (a link is
    /// reported as one).
    pub async fn stat(&self, id: &SandboxId, path: &str) -> ApiResult<EntryView> {
        check_path(path)?;
        let _in_use = self.begin(id);
        let guest = self.guest(id).await?;
        match guest.stat(path).await {
            Ok(entry) => Ok(entry_view(entry)),
            Err(e) => Err(self.guest_error(id, &guest, e, Some(path)).await),
        }
    }

    /// `GET /v1/sandboxes/{id}/entries`: a folder's entries by name, without running a
    /// command.
    pub async fn list_folder(&self, id: &SandboxId, path: &str, max: Option<u64>) -> ApiResult<FolderListing> {
        check_path(path)?;
        let max = max.unwrap_or(DEFAULT_ENTRIES);
        crate::bounds::range("max", max, (1, MAX_ENTRIES), "entries")?;
        let _in_use = self.begin(id);
        let guest = self.guest(id).await?;
        match guest.list_folder(path, max as u32).await {
            Ok((entries, truncated)) => Ok(FolderListing {
                path: path.to_string(),
                entries: entries.into_iter().map(entry_view).collect(),
                truncated,
            }),
            Err(e) => Err(self.guest_error(id, &guest, e, Some(path)).await),
        }
    }

    /// `PUT /v1/sandboxes/{id}/folders`: a tar archive unpacked in the guest under `path`.
    pub async fn write_folder(&self, id: &SandboxId, path: &str, archive: Vec<u8>) -> ApiResult<FileWritten> {
        check_path(path)?;
        self.room_to_run()?;
        let _in_use = self.begin(id);
        let len = archive.len();
        let guest = self.guest(id).await?;
        match guest.write_folder(path, archive).await {
            Ok(()) => Ok(FileWritten {
                path: path.to_string(),
                bytes: len,
            }),
            Err(engine::guest::GuestError::Failed(m)) => Err(ApiError::field(ErrorKind::Invalid, "body", m)),
            Err(e) => Err(self.guest_error(id, &guest, e, Some(path)).await),
        }
    }

    /// `GET /v1/sandboxes/{id}/folders`: a tar archive of the folder, made in the guest.
    pub async fn read_folder(&self, id: &SandboxId, path: &str) -> ApiResult<Vec<u8>> {
        check_path(path)?;
        let _in_use = self.begin(id);
        let guest = self.guest(id).await?;
        match guest.read_folder(path).await {
            Ok(bytes) => Ok(bytes),
            Err(e) => Err(self.guest_error(id, &guest, e, Some(path)).await),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_absolute() {
        assert!(check_path("rel").is_err());
        assert!(check_path("/a\0b").is_err());
        assert!(check_path("/a/b").is_ok());
    }
}
