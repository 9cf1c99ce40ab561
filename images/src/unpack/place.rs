//! Placing a tar entry inside the root: its path parsed (an absolute path or one with `..`
//! refused) and resolved the way the guest will see it, a link met on the way followed
//! within the root, so that nothing is ever written outside.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

/// Why an entry path cannot be placed inside the root.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    #[error("entry {entry:?} has a `..` component")]
    ParentComponent { entry: PathBuf },
    #[error("entry {entry:?} is absolute")]
    Absolute { entry: PathBuf },
    #[error("entry {entry:?}: too many levels of symbolic links")]
    LinkLoop { entry: PathBuf },
    #[error("entry {entry:?}: {folder:?} is not a folder")]
    NotAFolder { entry: PathBuf, folder: PathBuf },
    #[error("entry {entry:?}: reading the link {link:?} failed")]
    ReadLink {
        entry: PathBuf,
        link: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("entry {entry:?}: creating the folder {folder:?} failed")]
    MakeFolder {
        entry: PathBuf,
        folder: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A tar entry's path, and the components it names inside the root.
#[derive(Debug, Clone)]
pub(crate) struct EntryPath {
    pub(super) raw: PathBuf,
    pub(super) parts: Vec<OsString>,
}

impl EntryPath {
    /// The entry's components, or why it is refused (absolute, `..`).
    pub(crate) fn parse(raw: &Path) -> Result<EntryPath, PlaceError> {
        let mut parts = Vec::new();
        for c in raw.components() {
            match c {
                Component::Normal(n) => parts.push(n.to_os_string()),
                Component::CurDir => {}
                Component::ParentDir => {
                    return Err(PlaceError::ParentComponent {
                        entry: raw.to_path_buf(),
                    })
                }
                Component::RootDir | Component::Prefix(_) => {
                    return Err(PlaceError::Absolute {
                        entry: raw.to_path_buf(),
                    })
                }
            }
        }
        Ok(EntryPath {
            raw: raw.to_path_buf(),
            parts,
        })
    }

    pub(super) fn name(&self) -> Option<&OsString> {
        self.parts.last()
    }
}

/// An entry resolved inside `root` the way the guest will see it: a link met on the way is
/// followed within the root (an absolute target starts at the root, `..` stops at it); the
/// last component is not followed. Missing folders on the way are made.
pub(crate) fn resolve(root: &Path, entry: &EntryPath) -> Result<PathBuf, PlaceError> {
    let components = &entry.parts;
    let mut stack: Vec<OsString> = Vec::new();
    let mut queue: VecDeque<OsString> = components[..components.len().saturating_sub(1)]
        .iter()
        .cloned()
        .collect();
    let mut hops = 0;
    while let Some(c) = queue.pop_front() {
        if c == ".." {
            stack.pop();
            continue;
        }
        if c == "." || c.is_empty() {
            continue;
        }
        let here: PathBuf = stack.iter().fold(root.to_path_buf(), |p, s| p.join(s)).join(&c);
        let inside = || here.strip_prefix(root).unwrap_or(&here).to_path_buf();
        match std::fs::symlink_metadata(&here) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > 40 {
                    return Err(PlaceError::LinkLoop {
                        entry: entry.raw.clone(),
                    });
                }
                let target = std::fs::read_link(&here).map_err(|source| PlaceError::ReadLink {
                    entry: entry.raw.clone(),
                    link: inside(),
                    source,
                })?;
                if target.is_absolute() {
                    stack.clear();
                }
                let mut rest: VecDeque<OsString> = target
                    .components()
                    .filter_map(|t| match t {
                        Component::Normal(n) => Some(n.to_os_string()),
                        Component::ParentDir => Some("..".into()),
                        _ => None,
                    })
                    .collect();
                rest.extend(queue.drain(..));
                queue = rest;
            }
            Ok(m) if m.is_dir() => stack.push(c),
            Ok(_) => {
                return Err(PlaceError::NotAFolder {
                    entry: entry.raw.clone(),
                    folder: inside(),
                })
            }
            Err(_) => {
                std::fs::create_dir(&here).map_err(|source| PlaceError::MakeFolder {
                    entry: entry.raw.clone(),
                    folder: inside(),
                    source,
                })?;
                stack.push(c);
            }
        }
    }
    let parent = stack.iter().fold(root.to_path_buf(), |p, s| p.join(s));
    Ok(match components.last() {
        Some(last) => parent.join(last),
        None => parent,
    })
}

/// Removes whatever is at `path` (never following a link).
pub(crate) fn remove_any(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(p: &str) -> EntryPath {
        EntryPath::parse(Path::new(p)).unwrap()
    }

    #[test]
    fn links_met_while_unpacking_stay_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("root"), dir.path().join("outside"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../../..", root.join("up")).unwrap();
        // An absolute target is the image's root, not the host's.
        let at = resolve(&root, &entry("abs/file")).unwrap();
        assert!(at.starts_with(&root), "{}", at.display());
        let at = resolve(&root, &entry("up/etc/passwd")).unwrap();
        assert_eq!(at, root.join("etc/passwd"));
        assert!(EntryPath::parse(Path::new("../x"))
            .unwrap_err()
            .to_string()
            .contains("`..`"));
        assert!(EntryPath::parse(Path::new("/etc/x"))
            .unwrap_err()
            .to_string()
            .contains("absolute"));
        assert!(
            std::fs::read_dir(&outside).unwrap().next().is_none(),
            "nothing was made outside"
        );
    }
}
