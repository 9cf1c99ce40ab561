//! Files and folders in a sandbox: uploads and downloads of one file, and of a folder as a
//! tar archive, each within its size limit (the guest's: [`engine::guest`]).

use super::Sandboxes;
use crate::serve::error::{ApiError, ApiResult};
use crate::serve::wire::FileWritten;

/// A guest path a client names: absolute, without NUL.
fn check_path(path: &str) -> ApiResult<()> {
    crate::serve::bounds::text("path", path, crate::serve::bounds::PATH_BYTES)?;
    if !path.starts_with('/') || path.contains('\0') {
        return Err(ApiError::field(400, "path", "must be an absolute guest path"));
    }
    Ok(())
}

impl Sandboxes {
    /// `PUT /v1/sandboxes/{id}/files`.
    pub async fn write_file(&self, id: &str, path: &str, mode: u32, bytes: Vec<u8>) -> ApiResult<FileWritten> {
        check_path(path)?;
        let _in_use = self.begin(id);
        let len = bytes.len();
        let guest = self.guest(id).await?;
        if let Err(e) = guest.write_file(path, mode, bytes).await {
            return Err(self.guest_error(id, e, Some(path)).await);
        }
        Ok(FileWritten {
            path: path.to_string(),
            bytes: len,
        })
    }

    /// `GET /v1/sandboxes/{id}/files`.
    pub async fn read_file(&self, id: &str, path: &str) -> ApiResult<Vec<u8>> {
        check_path(path)?;
        let _in_use = self.begin(id);
        let guest = self.guest(id).await?;
        match guest.read_file(path).await {
            Ok(bytes) => Ok(bytes),
            Err(e) => Err(self.guest_error(id, e, Some(path)).await),
        }
    }

    /// `PUT /v1/sandboxes/{id}/folders`: a tar archive unpacked in the guest under `path`.
    pub async fn write_folder(&self, id: &str, path: &str, archive: Vec<u8>) -> ApiResult<FileWritten> {
        check_path(path)?;
        let _in_use = self.begin(id);
        let len = archive.len();
        let guest = self.guest(id).await?;
        match guest.write_folder(path, archive).await {
            Ok(()) => Ok(FileWritten {
                path: path.to_string(),
                bytes: len,
            }),
            Err(engine::guest::GuestError::Failed(m)) => Err(ApiError::field(400, "body", m)),
            Err(e) => Err(self.guest_error(id, e, Some(path)).await),
        }
    }

    /// `GET /v1/sandboxes/{id}/folders`: a tar archive of the folder, made in the guest.
    pub async fn read_folder(&self, id: &str, path: &str) -> ApiResult<Vec<u8>> {
        check_path(path)?;
        let _in_use = self.begin(id);
        let guest = self.guest(id).await?;
        match guest.read_folder(path).await {
            Ok(bytes) => Ok(bytes),
            Err(e) => Err(self.guest_error(id, e, Some(path)).await),
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
