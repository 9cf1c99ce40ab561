//! Dockerfile build contexts uploaded as tar archives (`POST /v1/contexts`), kept unpacked
//! in `contexts/<id>/` under a digest of the archive.
//!
//! An archive comes from a client, so it is unpacked as data: regular files and folders only
//! (a link, a device or a FIFO is refused, so nothing can point outside the folder), plain
//! relative paths (no leading `/`, no `..`), modes without setuid, setgid or sticky bits,
//! and a cap on the total size and on the number of entries. A refused archive leaves
//! nothing behind.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::ErrorKind;
use crate::error::{ApiError, ApiResult};

/// Most entries one context may have.
const MAX_ENTRIES: usize = 100_000;

pub struct Contexts {
    root: PathBuf,
    max_bytes: u64,
}

/// What an upload made.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Uploaded {
    pub context: String,
    pub files: usize,
    pub bytes: u64,
}

impl Contexts {
    pub fn open(root: &Path, max_bytes: u64) -> anyhow::Result<Contexts> {
        let root = root.join("contexts");
        std::fs::create_dir_all(&root).map_err(|e| anyhow::anyhow!("creating {}: {e}", root.display()))?;
        // Unpacking leftovers of a process that stopped midway.
        if let Ok(entries) = std::fs::read_dir(&root) {
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with(".unpacking-") {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        Ok(Contexts { root, max_bytes })
    }

    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The ids of every uploaded context.
    pub fn ids(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("ctx-") && !n.contains('.'))
            .collect()
    }

    /// The folder of an uploaded context, or 404 naming `field`.
    pub fn folder(&self, id: &str, field: &str) -> ApiResult<PathBuf> {
        let well_formed = id
            .strip_prefix("ctx-")
            .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()));
        let dir = self.root.join(id);
        if well_formed && dir.is_dir() {
            Ok(dir)
        } else {
            Err(ApiError::field(
                ErrorKind::NotFound,
                field,
                format!("no uploaded context {id:?} (POST the tar archive to /v1/contexts first)"),
            ))
        }
    }

    /// Unpacks `archive` as a context (or finds it unpacked already).
    pub async fn upload(&self, archive: Vec<u8>) -> ApiResult<Uploaded> {
        if archive.len() as u64 > self.max_bytes {
            return Err(too_large(self.max_bytes));
        }
        let id = format!("ctx-{}", engine::snapshots::hex(&Sha256::digest(&archive)[..16]));
        let (root, max_bytes, name) = (self.root.clone(), self.max_bytes, id.clone());
        tokio::task::spawn_blocking(move || unpack(&root, &name, &archive, max_bytes))
            .await
            .map_err(|e| ApiError::new(ErrorKind::Internal, format!("unpacking the context: {e}")))?
            .map(|(files, bytes)| Uploaded {
                context: id,
                files,
                bytes,
            })
    }
}

fn too_large(max: u64) -> ApiError {
    ApiError::new(
        ErrorKind::TooLarge,
        format!(
            "the context is larger than {} MiB (serve.sandboxes.max_context_mib)",
            max >> 20
        ),
    )
}

/// Whether `path` is plain and relative: no leading `/`, no `..`, not empty.
pub fn plain_relative(path: &str) -> bool {
    let path = Path::new(path);
    !path.as_os_str().is_empty()
        && path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        && path.components().any(|c| matches!(c, Component::Normal(_)))
}

/// Unpacks into `root/.unpacking-*`, then renames it to `root/name`. Returns the files and
/// bytes it holds.
fn unpack(root: &Path, name: &str, archive: &[u8], max_bytes: u64) -> ApiResult<(usize, u64)> {
    let dest = root.join(name);
    if dest.is_dir() {
        return count(&dest);
    }
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let staging = root.join(format!(".unpacking-{name}-{}-{n}", std::process::id()));
    let result = unpack_into(&staging, archive, max_bytes);
    let renamed = result.and_then(|counts| match std::fs::rename(&staging, &dest) {
        Ok(()) => Ok(counts),
        // Another upload of the same archive finished first.
        Err(_) if dest.is_dir() => Ok(counts),
        Err(e) => Err(ApiError::new(ErrorKind::Internal, format!("storing the context: {e}"))),
    });
    let _ = std::fs::remove_dir_all(&staging);
    renamed
}

fn unpack_into(staging: &Path, archive: &[u8], max_bytes: u64) -> ApiResult<(usize, u64)> {
    use std::os::unix::fs::PermissionsExt;
    let bad = |what: String| ApiError::field(ErrorKind::Invalid, "body", format!("not a build context: {what}"));
    std::fs::create_dir_all(staging)
        .map_err(|e| ApiError::new(ErrorKind::Internal, format!("creating the context: {e}")))?;
    let mut tar = tar::Archive::new(archive);
    let (mut files, mut bytes, mut entries) = (0usize, 0u64, 0usize);
    for entry in tar
        .entries()
        .map_err(|e| bad(format!("reading the tar archive: {e}")))?
    {
        let mut entry = entry.map_err(|e| bad(format!("reading the tar archive: {e}")))?;
        entries += 1;
        if entries > MAX_ENTRIES {
            return Err(bad(format!("more than {MAX_ENTRIES} entries")));
        }
        let path = entry
            .path()
            .map_err(|e| bad(format!("an entry's path: {e}")))?
            .to_string_lossy()
            .into_owned();
        let kind = entry.header().entry_type();
        if !plain_relative(&path) {
            if matches!(path.trim_end_matches('/'), "." | "") && kind.is_dir() {
                continue;
            }
            return Err(bad(format!(
                "{path:?} is not a plain relative path (no leading /, no ..)"
            )));
        }
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        let target = staging.join(&path);
        if kind.is_dir() {
            std::fs::create_dir_all(&target).map_err(|e| bad(format!("{path}: {e}")))?;
            continue;
        }
        if !(kind.is_file() || kind == tar::EntryType::Continuous) {
            return Err(bad(format!(
                "{path:?} is a {}: a context holds regular files and folders only",
                kind_name(kind)
            )));
        }
        let size = entry.header().size().unwrap_or(0);
        bytes += size;
        if bytes > max_bytes {
            return Err(too_large(max_bytes));
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| bad(format!("{path}: {e}")))?;
        }
        // A file's parent may be a file of an earlier entry: create_dir_all failed above,
        // or the open below does; no link exists to follow.
        let mut content = Vec::with_capacity(size.min(1 << 20) as usize);
        entry
            .read_to_end(&mut content)
            .map_err(|e| bad(format!("{path}: {e}")))?;
        std::fs::write(&target, &content).map_err(|e| bad(format!("{path}: {e}")))?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode | 0o600))
            .map_err(|e| bad(format!("{path}: {e}")))?;
        files += 1;
    }
    if files == 0 {
        return Err(bad("the archive holds no file".into()));
    }
    Ok((files, bytes))
}

fn kind_name(kind: tar::EntryType) -> &'static str {
    match kind {
        tar::EntryType::Symlink => "symbolic link",
        tar::EntryType::Link => "hard link",
        tar::EntryType::Char | tar::EntryType::Block => "device",
        tar::EntryType::Fifo => "FIFO",
        _ => "special entry",
    }
}

/// Files and bytes under `dir`.
fn count(dir: &Path) -> ApiResult<(usize, u64)> {
    let (mut files, mut bytes) = (0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d)
            .map_err(|e| ApiError::new(ErrorKind::Internal, format!("reading the context: {e}")))?;
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => stack.push(entry.path()),
                Ok(m) => {
                    files += 1;
                    bytes += m.len();
                }
                Err(_) => {}
            }
        }
    }
    Ok((files, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, kind, data) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(*kind);
            header.set_size(data.len() as u64);
            header.set_mode(0o4755);
            if *kind == tar::EntryType::Symlink || *kind == tar::EntryType::Link {
                header.set_link_name("/etc/passwd").unwrap();
            }
            // Set the name bytes directly: the builder's own checks would refuse `..`.
            let name = header.as_old_mut().name.as_mut();
            name[..path.len()].copy_from_slice(path.as_bytes());
            header.set_cksum();
            builder.append(&header, *data).unwrap();
        }
        builder.into_inner().unwrap()
    }

    #[tokio::test]
    async fn a_context_is_unpacked_as_data_only() {
        let dir = tempfile::tempdir().unwrap();
        let contexts = Contexts::open(dir.path(), 1 << 20).unwrap();
        let good = archive(&[
            ("Dockerfile", tar::EntryType::Regular, b"FROM farm:minimal\n"),
            ("src/", tar::EntryType::Directory, b""),
            ("src/app.sh", tar::EntryType::Regular, b"echo hi\n"),
        ]);
        let up = contexts.upload(good.clone()).await.unwrap();
        assert_eq!((up.files, up.bytes), (2, 26));
        let folder = contexts.folder(&up.context, "c").unwrap();
        assert_eq!(std::fs::read(folder.join("src/app.sh")).unwrap(), b"echo hi\n");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(folder.join("src/app.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7000, 0, "setuid dropped");
        // The same archive is the same context.
        assert_eq!(contexts.upload(good).await.unwrap().context, up.context);

        for (name, bad) in [
            ("dot-dot", archive(&[("../escape", tar::EntryType::Regular, b"x")])),
            ("absolute", archive(&[("/etc/cron.d/x", tar::EntryType::Regular, b"x")])),
            ("symlink", archive(&[("link", tar::EntryType::Symlink, b"")])),
            ("hard link", archive(&[("link", tar::EntryType::Link, b"")])),
            ("device", archive(&[("dev", tar::EntryType::Char, b"")])),
            ("not a tar", b"hello".to_vec()),
        ] {
            let e = contexts.upload(bad).await.unwrap_err();
            assert_eq!(e.kind, ErrorKind::Invalid, "{name}: {}", e.message);
        }
        assert!(!dir.path().parent().unwrap().join("escape").exists());
        // Nothing half-made is left: one context folder, no staging.
        let left: Vec<_> = std::fs::read_dir(dir.path().join("contexts"))
            .unwrap()
            .flatten()
            .collect();
        assert_eq!(left.len(), 1);
        let big = archive(&[("big", tar::EntryType::Regular, &vec![0u8; 2 << 20])]);
        assert_eq!(contexts.upload(big).await.unwrap_err().kind, ErrorKind::TooLarge);
        assert_eq!(
            contexts.folder("ctx-../../etc", "c").unwrap_err().kind,
            ErrorKind::NotFound
        );
    }
}
