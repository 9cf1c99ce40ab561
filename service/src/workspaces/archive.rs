//! What a workspace's archive may hold, checked on the host before a sync is installed: the
//! next holder's guest unpacks it, so nothing in it may reach outside the mount's folder.
//! Read as data (the `tar` crate), never unpacked on the host.

use std::path::{Component, Path, PathBuf};

/// The most entries a workspace's archive holds.
const MAX_ENTRIES: usize = 1 << 20;

/// Whether `archive` is a workspace's: plain relative paths; regular files, folders, and links
/// (symbolic or hard) whose targets stay inside; at most `max_bytes` of file data.
pub fn check(archive: &[u8], max_bytes: u64) -> Result<(), String> {
    if archive.len() as u64 > max_bytes.saturating_add(max_bytes / 4 + (1 << 20)) {
        return Err(format!("more than its size ({} MiB)", max_bytes >> 20));
    }
    let mut tar = tar::Archive::new(archive);
    let (mut bytes, mut entries) = (0u64, 0usize);
    for entry in tar.entries().map_err(|e| format!("reading the archive: {e}"))? {
        let entry = entry.map_err(|e| format!("reading the archive: {e}"))?;
        entries += 1;
        if entries > MAX_ENTRIES {
            return Err(format!("more than {MAX_ENTRIES} entries"));
        }
        let path = entry.path().map_err(|e| format!("an entry's path: {e}"))?.into_owned();
        let inside = inside(&path).ok_or_else(|| format!("{} is not a plain relative path", path.display()))?;
        let kind = entry.header().entry_type();
        match kind {
            tar::EntryType::Directory => {}
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                bytes += entry.header().size().unwrap_or(0);
                if bytes > max_bytes {
                    return Err(format!("more than its size ({} MiB)", max_bytes >> 20));
                }
            }
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(|e| format!("{}: its target: {e}", path.display()))?
                    .ok_or_else(|| format!("{}: a link without a target", path.display()))?
                    .into_owned();
                // A symbolic link's target is relative to its folder; a hard link's, to the
                // archive's root.
                let from = match kind {
                    tar::EntryType::Symlink => inside.parent().map(Path::to_path_buf).unwrap_or_default(),
                    _ => PathBuf::new(),
                };
                if target.is_absolute() || inside_of(&from, &target).is_none() {
                    return Err(format!(
                        "{} links to {}, outside the workspace",
                        path.display(),
                        target.display()
                    ));
                }
            }
            // Extended headers carry long names and attributes of the next entry.
            tar::EntryType::XHeader
            | tar::EntryType::XGlobalHeader
            | tar::EntryType::GNULongName
            | tar::EntryType::GNULongLink => {}
            other => {
                return Err(format!(
                    "{} is a {other:?}: a workspace holds files, folders and links",
                    path.display()
                ))
            }
        }
    }
    Ok(())
}

/// `path` as a path inside the root (`./x` is `x`; the root itself is empty), or None when it
/// is absolute or climbs out.
fn inside(path: &Path) -> Option<PathBuf> {
    inside_of(Path::new(""), path)
}

/// `path`, relative to the folder `from` inside the root, resolved lexically; None when it
/// leaves the root.
fn inside_of(from: &Path, path: &Path) -> Option<PathBuf> {
    let mut out: Vec<&std::ffi::OsStr> = from
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    for component in path.components() {
        match component {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out.iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An archive with these entries, their names and link targets written as given (the
    /// `tar` crate's setters refuse the hostile ones).
    fn archive(entries: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, kind, data) in entries {
            let mut header = tar::Header::new_old();
            header.set_entry_type(*kind);
            header.set_mode(0o644);
            let raw = header.as_old_mut();
            raw.name[..path.len()].copy_from_slice(path.as_bytes());
            let body = match kind {
                tar::EntryType::Symlink | tar::EntryType::Link => {
                    raw.linkname[..data.len()].copy_from_slice(data.as_bytes());
                    ""
                }
                _ => data,
            };
            header.set_size(body.len() as u64);
            header.set_cksum();
            builder.append(&header, body.as_bytes()).unwrap();
        }
        builder.into_inner().unwrap()
    }

    #[test]
    fn an_archive_stays_inside_its_workspace() {
        use tar::EntryType::{Char, Directory, Fifo, Link, Regular, Symlink};
        let good = archive(&[
            ("./", Directory, ""),
            ("./src/", Directory, ""),
            ("./src/main.py", Regular, "print(1)\n"),
            ("./src/link", Symlink, "main.py"),
            ("./up", Symlink, "src/../src/main.py"),
            ("./venv/lib", Symlink, "../src"),
            ("./hard", Link, "./src/main.py"),
        ]);
        assert_eq!(check(&good, 1 << 20), Ok(()));
        for (said, bad) in [
            ("not a plain relative path", archive(&[("/etc/passwd", Regular, "x")])),
            ("not a plain relative path", archive(&[("../x", Regular, "x")])),
            ("outside the workspace", archive(&[("l", Symlink, "/etc")])),
            ("outside the workspace", archive(&[("a/l", Symlink, "../../etc")])),
            ("outside the workspace", archive(&[("h", Link, "../../etc/shadow")])),
            ("holds files, folders and links", archive(&[("d", Char, "")])),
            ("holds files, folders and links", archive(&[("f", Fifo, "")])),
        ] {
            let e = check(&bad, 1 << 20).unwrap_err();
            assert!(e.contains(said), "{e}");
        }
        let big = archive(&[("big", Regular, &"x".repeat(3000))]);
        assert!(check(&big, 2048).unwrap_err().contains("size"));
    }
}
