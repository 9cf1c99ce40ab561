//! File requests: writing, reading, listing and removing files, handing a tree to a user,
//! removing a tree.
//!
//! Operations *confined* to a folder (`beneath`) are how the host places an agent's files
//! into a scoring VM: every path component is opened relative to its parent with
//! `O_NOFOLLOW`, so a symbolic link anywhere on the way (one the task's own setup made, say)
//! is refused rather than followed out of the folder, and a file is written under a
//! temporary name and renamed into place, so an existing symbolic or hard link at the
//! destination is replaced, never written through.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use farm_protocol::{AgentError, ErrorKind, FileEntry, ReadFileRequest, WriteFileRequest};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::sys;
use crate::users::{self, User};

fn io_error(what: String, e: std::io::Error) -> AgentError {
    AgentError {
        kind: ErrorKind::Io,
        message: format!("{what}: {e}"),
    }
}

fn errno_error(what: String, e: Errno) -> AgentError {
    let reason = match e {
        Errno::ELOOP => "a symbolic link is in the way (links are not followed here)".to_string(),
        Errno::ENOTDIR => "a path component is not a folder".to_string(),
        Errno::EISDIR => "a folder is in the way".to_string(),
        other => other.desc().to_string(),
    };
    AgentError {
        kind: ErrorKind::Io,
        message: format!("{what}: {reason}"),
    }
}

fn bad_request(message: String) -> AgentError {
    AgentError {
        kind: ErrorKind::BadRequest,
        message,
    }
}

fn owner_of(spec: &Option<String>) -> Result<User, AgentError> {
    match spec {
        None => Ok(User::ROOT),
        Some(spec) => users::resolve(spec).map_err(|e| bad_request(crate::describe(&e))),
    }
}

/// The components of a path confined to a folder: relative, no `.`, `..` or empty parts.
pub fn confined_components(rel: &str) -> Result<Vec<&str>, AgentError> {
    let parts: Vec<&str> = rel.split('/').collect();
    if rel.is_empty()
        || rel.starts_with('/')
        || rel.contains('\0')
        || parts.iter().any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return Err(bad_request(format!("{rel:?} is not a plain relative path")));
    }
    Ok(parts)
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Opens the confining folder itself; it must not be a symbolic link.
fn open_root(root: &str) -> Result<OwnedFd, AgentError> {
    sys::openat(None, root, DIR_FLAGS, Mode::empty()).map_err(|e| errno_error(format!("opening {root}"), e))
}

/// Opens the folder holding the last component of `parts`, walking from `root` without
/// following links. With `create`, missing folders are made (mode 0755, owned by the user).
fn open_parent(root: &str, parts: &[&str], create: Option<&User>) -> Result<OwnedFd, AgentError> {
    let mut dir = open_root(root)?;
    for (i, part) in parts[..parts.len() - 1].iter().enumerate() {
        let shown = || format!("{root}/{}", parts[..=i].join("/"));
        let next = match sys::openat(Some(dir.as_fd()), *part, DIR_FLAGS, Mode::empty()) {
            Err(Errno::ENOENT) if create.is_some() => {
                let owner = create.expect("checked");
                match nix::sys::stat::mkdirat(Some(dir.as_raw_fd()), *part, Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(errno_error(format!("creating {}", shown()), e)),
                }
                let opened = sys::openat(Some(dir.as_fd()), *part, DIR_FLAGS, Mode::empty())
                    .map_err(|e| errno_error(format!("opening {}", shown()), e))?;
                nix::unistd::fchown(opened.as_raw_fd(), Some(owner.uid.into()), Some(owner.gid.into()))
                    .map_err(|e| errno_error(format!("giving {} to uid {}", shown(), owner.uid), e))?;
                opened
            }
            Err(e) => return Err(errno_error(format!("opening {}", shown()), refine(&dir, part, e))),
            Ok(fd) => fd,
        };
        dir = next;
    }
    Ok(dir)
}

/// ENOTDIR from opening a symbolic link as a folder says too little: tell a link apart.
fn refine(dir: &OwnedFd, name: &str, e: Errno) -> Errno {
    if e == Errno::ENOTDIR {
        if let Ok(stat) = nix::sys::stat::fstatat(Some(dir.as_raw_fd()), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
        {
            if stat.st_mode & libc::S_IFMT == libc::S_IFLNK {
                return Errno::ELOOP;
            }
        }
    }
    e
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes a file as the request says, returning the bytes written.
pub fn write_file(req: &WriteFileRequest, contents: &[u8]) -> Result<u64, AgentError> {
    let owner = owner_of(&req.owner)?;
    match &req.beneath {
        Some(root) => write_confined(root, &req.path, contents, req.mode & 0o777, &owner),
        None => write_plain(req, contents, &owner),
    }
}

/// An unconfined write, made with the owner's permissions (as root when the owner is root):
/// a rollout that runs as an unprivileged user cannot write where that user could not.
fn write_plain(req: &WriteFileRequest, contents: &[u8], owner: &User) -> Result<u64, AgentError> {
    let _as_owner = (!owner.is_root()).then(|| sys::FsUser::assume(owner.uid, owner.gid));
    let path = Path::new(&req.path);
    if req.create_parents {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_error(format!("creating {}", parent.display()), e))?;
        }
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(req.mode)
        .open(path)
        .map_err(|e| io_error(format!("opening {} for writing", req.path), e))?;
    file.write_all(contents)
        .map_err(|e| io_error(format!("writing {}", req.path), e))?;
    // The mode given at creation is filtered by the umask; set it exactly.
    file.set_permissions(std::fs::Permissions::from_mode(req.mode))
        .map_err(|e| io_error(format!("setting the mode of {}", req.path), e))?;
    Ok(contents.len() as u64)
}

fn write_confined(root: &str, rel: &str, contents: &[u8], mode: u32, owner: &User) -> Result<u64, AgentError> {
    let parts = confined_components(rel)?;
    let shown = format!("{root}/{rel}");
    let dir = open_parent(root, &parts, Some(owner))?;
    let name = parts[parts.len() - 1];
    let temp = format!(
        ".farm-write-{}-{}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = sys::openat(Some(dir.as_fd()), temp.as_str(), flags, Mode::from_bits_truncate(0o600))
        .map_err(|e| errno_error(format!("creating a file beside {shown}"), e))?;
    let mut file = File::from(fd);
    let written = (|| {
        file.write_all(contents)
            .map_err(|e| io_error(format!("writing {shown}"), e))?;
        nix::unistd::fchown(file.as_raw_fd(), Some(owner.uid.into()), Some(owner.gid.into()))
            .map_err(|e| errno_error(format!("giving {shown} to uid {}", owner.uid), e))?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| io_error(format!("setting the mode of {shown}"), e))?;
        nix::fcntl::renameat(Some(dir.as_raw_fd()), temp.as_str(), Some(dir.as_raw_fd()), name)
            .map_err(|e| errno_error(format!("moving {shown} into place"), e))
    })();
    if let Err(e) = written {
        let _ = nix::unistd::unlinkat(
            Some(dir.as_raw_fd()),
            temp.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
        return Err(e);
    }
    Ok(contents.len() as u64)
}

/// Opens a file for reading without blocking on FIFOs; refuses anything but a regular file.
fn open_regular(dir: Option<BorrowedFd>, path: &str, nofollow: bool, shown: &str) -> Result<File, AgentError> {
    let mut flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    if nofollow {
        flags |= OFlag::O_NOFOLLOW;
    }
    let fd = sys::openat(dir, path, flags, Mode::empty()).map_err(|e| errno_error(format!("opening {shown}"), e))?;
    let file = File::from(fd);
    let meta = file
        .metadata()
        .map_err(|e| io_error(format!("reading metadata of {shown}"), e))?;
    if !meta.is_file() {
        return Err(AgentError {
            kind: ErrorKind::Io,
            message: format!("{shown} is not a regular file"),
        });
    }
    Ok(file)
}

/// Reads at most `max_bytes` of a regular file; returns (its size, the bytes).
pub fn read_file(req: &ReadFileRequest) -> Result<(u64, Vec<u8>), AgentError> {
    let file = match &req.beneath {
        Some(root) => {
            let parts = confined_components(&req.path)?;
            let dir = open_parent(root, &parts, None)?;
            open_regular(
                Some(dir.as_fd()),
                parts[parts.len() - 1],
                true,
                &format!("{root}/{}", req.path),
            )?
        }
        None => open_regular(None, &req.path, false, &req.path)?,
    };
    read_capped(file, req.offset, req.max_bytes, &req.path)
}

fn read_capped(mut file: File, offset: u64, max_bytes: u64, shown: &str) -> Result<(u64, Vec<u8>), AgentError> {
    use std::io::Seek;
    let size = file
        .metadata()
        .map_err(|e| io_error(format!("reading metadata of {shown}"), e))?
        .len();
    if offset > 0 {
        file.seek(std::io::SeekFrom::Start(offset))
            .map_err(|e| io_error(format!("reading {shown}"), e))?;
    }
    let mut data = Vec::new();
    file.take(max_bytes)
        .read_to_end(&mut data)
        .map_err(|e| io_error(format!("reading {shown}"), e))?;
    Ok((size.max(offset + data.len() as u64), data))
}

/// Reads a verdict file (reward, JUnit) at an absolute path without following a link at its
/// last component: its size and at most `max_bytes` of it; None when it is missing or is not
/// a regular file.
pub fn read_verdict_file(path: &str, max_bytes: u64) -> Option<(u64, Vec<u8>)> {
    let file = open_regular(None, path, true, path).ok()?;
    read_capped(file, 0, max_bytes, path).ok()
}

/// Removes a file; a missing one is not an error.
pub fn remove_file(path: &str, beneath: Option<&str>) -> Result<(), AgentError> {
    let result = match beneath {
        Some(root) => {
            let parts = confined_components(path)?;
            let dir = match open_parent(root, &parts, None) {
                Ok(dir) => dir,
                // A parent that is missing means the file is too.
                Err(_) if !Path::new(root).join(path).parent().is_some_and(|p| p.exists()) => return Ok(()),
                Err(e) => return Err(e),
            };
            nix::unistd::unlinkat(
                Some(dir.as_raw_fd()),
                parts[parts.len() - 1],
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            )
        }
        None => nix::unistd::unlink(path),
    };
    match result {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(errno_error(format!("removing {path}"), e)),
    }
}

/// Walks `root/rel` depth-first without following symlinks or crossing file systems.
/// Returns whether entries were left out because of `max`.
pub fn list_files(
    root: &Path,
    rel: &Path,
    max: usize,
    out: &mut Vec<FileEntry>,
    depth: usize,
) -> std::io::Result<bool> {
    let dir = root.join(rel);
    let root_dev = std::fs::symlink_metadata(root)?.dev();
    let mut names: Vec<_> = std::fs::read_dir(&dir)?.flatten().map(|e| e.file_name()).collect();
    names.sort();
    for name in names {
        let rel_path = rel.join(&name);
        let Ok(meta) = std::fs::symlink_metadata(root.join(&rel_path)) else {
            continue;
        };
        if meta.dev() != root_dev {
            continue;
        }
        if meta.is_dir() {
            if depth < 64 && list_files(root, &rel_path, max, out, depth + 1)? {
                return Ok(true);
            }
        } else if meta.is_file() {
            if out.len() >= max {
                return Ok(true);
            }
            out.push(FileEntry {
                path: rel_path.to_string_lossy().into_owned(),
                size: meta.len(),
                mtime_ns: meta
                    .mtime()
                    .saturating_mul(1_000_000_000)
                    .saturating_add(meta.mtime_nsec()),
                mode: meta.mode() & 0o7777,
            });
        }
    }
    Ok(false)
}

/// Entries a tree walk visits at most (a guard against a hostile tree).
const MAX_TREE_ENTRIES: u64 = 2_000_000;
const MAX_TREE_DEPTH: usize = 128;

/// What to do with every entry of a tree.
enum TreeAction<'a> {
    /// Give it to a user; `dir_mode`/`file_mode` reset modes when set.
    Chown {
        user: &'a User,
        modes: Option<&'a dyn Fn(bool, u32) -> u32>,
    },
    Remove,
}

/// Walks the folder open at `dir` (on device `dev`), applying `action` to each entry.
fn walk_tree(dir: &OwnedFd, dev: u64, action: &TreeAction, depth: usize, count: &mut u64) -> Result<(), Errno> {
    if depth > MAX_TREE_DEPTH {
        return Err(Errno::ELOOP);
    }
    let listing = sys::openat(Some(dir.as_fd()), ".", DIR_FLAGS, Mode::empty())?;
    let mut names = Vec::new();
    for entry in sys::read_dir(listing)? {
        if entry.as_bytes() != b"." && entry.as_bytes() != b".." {
            names.push(entry);
        }
    }
    for name in names {
        *count += 1;
        if *count > MAX_TREE_ENTRIES {
            return Err(Errno::E2BIG);
        }
        let stat = nix::sys::stat::fstatat(
            Some(dir.as_raw_fd()),
            name.as_c_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )?;
        let is_dir = stat.st_mode & libc::S_IFMT == libc::S_IFDIR;
        if is_dir && stat.st_dev == dev {
            let child = sys::openat(Some(dir.as_fd()), name.as_c_str(), DIR_FLAGS, Mode::empty())?;
            walk_tree(&child, dev, action, depth + 1, count)?;
        }
        match action {
            TreeAction::Chown { user, modes } => {
                nix::unistd::fchownat(
                    Some(dir.as_raw_fd()),
                    name.as_c_str(),
                    Some(user.uid.into()),
                    Some(user.gid.into()),
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                )?;
                let is_link = stat.st_mode & libc::S_IFMT == libc::S_IFLNK;
                if let (Some(modes), false) = (modes, is_link) {
                    let mode = modes(is_dir, stat.st_mode & 0o7777);
                    nix::sys::stat::fchmodat(
                        Some(dir.as_raw_fd()),
                        name.as_c_str(),
                        Mode::from_bits_truncate(mode),
                        nix::sys::stat::FchmodatFlags::FollowSymlink,
                    )?;
                }
            }
            TreeAction::Remove => {
                let flag = if is_dir {
                    nix::unistd::UnlinkatFlags::RemoveDir
                } else {
                    nix::unistd::UnlinkatFlags::NoRemoveDir
                };
                nix::unistd::unlinkat(Some(dir.as_raw_fd()), name.as_c_str(), flag)?;
            }
        }
    }
    Ok(())
}

/// Gives `root` and everything under it to `user` (links themselves, never their targets).
/// `modes` (is_dir, current mode) -> new mode, when the modes are reset too. Returns the
/// entries visited.
pub fn handover(root: &str, user: &User, modes: Option<&dyn Fn(bool, u32) -> u32>) -> Result<u64, AgentError> {
    let dir = open_root(root)?;
    let meta = File::from(
        sys::openat(Some(dir.as_fd()), ".", DIR_FLAGS, Mode::empty())
            .map_err(|e| errno_error(format!("opening {root}"), e))?,
    )
    .metadata()
    .map_err(|e| io_error(format!("reading metadata of {root}"), e))?;
    let mut count = 0;
    walk_tree(&dir, meta.dev(), &TreeAction::Chown { user, modes }, 0, &mut count)
        .map_err(|e| errno_error(format!("handing {root} over to uid {}", user.uid), e))?;
    nix::unistd::fchown(dir.as_raw_fd(), Some(user.uid.into()), Some(user.gid.into()))
        .map_err(|e| errno_error(format!("handing {root} over"), e))?;
    if let Some(modes) = modes {
        nix::sys::stat::fchmod(
            dir.as_raw_fd(),
            Mode::from_bits_truncate(modes(true, meta.mode() & 0o7777)),
        )
        .map_err(|e| errno_error(format!("setting the mode of {root}"), e))?;
    }
    Ok(count + 1)
}

/// Removes `path` and everything under it without following links; a missing path is not
/// an error. Returns the entries removed.
pub fn remove_tree(path: &str) -> Result<u64, AgentError> {
    let trimmed = path.trim_end_matches('/');
    if !trimmed.starts_with('/') || trimmed.is_empty() {
        return Err(bad_request(format!("{path:?} is not an absolute path below /")));
    }
    let (parent, name) = trimmed.rsplit_once('/').expect("absolute");
    let parent = if parent.is_empty() { "/" } else { parent };
    let parent_fd = match open_root(parent) {
        Ok(fd) => fd,
        Err(_) if !Path::new(parent).exists() => return Ok(0),
        Err(e) => return Err(e),
    };
    let stat = match nix::sys::stat::fstatat(
        Some(parent_fd.as_raw_fd()),
        name,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    ) {
        Ok(stat) => stat,
        Err(Errno::ENOENT) => return Ok(0),
        Err(e) => return Err(errno_error(format!("looking at {path}"), e)),
    };
    let mut count = 0;
    if stat.st_mode & libc::S_IFMT == libc::S_IFDIR {
        let dir = sys::openat(Some(parent_fd.as_fd()), name, DIR_FLAGS, Mode::empty())
            .map_err(|e| errno_error(format!("opening {path}"), e))?;
        walk_tree(&dir, stat.st_dev, &TreeAction::Remove, 0, &mut count)
            .map_err(|e| errno_error(format!("removing {path}"), e))?;
        nix::unistd::unlinkat(Some(parent_fd.as_raw_fd()), name, nix::unistd::UnlinkatFlags::RemoveDir)
            .map_err(|e| errno_error(format!("removing {path}"), e))?;
    } else {
        nix::unistd::unlinkat(
            Some(parent_fd.as_raw_fd()),
            name,
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        )
        .map_err(|e| errno_error(format!("removing {path}"), e))?;
    }
    Ok(count + 1)
}

/// Makes `path` an empty file owned by `user` with mode 0600. A regular file already there
/// is truncated and reused (so no new inode is needed: the host creates the verdict files
/// before the agent's files are placed, which could exhaust the disk's inodes); anything
/// else there (a link, say) is replaced; a folder is refused.
pub fn create_private_file(path: &str, user: &User) -> Result<(), AgentError> {
    let reuse = OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let existing = sys::openat(None, path, reuse, Mode::empty())
        .ok()
        .map(File::from)
        .filter(|f| f.metadata().is_ok_and(|m| m.is_file()));
    let file = match existing {
        Some(file) => file,
        None => {
            match nix::unistd::unlink(path) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(errno_error(format!("clearing {path}"), e)),
            }
            let create = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            File::from(
                sys::openat(None, path, create, Mode::from_bits_truncate(0o600))
                    .map_err(|e| errno_error(format!("creating {path}"), e))?,
            )
        }
    };
    file.set_len(0).map_err(|e| io_error(format!("emptying {path}"), e))?;
    nix::unistd::fchown(file.as_raw_fd(), Some(user.uid.into()), Some(user.gid.into()))
        .map_err(|e| errno_error(format!("giving {path} to uid {}", user.uid), e))?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| io_error(format!("setting the mode of {path}"), e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn write(root: &Path, rel: &str, text: &str, mode: u32) -> Result<u64, AgentError> {
        let req = WriteFileRequest {
            path: rel.into(),
            mode,
            create_parents: true,
            beneath: Some(root.to_string_lossy().into_owned()),
            owner: None,
        };
        write_file(&req, text.as_bytes())
    }

    #[test]
    fn confined_writes_never_follow_links_out() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("workspace");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("target"), "precious").unwrap();
        // A link to a folder outside, made by the task's setup: writing through it is refused.
        symlink(&outside, root.join("vendor")).unwrap();
        let err = write(&root, "vendor/evil.pth", "x", 0o644).unwrap_err();
        assert!(err.message.contains("symbolic link"), "{}", err.message);
        assert!(!outside.join("evil.pth").exists());
        // A link at the destination is replaced by the file, its target left alone.
        symlink(outside.join("target"), root.join("out.txt")).unwrap();
        write(&root, "out.txt", "mine", 0o644).unwrap();
        assert_eq!(std::fs::read_to_string(outside.join("target")).unwrap(), "precious");
        assert_eq!(std::fs::read_to_string(root.join("out.txt")).unwrap(), "mine");
        assert!(!std::fs::symlink_metadata(root.join("out.txt"))
            .unwrap()
            .file_type()
            .is_symlink());
        // So is a hard link: the other name keeps its contents.
        std::fs::hard_link(outside.join("target"), root.join("hard.txt")).unwrap();
        write(&root, "hard.txt", "mine", 0o644).unwrap();
        assert_eq!(std::fs::read_to_string(outside.join("target")).unwrap(), "precious");
        // Paths that climb are refused outright.
        for bad in ["../outside/x", "/etc/passwd", "a/../../x", "./a", ""] {
            assert!(write(&root, bad, "x", 0o644).is_err(), "{bad}");
        }
        // Parents are created; setuid, setgid and sticky bits are dropped.
        write(&root, "a/b/c.sh", "#!/bin/sh", 0o6755).unwrap();
        let mode = std::fs::metadata(root.join("a/b/c.sh")).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o755);
    }

    #[test]
    fn confined_reads_and_removals_refuse_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("w");
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::fs::write(dir.path().join("secret"), "s").unwrap();
        symlink(dir.path().join("secret"), root.join("link")).unwrap();
        symlink(dir.path(), root.join("up")).unwrap();
        let read = |p: &str| {
            read_file(&ReadFileRequest {
                path: p.into(),
                max_bytes: 10,
                beneath: Some(root.to_string_lossy().into_owned()),
                offset: 0,
            })
        };
        assert!(read("link").is_err());
        assert!(read("up/secret").is_err());
        std::fs::write(root.join("d/f"), "ok").unwrap();
        assert_eq!(read("d/f").unwrap().1, b"ok");
        // Removing through a link is refused; the target survives.
        assert!(remove_file("up/secret", Some(&root.to_string_lossy())).is_err());
        assert!(dir.path().join("secret").exists());
        remove_file("d/f", Some(&root.to_string_lossy())).unwrap();
        remove_file("d/missing", Some(&root.to_string_lossy())).unwrap();
        remove_file("nothere/missing", Some(&root.to_string_lossy())).unwrap();
    }

    #[test]
    fn plain_reads_refuse_fifos_and_devices() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o644)).unwrap();
        let req = ReadFileRequest {
            path: fifo.to_string_lossy().into_owned(),
            max_bytes: 10,
            beneath: None,
            offset: 0,
        };
        assert!(read_file(&req).unwrap_err().message.contains("not a regular file"));
        let req = ReadFileRequest {
            path: "/dev/zero".into(),
            max_bytes: 10,
            beneath: None,
            offset: 0,
        };
        assert!(read_file(&req).is_err());
    }

    #[test]
    fn remove_tree_stays_inside() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        std::fs::write(tree.join("a/b/f"), "x").unwrap();
        std::fs::create_dir_all(dir.path().join("keep")).unwrap();
        std::fs::write(dir.path().join("keep/k"), "k").unwrap();
        symlink(dir.path().join("keep"), tree.join("a/link")).unwrap();
        let removed = remove_tree(&tree.to_string_lossy()).unwrap();
        assert_eq!(removed, 5);
        assert!(!tree.exists());
        assert!(dir.path().join("keep/k").exists());
        assert_eq!(remove_tree(&tree.to_string_lossy()).unwrap(), 0);
    }

    #[test]
    fn handover_resets_modes_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tests");
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        std::fs::write(tree.join("sub/t.py"), "x").unwrap();
        std::fs::write(dir.path().join("outside"), "o").unwrap();
        std::fs::set_permissions(dir.path().join("outside"), std::fs::Permissions::from_mode(0o600)).unwrap();
        symlink(dir.path().join("outside"), tree.join("link")).unwrap();
        let modes = |is_dir: bool, _: u32| if is_dir { 0o700 } else { 0o400 };
        let me = User {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            home: None,
        };
        assert_eq!(handover(&tree.to_string_lossy(), &me, Some(&modes)).unwrap(), 4);
        assert_eq!(std::fs::metadata(tree.join("sub/t.py")).unwrap().mode() & 0o777, 0o400);
        assert_eq!(std::fs::metadata(&tree).unwrap().mode() & 0o777, 0o700);
        assert_eq!(
            std::fs::metadata(dir.path().join("outside")).unwrap().mode() & 0o777,
            0o600,
            "link target untouched"
        );
    }

    /// A rollout that runs as an unprivileged user writes with that user's permissions: not
    /// where the user could not. Needs root.
    #[test]
    fn plain_writes_for_a_user_are_checked_as_that_user() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let req = |path: &Path| WriteFileRequest {
            path: path.to_string_lossy().into_owned(),
            mode: 0o644,
            create_parents: false,
            beneath: None,
            owner: Some("54321:54321".into()),
        };
        assert!(
            write_file(&req(&private.join("x")), b"no").is_err(),
            "written where the user may not write"
        );
        write_file(&req(&open.join("x")), b"yes").unwrap();
        assert_eq!(std::fs::metadata(open.join("x")).unwrap().uid(), 54321);
        // And the thread is root again afterwards.
        write_file(
            &WriteFileRequest {
                owner: None,
                ..req(&private.join("y"))
            },
            b"root",
        )
        .unwrap();
    }
}
