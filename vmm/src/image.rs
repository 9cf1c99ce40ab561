//! Root images from OCI and Docker archives and plain root filesystems.
//!
//! `[template] image` may name, besides the built-in `minimal` and `python`:
//! - `oci-archive:PATH`: an OCI image layout in a tar (`skopeo copy ... oci-archive:PATH`);
//! - `docker-archive:PATH`: the output of `docker save` (or `skopeo ... docker-archive:`);
//! - `oci:DIR`: an OCI image layout folder;
//! - `rootfs:DIR`: a plain root filesystem folder.
//!
//! The layers are unpacked in order into a staging folder, with whiteouts and opaque folders,
//! file modes, owners, symbolic and hard links. Then farm's agent, its two users and
//! `farm-sandbox` are added as for the built-in images, and `mkfs.ext4 -d` writes the image.
//! Images are cached under `images/conv-<key>/` by a key over the image's content digest
//! (OCI: the manifest's digest; Docker: the layers' diff ids; rootfs: every file's path,
//! metadata and bytes), the agent and this recipe: an unchanged image is converted once.
//!
//! Archives are untrusted input. Every blob is checked against its digest; an entry path
//! that is absolute or has `..` is refused; links met while unpacking are resolved inside
//! the root (an absolute link target means the image's root, never the host's); device
//! nodes are refused. Nothing is written outside the cache.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::artifacts::{Artifact, ArtifactError};

/// Bump when the conversion changes what it writes.
const RECIPE: &str = "conv-recipe-1";

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    Builtin(String),
    OciArchive(PathBuf),
    DockerArchive(PathBuf),
    OciDir(PathBuf),
    RootfsDir(PathBuf),
}

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("image {image:?}: {message}")]
    Bad { image: String, message: String },
    #[error("image {image:?}: {what}: {source}")]
    Io {
        image: String,
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl ImageSource {
    /// Parses `[template] image`; relative paths are taken from `base`.
    pub fn parse(spec: &str, base: &Path) -> Result<ImageSource, ArtifactError> {
        let path = |p: &str| if Path::new(p).is_absolute() { PathBuf::from(p) } else { base.join(p) };
        Ok(match spec.split_once(':') {
            Some(("oci-archive", p)) if !p.is_empty() => ImageSource::OciArchive(path(p)),
            Some(("docker-archive", p)) if !p.is_empty() => ImageSource::DockerArchive(path(p)),
            Some(("oci", p)) if !p.is_empty() => ImageSource::OciDir(path(p)),
            Some(("rootfs", p)) if !p.is_empty() => ImageSource::RootfsDir(path(p)),
            None if crate::artifacts::IMAGES.contains(&spec) => ImageSource::Builtin(spec.to_string()),
            _ => return Err(ArtifactError::UnknownImage { name: spec.to_string() }),
        })
    }

    /// The spec with its path absolute (what a snapshot records).
    pub fn spec(&self) -> String {
        match self {
            ImageSource::Builtin(n) => n.clone(),
            ImageSource::OciArchive(p) => format!("oci-archive:{}", p.display()),
            ImageSource::DockerArchive(p) => format!("docker-archive:{}", p.display()),
            ImageSource::OciDir(p) => format!("oci:{}", p.display()),
            ImageSource::RootfsDir(p) => format!("rootfs:{}", p.display()),
        }
    }
}

/// What a converted image's config asks of commands (recorded in `image.json`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ImageConfig {
    pub env: Vec<String>,
    pub working_dir: String,
    pub user: String,
}

/// The ext4 image for `source` (not a built-in one): the cached conversion, or a new one.
pub fn converted(cache: &Path, source: &ImageSource, agent: &Artifact, size_mib: Option<u64>) -> Result<Artifact, ImageError> {
    let image = source.spec();
    let io = |what: &str| {
        let (image, what) = (image.clone(), what.to_string());
        move |source| ImageError::Io { image, what, source }
    };
    let bad = |message: String| ImageError::Bad { image: image.clone(), message };
    let tmp = cache.join("tmp");
    std::fs::create_dir_all(&tmp).map_err(io("creating the cache's tmp folder"))?;
    let work = tempfile::Builder::new().prefix("conv-").tempdir_in(&tmp).map_err(io("creating a work folder"))?;

    // The layers (in order), the config and the content digest.
    let (layers, config, digest) = match source {
        ImageSource::Builtin(_) => return Err(bad("a built-in image needs no conversion".into())),
        ImageSource::RootfsDir(dir) => {
            if !dir.is_dir() {
                return Err(bad(format!("{} is not a folder", dir.display())));
            }
            (Vec::new(), ImageConfig::default(), tree_digest(dir).map_err(io("reading the root filesystem"))?)
        }
        ImageSource::OciDir(dir) => oci_layout(dir).map_err(bad)?,
        ImageSource::OciArchive(tar) => {
            let layout = work.path().join("layout");
            unpack_plain(tar, &layout).map_err(|e| bad(format!("{}: {e}", tar.display())))?;
            oci_layout(&layout).map_err(bad)?
        }
        ImageSource::DockerArchive(tar) => {
            let layout = work.path().join("layout");
            unpack_plain(tar, &layout).map_err(|e| bad(format!("{}: {e}", tar.display())))?;
            docker_layout(&layout).map_err(bad)?
        }
    };
    let mut h = Sha256::new();
    for part in [digest.as_str(), agent.key.as_str(), RECIPE, &size_mib.map(|s| s.to_string()).unwrap_or_default()] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let key = format!("{:x}", h.finalize())[..16].to_string();
    let dir = cache.join("images").join(format!("conv-{key}"));
    if dir.join("manifest.json").is_file() && dir.join("rootfs.ext4").is_file() {
        return Ok(Artifact { path: dir.join("rootfs.ext4"), key });
    }

    let root = work.path().join("root");
    std::fs::create_dir_all(&root).map_err(io("creating the staging root"))?;
    if let ImageSource::RootfsDir(src) = source {
        copy_tree(src, &root).map_err(bad)?;
    }
    for (i, layer) in layers.iter().enumerate() {
        apply_layer(&layer.path, &root, layer.check.as_ref()).map_err(|e| bad(format!("layer {} ({}): {e}", i + 1, layer.name)))?;
    }
    add_farm(&root, agent).map_err(|e| bad(format!("adding farm's agent: {e}")))?;

    let staged = cache.join("images").join(format!(".conv-{key}.tmp"));
    let _ = std::fs::remove_dir_all(&staged);
    std::fs::create_dir_all(&staged).map_err(io("creating the image folder"))?;
    let used_mib = du_mib(&root);
    let size = size_mib.unwrap_or(used_mib + used_mib / 4 + 256);
    if size < used_mib + 16 {
        return Err(bad(format!("image_size_mib {size} is too small for {used_mib} MiB of files")));
    }
    let out = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "root", "-E", "root_owner=0:0", "-d"])
        .arg(&root)
        .arg(staged.join("rootfs.ext4"))
        .arg(format!("{size}M"))
        .output()
        .map_err(io("running mkfs.ext4 (package e2fsprogs)"))?;
    if !out.status.success() {
        return Err(bad(format!("mkfs.ext4 failed: {}", String::from_utf8_lossy(&out.stderr).trim())));
    }
    std::fs::set_permissions(staged.join("rootfs.ext4"), std::fs::Permissions::from_mode(0o444)).map_err(io("making the image read-only"))?;
    std::fs::write(staged.join("image.json"), serde_json::to_vec_pretty(&config).unwrap_or_default()).map_err(io("writing image.json"))?;
    let manifest = serde_json::json!({ "key": key, "name": "image-converted", "source": image, "content_digest": digest, "agent": agent.key, "size_mib": size, "recipe": RECIPE });
    std::fs::write(staged.join("manifest.json"), serde_json::to_vec_pretty(&manifest).unwrap_or_default()).map_err(io("writing manifest.json"))?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&staged, &dir).map_err(io("publishing the image"))?;
    Ok(Artifact { path: dir.join("rootfs.ext4"), key })
}

/// The image config recorded with a converted image.
pub fn config_of(image: &Artifact) -> Option<ImageConfig> {
    let dir = image.path.parent()?;
    serde_json::from_slice(&std::fs::read(dir.join("image.json")).ok()?).ok()
}

/// A layer to apply: its file, a name for messages, and the digest its bytes must have.
struct Layer {
    path: PathBuf,
    name: String,
    /// (digest of the blob as stored, or of its uncompressed tar (Docker's diff ids)).
    check: Option<(String, bool)>,
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    std::io::copy(&mut file, &mut h)?;
    Ok(format!("sha256:{:x}", h.finalize()))
}

/// Reads an OCI image layout: index, manifest, config and layers, each checked against
/// its digest.
fn oci_layout(dir: &Path) -> Result<(Vec<Layer>, ImageConfig, String), String> {
    let read_json = |p: &Path| -> Result<serde_json::Value, String> {
        serde_json::from_slice(&std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?).map_err(|e| format!("{}: not JSON: {e}", p.display()))
    };
    let index = read_json(&dir.join("index.json")).map_err(|e| format!("not an OCI image layout ({e})"))?;
    let blob = |digest: &str| -> Result<PathBuf, String> {
        let hex = digest.strip_prefix("sha256:").ok_or_else(|| format!("digest {digest:?} is not sha256"))?;
        if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!("digest {digest:?} is malformed"));
        }
        Ok(dir.join("blobs").join("sha256").join(hex))
    };
    let checked = |digest: &str| -> Result<PathBuf, String> {
        let path = blob(digest)?;
        let actual = sha256_file(&path).map_err(|e| format!("blob {digest}: {e}"))?;
        if actual != digest {
            return Err(format!("blob {digest} does not match its digest (it hashes to {actual})"));
        }
        Ok(path)
    };
    let mut descriptor = index["manifests"].get(0).cloned().ok_or("index.json lists no manifest")?;
    // An index of indexes (multi-platform): take linux/amd64, else the first.
    for _ in 0..4 {
        let media = descriptor["mediaType"].as_str().unwrap_or("");
        if !media.contains("index") && !media.contains("manifest.list") {
            break;
        }
        let nested = read_json(&checked(descriptor["digest"].as_str().unwrap_or(""))?)?;
        let list = nested["manifests"].as_array().cloned().unwrap_or_default();
        descriptor = list.iter().find(|m| m["platform"]["architecture"] == "amd64" && m["platform"]["os"] == "linux").or(list.first()).cloned().ok_or("an image index lists no manifest")?;
    }
    let manifest_digest = descriptor["digest"].as_str().ok_or("the manifest descriptor has no digest")?.to_string();
    let manifest = read_json(&checked(&manifest_digest)?)?;
    let config = read_json(&checked(manifest["config"]["digest"].as_str().ok_or("the manifest has no config")?)?)?;
    let mut layers = Vec::new();
    for layer in manifest["layers"].as_array().ok_or("the manifest has no layers")? {
        let digest = layer["digest"].as_str().ok_or("a layer has no digest")?;
        layers.push(Layer { path: blob(digest)?, name: digest.to_string(), check: Some((digest.to_string(), false)) });
    }
    Ok((layers, image_config(&config), manifest_digest))
}

/// Reads a `docker save` folder: manifest.json, the config, the layers (checked against the
/// config's diff ids, which are digests of the uncompressed layers).
fn docker_layout(dir: &Path) -> Result<(Vec<Layer>, ImageConfig, String), String> {
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).map_err(|e| format!("not a docker archive (manifest.json: {e})"))?)
        .map_err(|e| format!("manifest.json is not JSON: {e}"))?;
    let entry = manifest.get(0).ok_or("manifest.json lists no image")?;
    let inside = |p: &str| -> Result<PathBuf, String> {
        let rel = Path::new(p);
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(format!("path {p:?} in manifest.json leaves the archive"));
        }
        Ok(dir.join(rel))
    };
    let config_path = inside(entry["Config"].as_str().ok_or("manifest.json has no Config")?)?;
    let config_bytes = std::fs::read(&config_path).map_err(|e| format!("{}: {e}", config_path.display()))?;
    let config: serde_json::Value = serde_json::from_slice(&config_bytes).map_err(|e| format!("the image config is not JSON: {e}"))?;
    let diff_ids: Vec<String> = config["rootfs"]["diff_ids"].as_array().map(|a| a.iter().filter_map(|d| d.as_str().map(String::from)).collect()).unwrap_or_default();
    let paths = entry["Layers"].as_array().ok_or("manifest.json has no Layers")?;
    if paths.len() != diff_ids.len() {
        return Err(format!("{} layers but {} diff ids in the config", paths.len(), diff_ids.len()));
    }
    let mut layers = Vec::new();
    for (p, id) in paths.iter().zip(&diff_ids) {
        let p = p.as_str().ok_or("a layer path is not a string")?;
        layers.push(Layer { path: inside(p)?, name: p.to_string(), check: Some((id.clone(), true)) });
    }
    Ok((layers, image_config(&config), format!("sha256:{:x}", Sha256::digest(&config_bytes))))
}

fn image_config(config: &serde_json::Value) -> ImageConfig {
    let c = &config["config"];
    ImageConfig {
        env: c["Env"].as_array().map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect()).unwrap_or_default(),
        working_dir: c["WorkingDir"].as_str().unwrap_or("").to_string(),
        user: c["User"].as_str().unwrap_or("").to_string(),
    }
}

/// A reader of a layer, decompressed (gzip, zstd or none, told by its first bytes).
fn layer_reader(path: &Path) -> std::io::Result<Box<dyn Read>> {
    let mut file = std::fs::File::open(path)?;
    let mut magic = [0u8; 4];
    let n = file.read(&mut magic)?;
    let file = std::io::BufReader::new(std::io::Cursor::new(magic[..n].to_vec()).chain(file));
    Ok(match magic {
        [0x1f, 0x8b, ..] => Box::new(flate2::read::GzDecoder::new(file)),
        [0x28, 0xb5, 0x2f, 0xfd] => Box::new(zstd::stream::read::Decoder::new(file)?),
        _ => Box::new(file),
    })
}

/// Hashes what passes through it.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// An entry path as components, or why it is refused (absolute, `..`).
fn entry_components(path: &Path) -> Result<Vec<std::ffi::OsString>, String> {
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n.to_os_string()),
            Component::CurDir => {}
            Component::ParentDir => return Err(format!("entry {:?} has a `..` component", path)),
            Component::RootDir | Component::Prefix(_) => return Err(format!("entry {:?} is absolute", path)),
        }
    }
    Ok(out)
}

/// `components` resolved inside `root` the way the guest will see them: a link met on the
/// way is followed within the root (an absolute target starts at the root, `..` stops at
/// it); the last component is not followed. Missing folders on the way are made.
fn resolve(root: &Path, components: &[std::ffi::OsString]) -> Result<PathBuf, String> {
    let mut stack: Vec<std::ffi::OsString> = Vec::new();
    let mut queue: std::collections::VecDeque<std::ffi::OsString> = components[..components.len().saturating_sub(1)].iter().cloned().collect();
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
        match std::fs::symlink_metadata(&here) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > 40 {
                    return Err("too many levels of symbolic links".into());
                }
                let target = std::fs::read_link(&here).map_err(|e| e.to_string())?;
                if target.is_absolute() {
                    stack.clear();
                }
                let mut rest: Vec<std::ffi::OsString> = target.components().filter_map(|t| match t {
                    Component::Normal(n) => Some(n.to_os_string()),
                    Component::ParentDir => Some("..".into()),
                    _ => None,
                }).collect();
                rest.extend(queue.drain(..));
                queue = rest.into();
            }
            Ok(m) if m.is_dir() => stack.push(c),
            Ok(_) => return Err(format!("{} is not a folder", here.strip_prefix(root).unwrap_or(&here).display())),
            Err(_) => {
                std::fs::create_dir(&here).map_err(|e| format!("creating {}: {e}", here.display()))?;
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
fn remove_any(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Applies one layer to `root`: opaque folders first, then whiteouts and entries in order.
fn apply_layer(path: &Path, root: &Path, check: Option<&(String, bool)>) -> Result<(), String> {
    // The digest: of the stored blob (OCI) or of the uncompressed tar (Docker diff ids).
    if let Some((digest, false)) = check {
        let actual = sha256_file(path).map_err(|e| e.to_string())?;
        if actual != *digest {
            return Err(format!("does not match its digest {digest} (it hashes to {actual})"));
        }
    }
    // Pass 1: opaque folders hide what lower layers put there.
    let reader = layer_reader(path).map_err(|e| e.to_string())?;
    let mut hashing = Hashing { inner: reader, hash: Sha256::new() };
    {
        let mut archive = tar::Archive::new(&mut hashing);
        for entry in archive.entries().map_err(|e| e.to_string())? {
            let entry = entry.map_err(|e| format!("reading the tar: {e}"))?;
            let p = entry.path().map_err(|e| e.to_string())?.into_owned();
            if p.file_name().is_some_and(|n| n == ".wh..wh..opq") {
                let parts = entry_components(p.parent().unwrap_or(Path::new("")))?;
                let dir = resolve(root, &parts)?;
                if let Ok(children) = std::fs::read_dir(&dir) {
                    for child in children.flatten() {
                        remove_any(&child.path()).map_err(|e| e.to_string())?;
                    }
                }
            }
        }
        // Read to the end so the hash covers the whole tar.
        std::io::copy(archive.into_inner(), &mut std::io::sink()).map_err(|e| e.to_string())?;
    }
    if let Some((digest, true)) = check {
        let actual = format!("sha256:{:x}", hashing.hash.finalize());
        if actual != *digest {
            return Err(format!("does not match its diff id {digest} (it hashes to {actual})"));
        }
    }
    // Pass 2: the entries.
    let mut archive = tar::Archive::new(layer_reader(path).map_err(|e| e.to_string())?);
    for entry in archive.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| format!("reading the tar: {e}"))?;
        let p = entry.path().map_err(|e| e.to_string())?.into_owned();
        let parts = entry_components(&p)?;
        if parts.is_empty() {
            continue;
        }
        let name = parts.last().expect("not empty").to_string_lossy().into_owned();
        if name == ".wh..wh..opq" {
            continue;
        }
        if let Some(hidden) = name.strip_prefix(".wh.") {
            let mut target = parts.clone();
            *target.last_mut().expect("not empty") = hidden.into();
            let at = resolve(root, &target)?;
            remove_any(&at).map_err(|e| format!("whiteout {}: {e}", p.display()))?;
            continue;
        }
        let header = entry.header().clone();
        let kind = header.entry_type();
        // Extended attributes (pax `SCHILY.xattr.NAME`), set once the entry exists.
        let xattrs: Vec<(String, Vec<u8>)> = match entry.pax_extensions() {
            Ok(Some(exts)) => exts
                .flatten()
                .filter_map(|e| Some((e.key().ok()?.strip_prefix("SCHILY.xattr.")?.to_string(), e.value_bytes().to_vec())))
                .collect(),
            _ => Vec::new(),
        };
        let at = resolve(root, &parts)?;
        let mode = header.mode().unwrap_or(0o644) & 0o7777;
        let (uid, gid) = (header.uid().unwrap_or(0) as u32, header.gid().unwrap_or(0) as u32);
        let what = |e: std::io::Error| format!("{}: {e}", p.display());
        match kind {
            tar::EntryType::Directory => {
                match std::fs::symlink_metadata(&at) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        remove_any(&at).map_err(what)?;
                        std::fs::create_dir(&at).map_err(what)?;
                    }
                    Err(_) => std::fs::create_dir(&at).map_err(what)?,
                }
                std::os::unix::fs::lchown(&at, Some(uid), Some(gid)).map_err(what)?;
                std::fs::set_permissions(&at, std::fs::Permissions::from_mode(mode)).map_err(what)?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                remove_any(&at).map_err(what)?;
                let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(&at).map_err(what)?;
                std::io::copy(&mut entry, &mut file).map_err(what)?;
                drop(file);
                std::os::unix::fs::lchown(&at, Some(uid), Some(gid)).map_err(what)?;
                std::fs::set_permissions(&at, std::fs::Permissions::from_mode(mode)).map_err(what)?;
            }
            tar::EntryType::Symlink => {
                let target = entry.link_name().map_err(|e| e.to_string())?.ok_or_else(|| format!("{}: a link without a target", p.display()))?;
                remove_any(&at).map_err(what)?;
                std::os::unix::fs::symlink(&target, &at).map_err(what)?;
                std::os::unix::fs::lchown(&at, Some(uid), Some(gid)).map_err(what)?;
            }
            tar::EntryType::Link => {
                let target = entry.link_name().map_err(|e| e.to_string())?.ok_or_else(|| format!("{}: a hard link without a target", p.display()))?;
                let source = resolve(root, &entry_components(&target)?)?;
                let meta = std::fs::symlink_metadata(&source).map_err(|e| format!("{}: hard link to {}: {e}", p.display(), target.display()))?;
                if !meta.is_file() {
                    return Err(format!("{}: hard link to {}, which is not a regular file", p.display(), target.display()));
                }
                remove_any(&at).map_err(what)?;
                std::fs::hard_link(&source, &at).map_err(what)?;
            }
            // Device nodes: those under /dev are left out (the guest mounts its devtmpfs there,
            // which would hide them anyway; root filesystems made by debootstrap have them);
            // anywhere else they are refused.
            tar::EntryType::Char | tar::EntryType::Block if parts.first().is_some_and(|c| c == "dev") => continue,
            tar::EntryType::Char | tar::EntryType::Block => {
                return Err(format!("{}: device nodes are refused outside /dev (the guest's devtmpfs provides /dev)", p.display()));
            }
            tar::EntryType::Fifo => continue,
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader | tar::EntryType::GNULongName | tar::EntryType::GNULongLink => {}
            other => return Err(format!("{}: unsupported entry type {other:?}", p.display())),
        }
        for (name, value) in xattrs {
            // Kept where the host's file system can hold them (ext4 keeps security.*,
            // user.* and trusted.*); `mkfs.ext4 -d` copies them into the image.
            if let Err(e) = xattr::set(&at, &name, &value) {
                if !matches!(kind, tar::EntryType::Symlink) {
                    return Err(format!("{}: extended attribute {name}: {e}", p.display()));
                }
            }
        }
    }
    Ok(())
}

/// Unpacks a tar that holds an image layout (regular files and folders only, paths inside).
fn unpack_plain(tar_path: &Path, into: &Path) -> Result<(), String> {
    std::fs::create_dir_all(into).map_err(|e| e.to_string())?;
    let file = std::fs::File::open(tar_path).map_err(|e| e.to_string())?;
    let mut archive = tar::Archive::new(std::io::BufReader::new(file));
    let mut links = Vec::new();
    for entry in archive.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| format!("reading the tar: {e}"))?;
        let p = entry.path().map_err(|e| e.to_string())?.into_owned();
        let parts = entry_components(&p)?;
        if parts.is_empty() {
            continue;
        }
        let at = parts.iter().fold(into.to_path_buf(), |a, c| a.join(c));
        match entry.header().entry_type() {
            tar::EntryType::Directory => std::fs::create_dir_all(&at).map_err(|e| e.to_string())?,
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if let Some(parent) = at.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
                }
                remove_any(&at).map_err(|e| e.to_string())?;
                let mut out = std::fs::OpenOptions::new().write(true).create_new(true).open(&at).map_err(|e| e.to_string())?;
                std::io::copy(&mut entry, &mut out).map_err(|e| e.to_string())?;
            }
            // `docker save`'s legacy layout links `<id>/layer.tar` to the blob: kept as a
            // copy, if the target is a file inside the archive.
            tar::EntryType::Symlink => {
                let target = entry.link_name().map_err(|e| e.to_string())?.ok_or("a link without a target")?.into_owned();
                links.push((parts, target));
            }
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => {}
            other => return Err(format!("entry {} of type {other:?}: an image archive holds only files, folders and links between them", p.display())),
        }
    }
    for (parts, target) in links {
        let mut resolved: Vec<std::ffi::OsString> = parts[..parts.len() - 1].to_vec();
        for c in target.components() {
            match c {
                Component::Normal(n) => resolved.push(n.to_os_string()),
                Component::ParentDir if resolved.pop().is_some() => {}
                Component::CurDir => {}
                _ => return Err(format!("link {:?} -> {} leaves the archive", parts.join(std::ffi::OsStr::new("/")), target.display())),
            }
        }
        let source = resolved.iter().fold(into.to_path_buf(), |a, c| a.join(c));
        let at = parts.iter().fold(into.to_path_buf(), |a, c| a.join(c));
        if !std::fs::symlink_metadata(&source).is_ok_and(|m| m.is_file()) {
            return Err(format!("link {} -> {}: not a file of the archive", at.display(), target.display()));
        }
        if let Some(parent) = at.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        remove_any(&at).map_err(|e| e.to_string())?;
        std::fs::hard_link(&source, &at).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// A digest of a root filesystem folder: every entry's path, type, mode, owner, size, link
/// target and bytes, in order.
fn tree_digest(dir: &Path) -> std::io::Result<String> {
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
        h.update(format!("{}\0{:o}\0{}\0{}\0{}\0", rel.display(), m.mode(), m.uid(), m.gid(), m.len()).as_bytes());
        if m.file_type().is_symlink() {
            h.update(std::fs::read_link(&path)?.as_os_str().as_encoded_bytes());
        } else if m.is_file() {
            std::io::copy(&mut std::fs::File::open(&path)?, &mut h)?;
        }
    }
    Ok(format!("sha256:{:x}", h.finalize()))
}

/// Copies a root filesystem folder with everything kept (cp -a).
fn copy_tree(src: &Path, root: &Path) -> Result<(), String> {
    let out = std::process::Command::new("cp").arg("-a").arg(format!("{}/.", src.display())).arg(root).output().map_err(|e| format!("running cp: {e}"))?;
    if !out.status.success() {
        return Err(format!("copying {}: {}", src.display(), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(())
}

/// What every farm image has (as `common_root` in scripts/setup.sh): the agent, the users
/// `farm` (1000) and `farm-checker` (999), `farm-sandbox` as the one setuid program, the
/// folders the agent uses.
fn add_farm(root: &Path, agent: &Artifact) -> Result<(), String> {
    let e = |what: &str| {
        let what = what.to_string();
        move |err: std::io::Error| format!("{what}: {err}")
    };
    for d in ["sbin", "bin", "dev", "proc", "sys", "tmp", "run", "root", "etc", "workspace", "var/tmp", "usr/local/bin", "home/farm"] {
        let parts = entry_components(Path::new(d))?;
        let at = resolve(root, &parts)?;
        if std::fs::symlink_metadata(&at).is_err() {
            std::fs::create_dir(&at).map_err(e(d))?;
        }
    }
    for d in ["tmp", "var/tmp"] {
        let at = resolve(root, &entry_components(Path::new(d))?)?;
        std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o1777)).map_err(e(d))?;
    }
    // No setuid or setgid bit but farm-sandbox's.
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).map_err(e("walking the root"))?.flatten() {
            let m = std::fs::symlink_metadata(entry.path()).map_err(e("walking the root"))?;
            if m.is_dir() {
                todo.push(entry.path());
            } else if m.is_file() && m.mode() & 0o6000 != 0 {
                std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(m.mode() & 0o1777)).map_err(e("removing a setuid bit"))?;
            }
        }
    }
    let agent_dir = agent.path.parent().ok_or("the agent has no folder")?;
    let install = |src: &Path, dest: &str, mode: u32, gid: u32| -> Result<(), String> {
        let at = resolve(root, &entry_components(Path::new(dest))?)?;
        remove_any(&at).map_err(e(dest))?;
        std::fs::copy(src, &at).map_err(e(dest))?;
        std::os::unix::fs::lchown(&at, Some(0), Some(gid)).map_err(e(dest))?;
        std::fs::set_permissions(&at, std::fs::Permissions::from_mode(mode)).map_err(e(dest))
    };
    install(&agent.path, "sbin/farm-agent", 0o755, 0)?;
    install(&agent_dir.join("farm-sandbox"), "usr/local/bin/farm-sandbox", 0o4750, 999)?;
    let etc = resolve(root, &entry_components(Path::new("etc/x"))?)?.parent().map(Path::to_path_buf).ok_or("no /etc")?;
    let write = |name: &str, text: &str| -> Result<(), String> {
        let at = etc.join(name);
        remove_any(&at).map_err(e(name))?;
        std::fs::write(&at, text).map_err(e(name))
    };
    write("hostname", "farm\n")?;
    write("hosts", "127.0.0.1 localhost\n::1 localhost\n")?;
    for (file, lines) in [
        ("passwd", ["root:x:0:0:root:/root:/bin/sh", "farm-checker:x:999:999:farm checker:/nonexistent:/bin/false", "farm:x:1000:1000:farm:/home/farm:/bin/sh"]),
        ("group", ["root:x:0:", "farm-checker:x:999:", "farm:x:1000:"]),
    ] {
        let at = etc.join(file);
        let meta = std::fs::symlink_metadata(&at);
        if meta.as_ref().is_ok_and(|m| !m.is_file()) {
            remove_any(&at).map_err(e(file))?;
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
        let mut f = std::fs::File::create(&at).map_err(e(file))?;
        f.write_all(text.as_bytes()).map_err(e(file))?;
        std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o644)).map_err(e(file))?;
    }
    let home = resolve(root, &entry_components(Path::new("home/farm"))?)?;
    std::os::unix::fs::lchown(&home, Some(1000), Some(1000)).map_err(e("home/farm"))?;
    Ok(())
}

fn du_mib(root: &Path) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_specs_parse_and_unknown_ones_are_named() {
        let base = Path::new("/suites");
        assert_eq!(ImageSource::parse("python", base).unwrap(), ImageSource::Builtin("python".into()));
        assert_eq!(ImageSource::parse("oci-archive:img.tar", base).unwrap(), ImageSource::OciArchive("/suites/img.tar".into()));
        assert_eq!(ImageSource::parse("docker-archive:/x/d.tar", base).unwrap(), ImageSource::DockerArchive("/x/d.tar".into()));
        assert_eq!(ImageSource::parse("oci:layout", base).unwrap(), ImageSource::OciDir("/suites/layout".into()));
        assert_eq!(ImageSource::parse("rootfs:r", base).unwrap(), ImageSource::RootfsDir("/suites/r".into()));
        assert!(ImageSource::parse("docker://ubuntu", base).is_err());
        assert!(ImageSource::parse("ubuntu", base).is_err());
    }

    #[test]
    fn links_met_while_unpacking_stay_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("root"), dir.path().join("outside"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../../..", root.join("up")).unwrap();
        let comps = |p: &str| entry_components(Path::new(p)).unwrap();
        // An absolute target is the image's root, not the host's.
        let at = resolve(&root, &comps("abs/file")).unwrap();
        assert!(at.starts_with(&root), "{}", at.display());
        let at = resolve(&root, &comps("up/etc/passwd")).unwrap();
        assert_eq!(at, root.join("etc/passwd"));
        assert!(entry_components(Path::new("../x")).is_err());
        assert!(entry_components(Path::new("/etc/x")).is_err());
        assert!(std::fs::read_dir(&outside).unwrap().next().is_none(), "nothing was made outside");
    }
}
