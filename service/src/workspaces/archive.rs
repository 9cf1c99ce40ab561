//! What a workspace's archive may hold, decided on the host before a sync is installed: the
//! next holder's guest unpacks it (as root), so nothing in it may reach outside the mount's
//! folder. The guest's archive is read as data (the `tar` crate, never unpacked on the host)
//! and **written again** from the entries that pass, with plain headers: what is stored is
//! only what was checked, so no trick of the guest's `tar` format (an empty name, a zero block,
//! a global header) that another reader takes differently can carry an unchecked entry through.
//!
//! An entry passes when its path is plain and relative and passes through no symbolic link of
//! the archive; a file or folder keeps its permission bits (never set-id or sticky); a symbolic
//! link's target is relative and has no `..`; a hard link names an earlier regular file. Files
//! are owned by whoever unpacks them.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// The most entries a workspace's archive holds.
const MAX_ENTRIES: usize = 1 << 20;

/// What an earlier entry was, for the ones after it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Seen {
    File,
    Folder,
    Link,
}

/// `archive` (a guest's folder, as tar) written again from its entries that may be kept, or
/// why it may not: at most `max_bytes` of file data.
pub fn clean(archive: &[u8], max_bytes: u64) -> Result<Vec<u8>, String> {
    let mut tar = tar::Archive::new(archive);
    let mut out = Cleaned {
        builder: tar::Builder::new(Vec::new()),
        seen: HashMap::new(),
        links: HashSet::new(),
        bytes: 0,
        max_bytes,
    };
    out.builder.mode(tar::HeaderMode::Deterministic);
    for (n, entry) in tar
        .entries()
        .map_err(|e| format!("reading the archive: {e}"))?
        .enumerate()
    {
        if n >= MAX_ENTRIES {
            return Err(format!("more than {MAX_ENTRIES} entries"));
        }
        out.add(entry.map_err(|e| format!("reading the archive: {e}"))?)?;
    }
    out.builder
        .into_inner()
        .map_err(|e| format!("writing the archive: {e}"))
}

/// The archive being written again, and what its entries so far were.
struct Cleaned {
    builder: tar::Builder<Vec<u8>>,
    seen: HashMap<PathBuf, Seen>,
    /// Its symbolic links: no later entry may be under one.
    links: HashSet<PathBuf>,
    bytes: u64,
    max_bytes: u64,
}

impl Cleaned {
    /// One entry, kept as it may be, or why it may not.
    fn add(&mut self, mut entry: tar::Entry<'_, &[u8]>) -> Result<(), String> {
        let raw = entry.path().map_err(|e| format!("an entry's path: {e}"))?.into_owned();
        let path = inside(&raw).ok_or_else(|| format!("{} is not a plain relative path", raw.display()))?;
        let shown = path.display().to_string();
        if path.ancestors().skip(1).any(|a| self.links.contains(a)) {
            return Err(format!("{shown} is under a symbolic link of the archive"));
        }
        let kind = entry.header().entry_type();
        let mut header = tar::Header::new_gnu();
        header.set_mode(entry.header().mode().unwrap_or(0o644) & 0o777);
        header.set_mtime(entry.header().mtime().unwrap_or(0));
        let wrote = |e: std::io::Error| format!("{shown}: {e}");
        let seen = match kind {
            tar::EntryType::Directory if path.as_os_str().is_empty() => return Ok(()), // the root
            tar::EntryType::Directory => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                self.builder
                    .append_data(&mut header, &path, std::io::empty())
                    .map_err(wrote)?;
                Seen::Folder
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                self.bytes += entry.header().size().unwrap_or(0);
                if self.bytes > self.max_bytes {
                    return Err(format!("more than its size ({} MiB)", self.max_bytes >> 20));
                }
                let mut data = Vec::new();
                entry.read_to_end(&mut data).map_err(wrote)?;
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(data.len() as u64);
                self.builder
                    .append_data(&mut header, &path, data.as_slice())
                    .map_err(wrote)?;
                Seen::File
            }
            tar::EntryType::Symlink => {
                let target = link_target(&entry, &shown)?;
                let plain = !target.as_os_str().is_empty()
                    && target
                        .components()
                        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
                if !plain {
                    return Err(format!(
                        "{shown} links to {}, outside the workspace (a link's target is relative, without ..)",
                        target.display()
                    ));
                }
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                header.set_mode(0o777);
                self.builder.append_link(&mut header, &path, &target).map_err(wrote)?;
                self.links.insert(path.clone());
                Seen::Link
            }
            tar::EntryType::Link => {
                let target = link_target(&entry, &shown)?;
                let file = inside(&target).filter(|t| self.seen.get(t) == Some(&Seen::File));
                let file = file.ok_or_else(|| {
                    format!(
                        "{shown} is a hard link to {}, not to an earlier file of the archive, outside the workspace",
                        target.display()
                    )
                })?;
                header.set_entry_type(tar::EntryType::Link);
                header.set_size(0);
                self.builder.append_link(&mut header, &path, &file).map_err(wrote)?;
                Seen::File
            }
            other => {
                return Err(format!(
                    "{shown} is a {other:?}: a workspace holds files, folders and links"
                ))
            }
        };
        self.seen.insert(path, seen);
        Ok(())
    }
}

fn link_target(entry: &tar::Entry<'_, &[u8]>, shown: &str) -> Result<PathBuf, String> {
    Ok(entry
        .link_name()
        .map_err(|e| format!("{shown}: its target: {e}"))?
        .ok_or_else(|| format!("{shown}: a link without a target"))?
        .into_owned())
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
            ("./venv/", Directory, ""),
            ("./venv/lib64", Symlink, "lib"),
            ("./hard", Link, "./src/main.py"),
        ]);
        let kept = clean(&good, 1 << 20).unwrap();
        let mut names: Vec<String> = tar::Archive::new(kept.as_slice())
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        names.sort();
        assert_eq!(names, ["hard", "src", "src/link", "src/main.py", "venv", "venv/lib64"]);
        for (said, bad) in [
            ("not a plain relative path", archive(&[("/etc/passwd", Regular, "x")])),
            ("not a plain relative path", archive(&[("../x", Regular, "x")])),
            ("outside the workspace", archive(&[("l", Symlink, "/etc")])),
            ("outside the workspace", archive(&[("a/l", Symlink, "../../etc")])),
            ("outside the workspace", archive(&[("d/up", Symlink, "..")])),
            ("outside the workspace", archive(&[("h", Link, "../../etc/shadow")])),
            (
                "outside the workspace",
                archive(&[("s", Symlink, "x"), ("h", Link, "s")]),
            ),
            (
                "under a symbolic link",
                archive(&[("l", Symlink, "sub"), ("l/f", Regular, "x")]),
            ),
            ("holds files, folders and links", archive(&[("d", Char, "")])),
            ("holds files, folders and links", archive(&[("f", Fifo, "")])),
        ] {
            let e = clean(&bad, 1 << 20).unwrap_err();
            assert!(e.contains(said), "{e}");
        }
        let big = archive(&[("big", Regular, &"x".repeat(3000))]);
        assert!(clean(&big, 2048).unwrap_err().contains("size"));
        // Set-id bits go; what is kept is only what was read.
        let mut raw = archive(&[("tool", Regular, "#!/bin/sh\n")]);
        let mut header = tar::Header::from_byte_slice(&raw[..512]).clone();
        header.set_mode(0o4755);
        header.set_cksum();
        raw[..512].copy_from_slice(header.as_bytes());
        let kept = clean(&raw, 1 << 20).unwrap();
        let mut entries = tar::Archive::new(kept.as_slice());
        let mode = entries
            .entries()
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .header()
            .mode()
            .unwrap();
        assert_eq!(mode, 0o755);
    }
}
