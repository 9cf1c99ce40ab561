//! Files and folders in a sandbox: uploads and downloads of one file, and of a folder as a
//! tar archive, each within its size limit.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;

use super::Sandboxes;
use crate::serve::error::{ApiError, ApiResult};

/// Largest file a client may upload or download in one request.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// Largest folder archive a client may download.
pub const MAX_FOLDER_BYTES: u64 = 256 << 20;

/// A guest path a client names: absolute, without NUL.
fn check_path(path: &str) -> ApiResult<()> {
    crate::serve::bounds::text("path", path, crate::serve::bounds::PATH_BYTES)?;
    if !path.starts_with('/') || path.contains('\0') {
        return Err(ApiError::field(400, "path", "must be an absolute guest path"));
    }
    Ok(())
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

impl Sandboxes {
    /// `PUT /v1/sandboxes/{id}/files`.
    pub async fn write_file(&self, id: &str, path: &str, mode: u32, bytes: Vec<u8>) -> ApiResult<serde_json::Value> {
        check_path(path)?;
        let _in_use = self.begin(id);
        let (agent, (), user) = self.agent(id, |_| Ok(())).await?;
        let placement = vmm::FilePlacement {
            beneath: None,
            owner: user,
        };
        let len = bytes.len();
        agent
            .write_file_placed(path, bytes, mode, &placement)
            .await
            .map_err(|e| self.file_error(id, path, &e))?;
        Ok(json!({ "path": path, "bytes": len }))
    }

    /// `GET /v1/sandboxes/{id}/files`.
    pub async fn read_file(&self, id: &str, path: &str) -> ApiResult<Vec<u8>> {
        check_path(path)?;
        let _in_use = self.begin(id);
        let (agent, (), _) = self.agent(id, |_| Ok(())).await?;
        let (bytes, size) = agent
            .read_file(path, MAX_FILE_BYTES)
            .await
            .map_err(|e| self.file_error(id, path, &e))?;
        if size > MAX_FILE_BYTES {
            return Err(ApiError::field(
                413,
                "path",
                format!(
                    "{path} is {size} bytes, past the {} MiB a file download may be (download its folder as a tar)",
                    MAX_FILE_BYTES >> 20
                ),
            ));
        }
        Ok(bytes)
    }

    pub(super) fn file_error(&self, id: &str, path: &str, e: &vmm::AgentError) -> ApiError {
        match e {
            vmm::AgentError::Refused { message, .. } => {
                let missing = message.contains("No such file") || message.contains("os error 2");
                ApiError::field(if missing { 404 } else { 400 }, "path", format!("{path}: {message}"))
            }
            other => self.vm_error(id, other),
        }
    }

    /// `PUT /v1/sandboxes/{id}/folders`: a tar archive unpacked in the guest under `path`.
    pub async fn write_folder(&self, id: &str, path: &str, archive: Vec<u8>) -> ApiResult<serde_json::Value> {
        check_path(path)?;
        let _in_use = self.begin(id);
        let (agent, (), _) = self.agent(id, |_| Ok(())).await?;
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let tmp = format!("/tmp/.farm-upload-{}-{n}.tar", std::process::id());
        let len = archive.len();
        agent
            .write_file(&tmp, archive, 0o600)
            .await
            .map_err(|e| self.file_error(id, &tmp, &e))?;
        let script = format!(
            "mkdir -p -- {dir} && tar -x -o -f {tmp} -C {dir}; rc=$?; rm -f {tmp}; exit $rc",
            dir = shell_quote(path)
        );
        let out = self.guest_sh(id, &agent, &script).await?;
        if out.result.exit_code != Some(0) {
            return Err(ApiError::field(
                400,
                "body",
                format!(
                    "unpacking the archive in {path} failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            ));
        }
        Ok(json!({ "path": path, "bytes": len }))
    }

    /// `GET /v1/sandboxes/{id}/folders`: a tar archive of the folder, made in the guest.
    pub async fn read_folder(&self, id: &str, path: &str) -> ApiResult<Vec<u8>> {
        check_path(path)?;
        let _in_use = self.begin(id);
        let (agent, (), _) = self.agent(id, |_| Ok(())).await?;
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let tmp = format!("/tmp/.farm-download-{}-{n}.tar", std::process::id());
        let script = format!(
            "[ -d {dir} ] || {{ echo 'no such folder' >&2; exit 3; }}; tar -c -f {tmp} -C {dir} .",
            dir = shell_quote(path)
        );
        let out = self.guest_sh(id, &agent, &script).await;
        let result = match out {
            Ok(out) if out.result.exit_code == Some(0) => self.read_whole(id, &agent, &tmp).await,
            Ok(out) if out.result.exit_code == Some(3) => {
                Err(ApiError::field(404, "path", format!("{path}: no such folder")))
            }
            Ok(out) => Err(ApiError::field(
                400,
                "path",
                format!("packing {path} failed: {}", String::from_utf8_lossy(&out.stderr).trim()),
            )),
            Err(e) => Err(e),
        };
        let _ = agent.remove_file(&tmp, None).await;
        result
    }

    /// A guest file in chunks, up to [`MAX_FOLDER_BYTES`].
    pub(super) async fn read_whole(&self, id: &str, agent: &vmm::AgentClient, path: &str) -> ApiResult<Vec<u8>> {
        const CHUNK: u64 = 16 << 20;
        let mut out = Vec::new();
        loop {
            let (bytes, size) = agent
                .read_file_at(path, out.len() as u64, CHUNK, None)
                .await
                .map_err(|e| self.file_error(id, path, &e))?;
            if size > MAX_FOLDER_BYTES {
                return Err(ApiError::field(
                    413,
                    "path",
                    format!(
                        "the folder's archive is {size} bytes, past the {} MiB a download may be",
                        MAX_FOLDER_BYTES >> 20
                    ),
                ));
            }
            let done = bytes.is_empty();
            out.extend_from_slice(&bytes);
            if done || out.len() as u64 >= size {
                return Ok(out);
            }
        }
    }

    pub(super) async fn guest_sh(
        &self,
        id: &str,
        agent: &vmm::AgentClient,
        script: &str,
    ) -> ApiResult<vmm::ExecOutput> {
        let options = vmm::ExecOptions {
            timeout: Some(Duration::from_secs(600)),
            ..vmm::ExecOptions::argv(&["/bin/sh", "-c", script])
        };
        agent.exec(options).await.map_err(|e| self.vm_error(id, &e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_absolute_and_quotes_survive_the_shell() {
        assert_eq!(shell_quote("a'b"), "'a'\\''b'");
        assert!(check_path("rel").is_err());
        assert!(check_path("/a\0b").is_err());
        assert!(check_path("/a/b").is_ok());
    }
}
