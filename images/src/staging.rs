//! The staging root of a conversion: what farm adds to every image (as `common_root` in
//! scripts/setup.sh does for the built-in ones), and what is measured of a root folder (its
//! content digest, its size).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::unpack::{remove_any, resolve, EntryPath, PlaceError};
use crate::cache::Artifact;

/// Why farm's files could not be added to an image.
#[derive(Debug, thiserror::Error)]
pub enum AddFarmError {
    #[error(transparent)]
    Place(#[from] PlaceError),
    #[error("{action} /{path} failed")]
    Io {
        action: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("the agent {path:?} has no folder")]
    AgentFolder { path: PathBuf },
}

fn io_failed(action: &'static str, path: impl Into<String>) -> impl FnOnce(io::Error) -> AddFarmError {
    let path = path.into();
    move |source| AddFarmError::Io { action, path, source }
}

/// A path of the image, placed inside `root` (links on the way followed within it).
fn place(root: &Path, path: &str) -> Result<PathBuf, PlaceError> {
    resolve(root, &EntryPath::parse(Path::new(path))?)
}

/// What every farm image has: the agent, the users `farm` (1000) and `farm-checker` (999),
/// `farm-sandbox` as the one setuid program, the folders the agent uses.
pub(super) fn add_farm(root: &Path, agent: &Artifact) -> Result<(), AddFarmError> {
    for d in [
        "sbin",
        "bin",
        "dev",
        "proc",
        "sys",
        "tmp",
        "run",
        "root",
        "etc",
        "workspace",
        "var/tmp",
        "usr/local/bin",
        "home/farm",
    ] {
        let at = place(root, d)?;
        if std::fs::symlink_metadata(&at).is_err() {
            std::fs::create_dir(&at).map_err(io_failed("making", d))?;
        }
    }
    for d in ["tmp", "var/tmp"] {
        std::fs::set_permissions(place(root, d)?, std::fs::Permissions::from_mode(0o1777))
            .map_err(io_failed("setting the mode of", d))?;
    }
    clear_setid_bits(root)?;
    let agent_dir = agent.path.parent().ok_or_else(|| AddFarmError::AgentFolder {
        path: agent.path.clone(),
    })?;
    install(root, &agent.path, "sbin/farm-agent", 0o755, 0)?;
    install(
        root,
        &agent_dir.join("farm-sandbox"),
        "usr/local/bin/farm-sandbox",
        0o4750,
        999,
    )?;
    let etc = place(root, "etc/x")?
        .parent()
        .map(Path::to_path_buf)
        .expect("placed below the root");
    for (name, text) in [
        ("hostname", "farm\n"),
        ("hosts", "127.0.0.1 localhost\n::1 localhost\n"),
    ] {
        let at = etc.join(name);
        remove_any(&at).map_err(io_failed("replacing", format!("etc/{name}")))?;
        std::fs::write(&at, text).map_err(io_failed("writing", format!("etc/{name}")))?;
    }
    add_users(&etc)?;
    std::os::unix::fs::lchown(place(root, "home/farm")?, Some(1000), Some(1000))
        .map_err(io_failed("changing the owner of", "home/farm"))
}

/// No setuid or setgid bit but farm-sandbox's (installed after this).
fn clear_setid_bits(root: &Path) -> Result<(), AddFarmError> {
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        let inside = d.strip_prefix(root).unwrap_or(&d).display().to_string();
        for entry in std::fs::read_dir(&d)
            .map_err(io_failed("listing", inside.clone()))?
            .flatten()
        {
            let m = std::fs::symlink_metadata(entry.path()).map_err(io_failed("listing", inside.clone()))?;
            if m.is_dir() {
                todo.push(entry.path());
            } else if m.is_file() && m.mode() & 0o6000 != 0 {
                let file = entry
                    .path()
                    .strip_prefix(root)
                    .unwrap_or(&entry.path())
                    .display()
                    .to_string();
                std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(m.mode() & 0o1777))
                    .map_err(io_failed("removing the setuid bit of", file))?;
            }
        }
    }
    Ok(())
}

/// Copies `src` to `dest` in the image, owned by root and `gid`, with `mode`.
fn install(root: &Path, src: &Path, dest: &str, mode: u32, gid: u32) -> Result<(), AddFarmError> {
    let at = place(root, dest)?;
    remove_any(&at).map_err(io_failed("replacing", dest))?;
    std::fs::copy(src, &at).map_err(io_failed("installing", dest))?;
    std::os::unix::fs::lchown(&at, Some(0), Some(gid)).map_err(io_failed("changing the owner of", dest))?;
    std::fs::set_permissions(&at, std::fs::Permissions::from_mode(mode)).map_err(io_failed("setting the mode of", dest))
}

/// Adds farm's users and groups to the image's /etc/passwd and /etc/group, keeping the
/// image's own (a name already there is left as it is).
fn add_users(etc: &Path) -> Result<(), AddFarmError> {
    for (file, lines) in [
        (
            "passwd",
            [
                "root:x:0:0:root:/root:/bin/sh",
                "farm-checker:x:999:999:farm checker:/nonexistent:/bin/false",
                "farm:x:1000:1000:farm:/home/farm:/bin/sh",
            ],
        ),
        ("group", ["root:x:0:", "farm-checker:x:999:", "farm:x:1000:"]),
    ] {
        let path = format!("etc/{file}");
        let at = etc.join(file);
        if std::fs::symlink_metadata(&at).is_ok_and(|m| !m.is_file()) {
            remove_any(&at).map_err(io_failed("replacing", path.clone()))?;
        }
        let mut text = std::fs::read_to_string(&at).unwrap_or_default();
        for line in lines {
            let name = line.split(':').next().unwrap_or("");
            if !text.lines().any(|l| l.split(':').next() == Some(name)) {
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                text.push_str(line);
                text.push('\n');
            }
        }
        let mut f = std::fs::File::create(&at).map_err(io_failed("writing", path.clone()))?;
        f.write_all(text.as_bytes())
            .map_err(io_failed("writing", path.clone()))?;
        std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o644))
            .map_err(io_failed("setting the mode of", path))?;
    }
    Ok(())
}

/// A digest of a root filesystem folder: every entry's path, type, mode, owner, size, link
/// target and bytes, in order.
pub(super) fn tree_digest(dir: &Path) -> io::Result<String> {
    let mut h = Sha256::new();
    let mut entries: BTreeMap<PathBuf, std::fs::Metadata> = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let m = std::fs::symlink_metadata(e.path())?;
            if m.is_dir() {
                todo.push(e.path());
            }
            entries.insert(e.path(), m);
        }
    }
    for (path, m) in entries {
        let rel = path.strip_prefix(dir).unwrap_or(&path);
        h.update(
            format!(
                "{}\0{:o}\0{}\0{}\0{}\0",
                rel.display(),
                m.mode(),
                m.uid(),
                m.gid(),
                m.len()
            )
            .as_bytes(),
        );
        if m.file_type().is_symlink() {
            h.update(std::fs::read_link(&path)?.as_os_str().as_encoded_bytes());
        } else if m.is_file() {
            io::copy(&mut std::fs::File::open(&path)?, &mut h)?;
        }
    }
    Ok(format!("sha256:{:x}", h.finalize()))
}

/// The space the files under `root` take, in MiB (blocks, and a little per entry).
pub(super) fn du_mib(root: &Path) -> u64 {
    let mut total = 0u64;
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        if let Ok(entries) = std::fs::read_dir(&d) {
            for e in entries.flatten() {
                if let Ok(m) = std::fs::symlink_metadata(e.path()) {
                    if m.is_dir() {
                        todo.push(e.path());
                    }
                    total += m.blocks() * 512 + 4096;
                }
            }
        }
    }
    total.div_ceil(1 << 20)
}
