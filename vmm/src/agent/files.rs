//! Files and folders in the guest: writing (confined to a folder, owned by a user), reading,
//! listing and removing them, and handing a folder over to a user.

use std::time::Duration;

use farm_protocol::folder::{Entry, FolderRequest, FolderResponse};
use farm_protocol::{HandoverRequest, ReadFileRequest, Request, Response, WriteFileRequest};

use super::{unexpected, AgentClient, AgentError, SHORT_REQUEST};

/// Deadline for a workspace listing: up to [`farm_protocol::MAX_LISTING`] entries under TCG.
const LISTING_REQUEST: Duration = Duration::from_secs(180);

/// Where a file goes and who owns it.
#[derive(Debug, Clone, Default)]
pub struct FilePlacement {
    /// Confine the path to this folder (relative path, no link followed, links at the
    /// destination replaced, setuid/setgid/sticky bits dropped).
    pub beneath: Option<String>,
    /// Owner (a guest user); root when None.
    pub owner: Option<String>,
}

impl AgentClient {
    /// Gives a guest folder and everything under it to a user (links themselves, never
    /// their targets). Returns the entries changed.
    pub async fn handover(&self, root: &str, user: &str) -> Result<u64, AgentError> {
        let request = HandoverRequest {
            root: root.to_string(),
            user: user.to_string(),
        };
        match self
            .request("handover", Request::Handover(request), Vec::new(), SHORT_REQUEST)
            .await?
        {
            (Response::Handover { entries }, _) => Ok(entries),
            (other, _) => Err(unexpected("handover", other)),
        }
    }

    /// Removes a guest folder and everything under it without following links.
    pub async fn remove_tree(&self, path: &str) -> Result<u64, AgentError> {
        match self
            .request(
                "remove_tree",
                Request::RemoveTree { path: path.to_string() },
                Vec::new(),
                SHORT_REQUEST,
            )
            .await?
        {
            (Response::RemoveTree { entries }, _) => Ok(entries),
            (other, _) => Err(unexpected("remove_tree", other)),
        }
    }

    pub async fn write_file(&self, path: &str, contents: Vec<u8>, mode: u32) -> Result<(), AgentError> {
        self.write_file_placed(path, contents, mode, &FilePlacement::default())
            .await
    }

    /// Writes a file confined to a folder and/or owned by a user (see [`FilePlacement`]).
    pub async fn write_file_placed(
        &self,
        path: &str,
        contents: Vec<u8>,
        mode: u32,
        placement: &FilePlacement,
    ) -> Result<(), AgentError> {
        let request = WriteFileRequest {
            path: path.to_string(),
            mode,
            create_parents: true,
            beneath: placement.beneath.clone(),
            owner: placement.owner.clone(),
        };
        let expected = contents.len() as u64;
        match self
            .request("write_file", Request::WriteFile(request), contents, SHORT_REQUEST)
            .await?
        {
            (Response::WriteFile { bytes }, _) if bytes == expected => Ok(()),
            (Response::WriteFile { bytes }, _) => Err(AgentError::BadResponse {
                op: "write_file",
                detail: format!("wrote {bytes} bytes of {expected}"),
            }),
            (other, _) => Err(unexpected("write_file", other)),
        }
    }

    /// Reads at most `max_bytes` of a regular file; returns (contents, file size).
    pub async fn read_file(&self, path: &str, max_bytes: u64) -> Result<(Vec<u8>, u64), AgentError> {
        self.read_file_beneath(path, max_bytes, None).await
    }

    /// Reads at most `max_bytes` of a regular file, with `path` relative to `beneath` and no
    /// link followed when `beneath` is set.
    pub async fn read_file_beneath(
        &self,
        path: &str,
        max_bytes: u64,
        beneath: Option<&str>,
    ) -> Result<(Vec<u8>, u64), AgentError> {
        self.read_file_at(path, 0, max_bytes, beneath).await
    }

    /// Reads at most `max_bytes` of a regular file from byte `offset` on (for output that is
    /// still growing); returns (contents, the whole file's size).
    pub async fn read_file_at(
        &self,
        path: &str,
        offset: u64,
        max_bytes: u64,
        beneath: Option<&str>,
    ) -> Result<(Vec<u8>, u64), AgentError> {
        let request = ReadFileRequest {
            path: path.to_string(),
            max_bytes,
            beneath: beneath.map(str::to_string),
            offset,
        };
        match self
            .request("read_file", Request::ReadFile(request), Vec::new(), SHORT_REQUEST)
            .await?
        {
            (Response::ReadFile { size, .. }, body) if body.len() as u64 <= max_bytes => Ok((body, size)),
            (Response::ReadFile { .. }, body) => Err(AgentError::BadResponse {
                op: "read_file",
                detail: format!("sent {} bytes, more than the {max_bytes} asked for", body.len()),
            }),
            (other, _) => Err(unexpected("read_file", other)),
        }
    }

    /// Lists regular files under `root` (relative paths, sizes, mtimes, modes).
    pub async fn list_files(
        &self,
        root: &str,
        max_entries: u32,
    ) -> Result<(Vec<farm_protocol::FileEntry>, bool), AgentError> {
        let request = farm_protocol::ListFilesRequest {
            root: root.to_string(),
            max_entries,
        };
        match self
            .request("list_files", Request::ListFiles(request), Vec::new(), LISTING_REQUEST)
            .await?
        {
            (Response::ListFiles { count, truncated }, body) => {
                let entries: Vec<farm_protocol::FileEntry> =
                    serde_json::from_slice(&body).map_err(|e| AgentError::BadResponse {
                        op: "list_files",
                        detail: format!("the listing is not a JSON array of entries: {e}"),
                    })?;
                if entries.len() > max_entries as usize || entries.len() != count as usize {
                    return Err(AgentError::BadResponse {
                        op: "list_files",
                        detail: format!(
                            "{} entries (announced {count}), at most {max_entries} asked for",
                            entries.len()
                        ),
                    });
                }
                Ok((entries, truncated))
            }
            (other, _) => Err(unexpected("list_files", other)),
        }
    }

    /// A path's facts, as `lstat` gives them.
    pub async fn stat(&self, path: &str) -> Result<Entry, AgentError> {
        let request = Request::Folder(FolderRequest::Stat { path: path.to_string() });
        match self.request("stat", request, Vec::new(), SHORT_REQUEST).await? {
            (Response::Folder(FolderResponse::Stat(entry)), _) => Ok(entry),
            (other, _) => Err(unexpected("stat", other)),
        }
    }

    /// A folder's entries, sorted by name, and whether there were more than `max_entries`.
    pub async fn list_folder(&self, path: &str, max_entries: u32) -> Result<(Vec<Entry>, bool), AgentError> {
        let request = Request::Folder(FolderRequest::List {
            path: path.to_string(),
            max_entries,
        });
        match self
            .request("list_folder", request, Vec::new(), LISTING_REQUEST)
            .await?
        {
            (Response::Folder(FolderResponse::List { count, truncated }), body) => {
                let entries: Vec<Entry> = serde_json::from_slice(&body).map_err(|e| AgentError::BadResponse {
                    op: "list_folder",
                    detail: format!("the listing is not a JSON array of entries: {e}"),
                })?;
                if entries.len() > max_entries as usize || entries.len() != count as usize {
                    return Err(AgentError::BadResponse {
                        op: "list_folder",
                        detail: format!(
                            "{} entries (announced {count}), at most {max_entries} asked for",
                            entries.len()
                        ),
                    });
                }
                Ok((entries, truncated))
            }
            (other, _) => Err(unexpected("list_folder", other)),
        }
    }

    /// Removes a file (a missing one is not an error); with `beneath`, `path` is relative to
    /// that folder and no link is followed.
    pub async fn remove_file(&self, path: &str, beneath: Option<&str>) -> Result<(), AgentError> {
        let request = Request::RemoveFile {
            path: path.to_string(),
            beneath: beneath.map(str::to_string),
        };
        match self.request("remove_file", request, Vec::new(), SHORT_REQUEST).await? {
            (Response::RemoveFile, _) => Ok(()),
            (other, _) => Err(unexpected("remove_file", other)),
        }
    }
}
