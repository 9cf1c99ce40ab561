//! Unpacking tars inside a root folder: image archives (an OCI layout or `docker save`
//! output in one tar) and image layers. One walk serves both; [`Rules`] says what each may
//! hold and what is kept of it (a layer keeps owners, modes, extended attributes, links,
//! whiteouts and opaque folders; an archive is files, folders and links between its files).
//!
//! Every entry path is placed inside the root ([`resolve`], in `place`): an absolute path or
//! one with `..` is refused, and a link met on the way is followed within the root, as the
//! guest will see it, so nothing is ever written outside.

use std::ffi::OsString;
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

mod place;

pub use place::PlaceError;
pub(super) use place::{remove_any, resolve, EntryPath};

/// A layer to apply: its file, a name for messages, and the digest its bytes must have.
pub(super) struct Layer {
    pub path: PathBuf,
    pub name: String,
    pub digest: LayerDigest,
}

/// What a layer's digest covers.
pub(super) enum LayerDigest {
    /// The blob as stored, perhaps compressed (OCI descriptors).
    Blob(String),
    /// The uncompressed tar (Docker's diff ids).
    DiffId(String),
}

/// Why unpacking a tar (an image archive or a layer) failed.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("opening {path:?} failed")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("reading the tar failed")]
    Read(#[source] io::Error),
    #[error(transparent)]
    Place(#[from] PlaceError),
    #[error("the layer does not match its digest {expected} (it hashes to {actual})")]
    Digest { expected: String, actual: String },
    #[error("the layer does not match its diff id {expected} (it hashes to {actual})")]
    DiffId { expected: String, actual: String },
    #[error("entry {entry:?}: writing it failed")]
    Write {
        entry: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("entry {entry:?}: a link without a target")]
    NoLinkTarget { entry: PathBuf },
    #[error("entry {entry:?}: hard link to {target:?}, which cannot be read")]
    HardLinkTarget {
        entry: PathBuf,
        target: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("entry {entry:?}: hard link to {target:?}, which is not a regular file")]
    HardLinkNotFile { entry: PathBuf, target: PathBuf },
    #[error("entry {entry:?}: device nodes are refused outside /dev (the guest's devtmpfs provides /dev)")]
    Device { entry: PathBuf },
    #[error("entry {entry:?} is of type {kind}: {allowed}")]
    Unsupported {
        entry: PathBuf,
        kind: String,
        allowed: &'static str,
    },
    #[error("entry {entry:?}: setting the extended attribute {name} failed")]
    Xattr {
        entry: PathBuf,
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("link {link:?} -> {target:?} leaves the archive")]
    LinkLeaves { link: PathBuf, target: PathBuf },
    #[error("link {link:?} -> {target:?}: the target is not a file of the archive")]
    LinkNotFile { link: PathBuf, target: PathBuf },
}

/// What a tar may hold, and what is kept of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rules {
    /// An image archive: files, folders, and symbolic links to files of the archive (kept as
    /// hard links); no owners or modes.
    Archive,
    /// An image layer: whiteouts and everything a root filesystem holds, with owners, modes
    /// and extended attributes; device nodes only under `/dev` (left out).
    Layer,
}

impl Rules {
    fn allowed(self) -> &'static str {
        match self {
            Rules::Archive => "an image archive holds only files, folders and links between them",
            Rules::Layer => "a layer holds files, folders, links, FIFOs and device nodes under /dev",
        }
    }
}

/// Unpacks an image archive (files, folders and links between them; paths inside) into
/// `into`.
pub(super) fn unpack_archive(tar_path: &Path, into: &Path) -> Result<(), UnpackError> {
    std::fs::create_dir_all(into).map_err(|source| UnpackError::Write {
        entry: PathBuf::from("."),
        source,
    })?;
    let file = std::fs::File::open(tar_path).map_err(|source| UnpackError::Open {
        path: tar_path.to_path_buf(),
        source,
    })?;
    unpack(io::BufReader::new(file), into, Rules::Archive)
}

/// Applies one layer to `root`, after checking it against its digest: opaque folders first,
/// then whiteouts and entries in order.
pub(super) fn apply_layer(layer: &Layer, root: &Path) -> Result<(), UnpackError> {
    if let LayerDigest::Blob(expected) = &layer.digest {
        let actual = super::sha256_file(&layer.path).map_err(|source| UnpackError::Open {
            path: layer.path.clone(),
            source,
        })?;
        if actual != *expected {
            return Err(UnpackError::Digest {
                expected: expected.clone(),
                actual,
            });
        }
    }
    // Pass 1: opaque folders hide what lower layers put there. A pass of its own, because
    // the same layer may add to such a folder before the tar names it opaque.
    let mut hashing = Hashing {
        inner: layer_reader(&layer.path)?,
        hash: Sha256::new(),
    };
    {
        let mut archive = tar::Archive::new(&mut hashing);
        for_each_entry(&mut archive, |_, path| clear_opaque_folder(root, path))?;
        // Read to the end so the hash covers the whole tar.
        io::copy(archive.into_inner(), &mut io::sink()).map_err(UnpackError::Read)?;
    }
    if let LayerDigest::DiffId(expected) = &layer.digest {
        let actual = format!("sha256:{:x}", hashing.hash.finalize());
        if actual != *expected {
            return Err(UnpackError::DiffId {
                expected: expected.clone(),
                actual,
            });
        }
    }
    // Pass 2: the entries.
    unpack(layer_reader(&layer.path)?, root, Rules::Layer)
}

/// Calls `visit` with every entry of `archive` that names something below the root.
fn for_each_entry<R: Read>(
    archive: &mut tar::Archive<R>,
    mut visit: impl FnMut(&mut tar::Entry<'_, R>, &EntryPath) -> Result<(), UnpackError>,
) -> Result<(), UnpackError> {
    for entry in archive.entries().map_err(UnpackError::Read)? {
        let mut entry = entry.map_err(UnpackError::Read)?;
        let path = EntryPath::parse(&entry.path().map_err(UnpackError::Read)?)?;
        if !path.parts.is_empty() {
            visit(&mut entry, &path)?;
        }
    }
    Ok(())
}

/// The one walk over a tar's entries, for archives and layers alike.
fn unpack(tar: impl Read, root: &Path, rules: Rules) -> Result<(), UnpackError> {
    let mut archive = tar::Archive::new(tar);
    // An archive's links, made once every file they may point at is there.
    let mut links = Vec::new();
    // A layer's folders' times, set once nothing more is written into them.
    let mut folder_times = Vec::new();
    for_each_entry(&mut archive, |entry, path| {
        if rules == Rules::Layer && apply_whiteout(root, path)? {
            return Ok(());
        }
        let at = resolve(root, path)?;
        if let Some(target) = unpack_entry(entry, path, &at, root, rules)? {
            links.push((path.raw.clone(), at, target));
        } else if rules == Rules::Layer && entry.header().entry_type() == tar::EntryType::Directory {
            folder_times.push((at, entry.header().mtime().unwrap_or(0)));
        }
        Ok(())
    })?;
    for (link, at, target) in links {
        link_archive_file(root, &link, &at, &target)?;
    }
    for (at, mtime) in folder_times.iter().rev() {
        // Only a folder still reached through folders alone: a later entry may have put a
        // link where one of them was, and a link is never followed out of the root.
        if only_folders_between(root, at) {
            set_mtime(at, *mtime).map_err(|source| UnpackError::Write {
                entry: at.strip_prefix(root).unwrap_or(at).to_path_buf(),
                source,
            })?;
        }
    }
    Ok(())
}

/// Sets what `at` says its modification time is (the access time too), without following a
/// link. Programs compare them: Python uses a `.pyc` only if the source's time is the one
/// it was compiled from, so an image whose times were lost recompiles every module it
/// imports, in every fork.
fn set_mtime(at: &Path, mtime: u64) -> io::Result<()> {
    use nix::sys::stat::{utimensat, UtimensatFlags};
    use nix::sys::time::TimeSpec;
    let time = TimeSpec::new(i64::try_from(mtime).unwrap_or(i64::MAX), 0);
    utimensat(None, at, &time, &time, UtimensatFlags::NoFollowSymlink).map_err(io::Error::from)
}

/// Whether every component from `root` down to `at` (itself included) is a real folder.
fn only_folders_between(root: &Path, at: &Path) -> bool {
    let Ok(inside) = at.strip_prefix(root) else {
        return false;
    };
    let mut here = root.to_path_buf();
    inside.components().all(|c| {
        here.push(c);
        std::fs::symlink_metadata(&here).is_ok_and(|m| m.is_dir())
    })
}

/// Writes one entry at `at`; an archive's symbolic link is returned (its target) to be made
/// later.
fn unpack_entry<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    path: &EntryPath,
    at: &Path,
    root: &Path,
    rules: Rules,
) -> Result<Option<PathBuf>, UnpackError> {
    use tar::EntryType as Kind;
    let failed = |source| UnpackError::Write {
        entry: path.raw.clone(),
        source,
    };
    let kind = entry.header().entry_type();
    let xattrs = if rules == Rules::Layer {
        pax_xattrs(entry)
    } else {
        Vec::new()
    };
    match kind {
        Kind::Directory => make_folder(at).map_err(failed)?,
        Kind::Regular | Kind::Continuous => {
            remove_any(at).map_err(failed)?;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(at)
                .map_err(failed)?;
            io::copy(entry, &mut file).map_err(failed)?;
        }
        Kind::Symlink if rules == Rules::Archive => return Ok(Some(link_target(entry, path)?)),
        Kind::Symlink => {
            let target = link_target(entry, path)?;
            remove_any(at).map_err(failed)?;
            std::os::unix::fs::symlink(&target, at).map_err(failed)?;
        }
        Kind::Link if rules == Rules::Layer => {
            let target = link_target(entry, path)?;
            let source = resolve(root, &EntryPath::parse(&target)?)?;
            let meta = std::fs::symlink_metadata(&source).map_err(|source| UnpackError::HardLinkTarget {
                entry: path.raw.clone(),
                target: target.clone(),
                source,
            })?;
            if !meta.is_file() {
                return Err(UnpackError::HardLinkNotFile {
                    entry: path.raw.clone(),
                    target,
                });
            }
            remove_any(at).map_err(failed)?;
            std::fs::hard_link(&source, at).map_err(failed)?;
        }
        // Device nodes under /dev are left out (the guest mounts its devtmpfs there, which
        // would hide them anyway; root filesystems made by debootstrap have them).
        Kind::Char | Kind::Block if rules == Rules::Layer && path.parts[0] == "dev" => return Ok(None),
        Kind::Char | Kind::Block if rules == Rules::Layer => {
            return Err(UnpackError::Device {
                entry: path.raw.clone(),
            })
        }
        Kind::Fifo if rules == Rules::Layer => return Ok(None),
        Kind::XGlobalHeader | Kind::XHeader | Kind::GNULongName | Kind::GNULongLink => return Ok(None),
        other => {
            return Err(UnpackError::Unsupported {
                entry: path.raw.clone(),
                kind: format!("{other:?}"),
                allowed: rules.allowed(),
            })
        }
    }
    if rules == Rules::Layer {
        set_owner_mode_and_time(entry.header(), kind, at).map_err(failed)?;
        set_xattrs(at, kind, xattrs).map_err(|(name, source)| UnpackError::Xattr {
            entry: path.raw.clone(),
            name,
            source,
        })?;
    }
    Ok(None)
}

/// A folder at `at`, replacing anything else there.
fn make_folder(at: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(at) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => {
            remove_any(at)?;
            std::fs::create_dir(at)
        }
        Err(_) => std::fs::create_dir(at),
    }
}

fn link_target<R: Read>(entry: &tar::Entry<'_, R>, path: &EntryPath) -> Result<PathBuf, UnpackError> {
    let target = entry.link_name().map_err(UnpackError::Read)?;
    Ok(target
        .ok_or_else(|| UnpackError::NoLinkTarget {
            entry: path.raw.clone(),
        })?
        .into_owned())
}

/// The header's owner, mode and modification time on what was just made (a symbolic link
/// keeps its mode; a hard link shares its target's all; a folder's time is set later, see
/// [`unpack`]).
fn set_owner_mode_and_time(header: &tar::Header, kind: tar::EntryType, at: &Path) -> io::Result<()> {
    let (uid, gid) = (header.uid().unwrap_or(0) as u32, header.gid().unwrap_or(0) as u32);
    let mode = header.mode().unwrap_or(0o644) & 0o7777;
    let mtime = header.mtime().unwrap_or(0);
    match kind {
        tar::EntryType::Link => Ok(()),
        tar::EntryType::Symlink => {
            std::os::unix::fs::lchown(at, Some(uid), Some(gid))?;
            set_mtime(at, mtime)
        }
        tar::EntryType::Directory => {
            std::os::unix::fs::lchown(at, Some(uid), Some(gid))?;
            std::fs::set_permissions(at, std::fs::Permissions::from_mode(mode))
        }
        _ => {
            std::os::unix::fs::lchown(at, Some(uid), Some(gid))?;
            std::fs::set_permissions(at, std::fs::Permissions::from_mode(mode))?;
            set_mtime(at, mtime)
        }
    }
}

/// Extended attributes of an entry (pax `SCHILY.xattr.NAME`).
fn pax_xattrs<R: Read>(entry: &mut tar::Entry<'_, R>) -> Vec<(String, Vec<u8>)> {
    match entry.pax_extensions() {
        Ok(Some(exts)) => exts
            .flatten()
            .filter_map(|e| {
                Some((
                    e.key().ok()?.strip_prefix("SCHILY.xattr.")?.to_string(),
                    e.value_bytes().to_vec(),
                ))
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Sets extended attributes where the host's file system can hold them (ext4 keeps
/// security.*, user.* and trusted.*); `mkfs.ext4 -d` copies them into the image. A symbolic
/// link's that cannot be set are left out.
fn set_xattrs(at: &Path, kind: tar::EntryType, xattrs: Vec<(String, Vec<u8>)>) -> Result<(), (String, io::Error)> {
    for (name, value) in xattrs {
        if let Err(e) = xattr::set(at, &name, &value) {
            if !matches!(kind, tar::EntryType::Symlink) {
                return Err((name, e));
            }
        }
    }
    Ok(())
}

/// Empties the folder of an opaque whiteout entry (`.wh..wh..opq`).
fn clear_opaque_folder(root: &Path, path: &EntryPath) -> Result<(), UnpackError> {
    if path.name().is_none_or(|n| n != ".wh..wh..opq") {
        return Ok(());
    }
    let folder = EntryPath {
        raw: path.raw.clone(),
        parts: path.parts[..path.parts.len() - 1].to_vec(),
    };
    let dir = resolve(root, &folder)?;
    if let Ok(children) = std::fs::read_dir(&dir) {
        for child in children.flatten() {
            remove_any(&child.path()).map_err(|source| UnpackError::Write {
                entry: path.raw.clone(),
                source,
            })?;
        }
    }
    Ok(())
}

/// Applies a whiteout entry (`.wh.NAME` removes NAME; the opaque marker was applied in the
/// first pass); false for any other entry.
fn apply_whiteout(root: &Path, path: &EntryPath) -> Result<bool, UnpackError> {
    let Some(name) = path.name().map(|n| n.to_string_lossy().into_owned()) else {
        return Ok(false);
    };
    if name == ".wh..wh..opq" {
        return Ok(true);
    }
    let Some(hidden) = name.strip_prefix(".wh.") else {
        return Ok(false);
    };
    let mut target = path.clone();
    *target.parts.last_mut().expect("named") = hidden.into();
    let at = resolve(root, &target)?;
    remove_any(&at).map_err(|source| UnpackError::Write {
        entry: path.raw.clone(),
        source,
    })?;
    Ok(true)
}

/// Makes an archive's symbolic link `link` (at `at`) a hard link to its target, which must
/// be a file of the archive. (`docker save`'s legacy layout links `<id>/layer.tar` to the
/// blob.)
fn link_archive_file(root: &Path, link: &Path, at: &Path, target: &Path) -> Result<(), UnpackError> {
    let mut resolved: Vec<OsString> = EntryPath::parse(link)?.parts;
    resolved.pop();
    for c in target.components() {
        match c {
            Component::Normal(n) => resolved.push(n.to_os_string()),
            Component::ParentDir if resolved.pop().is_some() => {}
            Component::CurDir => {}
            _ => {
                return Err(UnpackError::LinkLeaves {
                    link: link.to_path_buf(),
                    target: target.to_path_buf(),
                })
            }
        }
    }
    let source = resolved.iter().fold(root.to_path_buf(), |a, c| a.join(c));
    if !std::fs::symlink_metadata(&source).is_ok_and(|m| m.is_file()) {
        return Err(UnpackError::LinkNotFile {
            link: link.to_path_buf(),
            target: target.to_path_buf(),
        });
    }
    remove_any(at).map_err(|source| UnpackError::Write {
        entry: link.to_path_buf(),
        source,
    })?;
    std::fs::hard_link(&source, at).map_err(|source| UnpackError::Write {
        entry: link.to_path_buf(),
        source,
    })
}

/// A reader of a layer, decompressed (gzip, zstd or none, told by its first bytes).
fn layer_reader(path: &Path) -> Result<Box<dyn Read>, UnpackError> {
    let open = |source| UnpackError::Open {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(open)?;
    let mut magic = [0u8; 4];
    let n = file.read(&mut magic).map_err(open)?;
    let file = io::BufReader::new(io::Cursor::new(magic[..n].to_vec()).chain(file));
    Ok(match magic {
        [0x1f, 0x8b, ..] => Box::new(flate2::read::GzDecoder::new(file)),
        [0x28, 0xb5, 0x2f, 0xfd] => Box::new(zstd::stream::read::Decoder::new(file).map_err(UnpackError::Read)?),
        _ => Box::new(file),
    })
}

/// Hashes what passes through it.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar of `(path, kind, data or link target)` members.
    fn tar_of(members: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
        let timed: Vec<_> = members
            .iter()
            .map(|&(path, kind, data)| (path, kind, 0, data))
            .collect();
        timed_tar(&timed)
    }

    #[test]
    fn archives_hold_files_folders_and_links_between_files() {
        use tar::EntryType as Kind;
        let dir = tempfile::tempdir().unwrap();
        let good = tar_of(&[
            ("blobs/sha256/aa", Kind::Regular, "blob"),
            ("blobs/layer.tar", Kind::Symlink, "sha256/aa"),
            ("d", Kind::Directory, ""),
        ]);
        unpack(&good[..], dir.path(), Rules::Archive).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("blobs/layer.tar")).unwrap(),
            "blob"
        );
        assert!(
            !std::fs::symlink_metadata(dir.path().join("blobs/layer.tar"))
                .unwrap()
                .file_type()
                .is_symlink(),
            "kept as a hard link"
        );

        let refused = [
            (
                tar_of(&[("x", Kind::Symlink, "../../etc/passwd")]),
                "leaves the archive",
            ),
            (tar_of(&[("x", Kind::Symlink, "missing")]), "not a file of the archive"),
            (
                tar_of(&[("f", Kind::Regular, "x"), ("h", Kind::Link, "f")]),
                "an image archive holds only",
            ),
            (tar_of(&[("p", Kind::Fifo, "")]), "an image archive holds only"),
        ];
        for (tar, reason) in refused {
            let into = tempfile::tempdir().unwrap();
            let err = unpack(&tar[..], into.path(), Rules::Archive).unwrap_err().to_string();
            assert!(err.contains(reason), "{err}");
        }
    }

    #[test]
    fn layers_apply_whiteouts_and_refuse_devices_outside_dev() {
        use tar::EntryType as Kind;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("data/opq")).unwrap();
        std::fs::write(dir.path().join("data/gone"), "x").unwrap();
        std::fs::write(dir.path().join("data/opq/old"), "x").unwrap();
        let layer = tar_of(&[
            ("data/.wh.gone", Kind::Regular, ""),
            ("data/opq/.wh..wh..opq", Kind::Regular, ""),
            ("data/opq/new", Kind::Regular, "n"),
            ("dev/null", Kind::Char, ""),
        ]);
        let path = dir.path().join("layer.tar");
        std::fs::write(&path, &layer).unwrap();
        let digest = super::super::sha256_file(&path).unwrap();
        let root = dir.path();
        apply_layer(
            &Layer {
                path: path.clone(),
                name: "l".into(),
                digest: LayerDigest::Blob(digest),
            },
            root,
        )
        .unwrap();
        assert!(!root.join("data/gone").exists() && !root.join("data/opq/old").exists());
        assert_eq!(std::fs::read_to_string(root.join("data/opq/new")).unwrap(), "n");
        assert!(!root.join("dev/null").exists());

        let err = apply_layer(
            &Layer {
                path: path.clone(),
                name: "l".into(),
                digest: LayerDigest::Blob("sha256:00".into()),
            },
            root,
        )
        .unwrap_err();
        assert!(err.to_string().contains("does not match its digest"), "{err}");
        let device = tar_of(&[("opt/sda", Kind::Block, "")]);
        let err = unpack(&device[..], root, Rules::Layer).unwrap_err().to_string();
        assert!(err.contains("device nodes are refused"), "{err}");
    }

    /// A tar of `(path, kind, modification time, data or link target)` members.
    fn timed_tar(members: &[(&str, tar::EntryType, u64, &str)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, kind, mtime, data) in members {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(*kind);
            header.set_mode(0o644);
            header.set_mtime(*mtime);
            let body: &[u8] = if kind.is_file() { data.as_bytes() } else { &[] };
            header.set_size(body.len() as u64);
            if kind.is_symlink() || kind.is_hard_link() {
                header.set_link_name(data).unwrap();
            }
            builder.append_data(&mut header, path, body).unwrap();
        }
        builder.into_inner().unwrap()
    }

    #[test]
    fn layers_keep_their_times_and_a_folder_time_never_follows_a_link_out() {
        use std::os::unix::fs::MetadataExt;
        use tar::EntryType as Kind;
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("root"), dir.path().join("outside"));
        std::fs::create_dir_all(outside.join("inner")).unwrap();
        std::fs::create_dir(&root).unwrap();
        let layer = timed_tar(&[
            ("lib", Kind::Directory, 1_000_000, ""),
            ("lib/mod.py", Kind::Regular, 1_500_000_000, "x = 1\n"),
            ("lib/link", Kind::Symlink, 1_200_000, "mod.py"),
            ("esc", Kind::Directory, 42, ""),
            ("esc/inner", Kind::Directory, 43, ""),
        ]);
        unpack(&layer[..], &root, Rules::Layer).unwrap();
        let mtime = |p: &Path| std::fs::symlink_metadata(p).unwrap().mtime();
        assert_eq!(mtime(&root.join("lib/mod.py")), 1_500_000_000);
        assert_eq!(mtime(&root.join("lib/link")), 1_200_000);
        assert_eq!(
            mtime(&root.join("lib")),
            1_000_000,
            "set after the files written into it"
        );
        assert_eq!(mtime(&root.join("esc/inner")), 43);

        // The next layer names a folder, then puts a link to a folder outside the root where
        // its parent was: the folder's time is not set through the link, and the folder
        // outside keeps its own.
        std::fs::remove_dir_all(root.join("esc")).unwrap();
        let before = mtime(&outside.join("inner"));
        let outside_text = outside.to_str().unwrap();
        let layer = timed_tar(&[
            ("esc/inner", Kind::Directory, 7, ""),
            ("esc/.wh.inner", Kind::Regular, 8, ""),
            ("esc", Kind::Symlink, 9, outside_text),
        ]);
        unpack(&layer[..], &root, Rules::Layer).unwrap();
        assert!(std::fs::symlink_metadata(root.join("esc"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(mtime(&outside.join("inner")), before, "no time set outside the root");
        assert_eq!(mtime(&root.join("esc")), 9, "the link's own time");
    }
}
