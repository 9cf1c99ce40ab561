//! Root images: the guest's root filesystem, from the built-in images the set-up builds, OCI
//! and Docker archives, registries and plain root filesystems. This crate owns everything
//! between an image reference and an ext4 file a VM can boot; it knows nothing of QEMU (the
//! machine layer, `vmm`, asks it for a converted image) or of the network (`egress`).
//!
//! `[template] image` may name, besides the built-in `minimal` and `python`:
//! - `oci-archive:PATH`: an OCI image layout in a tar (`skopeo copy ... oci-archive:PATH`);
//! - `docker-archive:PATH`: the output of `docker save` (or `skopeo ... docker-archive:`);
//! - `oci:DIR`: an OCI image layout folder;
//! - `rootfs:DIR`: a plain root filesystem folder;
//! - `registry:REF`: an image in an OCI or Docker registry, pulled on the host (`registry`).
//!
//! A conversion flows through the submodules in order: an archive is unpacked into a work
//! folder (`unpack`); its layout is read, every blob checked against its digest (`oci`,
//! `docker`); the layers are unpacked in order into a staging folder, with whiteouts and
//! opaque folders, file modes, owners, symbolic and hard links (`unpack`); farm's agent,
//! its two users and `farm-sandbox` are added as for the built-in images (`staging`); and
//! `mkfs.ext4 -d` writes the image (here). Images are cached under `images/conv-<key>/` by a
//! key over the image's content digest (OCI: the manifest's digest; Docker: the config's
//! digest; rootfs: every file's path, metadata and bytes), the agent and this recipe: an
//! unchanged image is converted once.
//!
//! Archives are untrusted input. Every blob is checked against its digest; an entry path
//! that is absolute or has `..` is refused; links met while unpacking are resolved inside
//! the root (an absolute link target means the image's root, never the host's); device
//! nodes are refused. Nothing is written outside the cache.

// The checkout this crate is built in (`.cargo/config.toml`): its build is never another clone's.
const _: Option<&str> = option_env!("FARM_CHECKOUT");

pub mod cache;
mod docker;
mod oci;
pub mod registry;
mod staging;
mod unpack;

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::cache::Artifact;

pub use docker::DockerArchiveError;
pub use oci::OciLayoutError;
pub use staging::AddFarmError;
pub use unpack::{PlaceError, UnpackError};

/// Bump when the conversion changes what it writes.
const RECIPE: &str = "conv-recipe-2";

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    Builtin(String),
    OciArchive(PathBuf),
    DockerArchive(PathBuf),
    OciDir(PathBuf),
    RootfsDir(PathBuf),
    /// An image reference (`[REGISTRY/]REPOSITORY[:TAG][@DIGEST]`).
    Registry(String),
}

/// Why converting an image failed: the image (its spec, as a snapshot records it) and the
/// step that failed.
#[derive(Debug, thiserror::Error)]
#[error("converting image {image:?} failed")]
pub struct ImageError {
    pub image: String,
    #[source]
    pub step: Box<ConvertError>,
}

/// The step of a conversion that failed.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("a built-in image needs no conversion")]
    Builtin,
    #[error("the root filesystem {} is not a folder", path.display())]
    NotAFolder { path: PathBuf },
    #[error("reading the root filesystem {} failed", path.display())]
    ReadRootfs {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("unpacking the archive {} failed", archive.display())]
    UnpackArchive {
        archive: PathBuf,
        #[source]
        source: UnpackError,
    },
    #[error("reading the OCI image layout failed")]
    OciLayout(#[from] OciLayoutError),
    #[error("reading the docker archive failed")]
    DockerArchive(#[from] DockerArchiveError),
    #[error("pulling the image failed")]
    Pull(#[from] registry::PullError),
    #[error("running cp -a to copy the root filesystem {} failed", path.display())]
    RunCp {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("copying the root filesystem {} failed: {stderr}", path.display())]
    CopyRootfs { path: PathBuf, stderr: String },
    #[error("applying layer {number} ({name}) failed")]
    ApplyLayer {
        number: usize,
        name: String,
        #[source]
        source: UnpackError,
    },
    #[error("adding farm's agent and users failed")]
    AddFarm(#[from] AddFarmError),
    #[error("image_size_mib {size} is too small for {used} MiB of files")]
    TooSmall { size: u64, used: u64 },
    #[error("running mkfs.ext4 (package e2fsprogs) failed")]
    RunMkfs(#[source] io::Error),
    #[error("mkfs.ext4 failed: {stderr}")]
    Mkfs { stderr: String },
    #[error("{what} failed")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

fn io_step(what: &'static str) -> impl FnOnce(io::Error) -> ConvertError {
    move |source| ConvertError::Io { what, source }
}

/// An `image` that is neither a built-in image nor an archive or folder of a known kind.
#[derive(Debug, thiserror::Error)]
#[error("unknown image {name:?}: expected one of {}, or oci-archive:PATH, docker-archive:PATH, oci:DIR, rootfs:DIR, registry:REF", crate::cache::IMAGES.join(", "))]
pub struct UnknownImage {
    pub name: String,
}

impl ImageSource {
    /// Parses `[template] image`; relative paths are taken from `base`.
    pub fn parse(spec: &str, base: &Path) -> Result<ImageSource, UnknownImage> {
        let path = |p: &str| {
            if Path::new(p).is_absolute() {
                PathBuf::from(p)
            } else {
                base.join(p)
            }
        };
        Ok(match spec.split_once(':') {
            Some(("oci-archive", p)) if !p.is_empty() => ImageSource::OciArchive(path(p)),
            Some(("docker-archive", p)) if !p.is_empty() => ImageSource::DockerArchive(path(p)),
            Some(("oci", p)) if !p.is_empty() => ImageSource::OciDir(path(p)),
            Some(("rootfs", p)) if !p.is_empty() => ImageSource::RootfsDir(path(p)),
            Some(("registry", r)) if !r.is_empty() => ImageSource::Registry(r.to_string()),
            None if crate::cache::IMAGES.contains(&spec) => ImageSource::Builtin(spec.to_string()),
            _ => return Err(UnknownImage { name: spec.to_string() }),
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
            ImageSource::Registry(r) => format!("registry:{r}"),
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

impl ImageConfig {
    /// The variables a command gets: the image's `Env`, each set over by `overrides` (as
    /// `docker run -e` does), the overrides last.
    pub fn env_with<'a>(&self, overrides: impl IntoIterator<Item = (&'a String, &'a String)>) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = self
            .env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (k, v) in overrides {
            env.retain(|(key, _)| key != k);
            env.push((k.clone(), v.clone()));
        }
        env
    }
}

/// What an image is made of: its layers (in order), its config and its content digest;
/// for a pulled image, where it came from.
struct ImageContents {
    layers: Vec<unpack::Layer>,
    config: ImageConfig,
    digest: String,
    pulled: Option<registry::Pulled>,
}

/// The ext4 image for `source` (not a built-in one): the cached conversion, or a new one;
/// for an image from a registry, what the pull resolved.
pub fn converted(
    cache: &Path,
    source: &ImageSource,
    agent: &Artifact,
    size_mib: Option<u64>,
) -> Result<(Artifact, Option<registry::Pulled>), ImageError> {
    convert(cache, source, agent, size_mib).map_err(|step| ImageError {
        image: source.spec(),
        step: Box::new(step),
    })
}

fn convert(
    cache: &Path,
    source: &ImageSource,
    agent: &Artifact,
    size_mib: Option<u64>,
) -> Result<(Artifact, Option<registry::Pulled>), ConvertError> {
    let tmp = cache.join("tmp");
    std::fs::create_dir_all(&tmp).map_err(io_step("creating the cache's tmp folder"))?;
    let work = tempfile::Builder::new()
        .prefix("conv-")
        .tempdir_in(&tmp)
        .map_err(io_step("creating a work folder"))?;
    let contents = read_contents(source, work.path(), cache)?;
    let key = cache_key(&contents.digest, agent, size_mib);
    let dir = cache.join("images").join(format!("conv-{key}"));
    // One conversion of an image at a time (tasks that share a base convert it at once):
    // whoever waited finds it done.
    std::fs::create_dir_all(cache.join("images")).map_err(io_step("creating the images folder"))?;
    let lock_file = std::fs::File::create(cache.join("images").join(format!(".conv-{key}.lock")))
        .map_err(io_step("creating the conversion's lock file"))?;
    let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, errno)| {
        ConvertError::Io {
            what: "locking the conversion",
            source: errno.into(),
        }
    })?;
    if dir.join("manifest.json").is_file() && dir.join("rootfs.ext4").is_file() {
        return Ok((
            Artifact {
                path: dir.join("rootfs.ext4"),
                key,
            },
            contents.pulled,
        ));
    }
    let root = work.path().join("root");
    stage_root(source, &contents, &root, cache, agent)?;

    let staged = cache.join("images").join(format!(".conv-{key}.tmp"));
    let size = write_image(&root, &staged, size_mib)?;
    std::fs::write(
        staged.join("image.json"),
        serde_json::to_vec_pretty(&contents.config).unwrap_or_default(),
    )
    .map_err(io_step("writing image.json"))?;
    let mut manifest = serde_json::json!({ "key": key, "name": "image-converted", "source": source.spec(), "content_digest": contents.digest, "agent": agent.key, "size_mib": size, "recipe": RECIPE });
    if let Some(pulled) = &contents.pulled {
        manifest["pulled"] = serde_json::json!({ "resolved": pulled.resolved, "overridden_from": pulled.overridden_from, "via": pulled.via });
    }
    std::fs::write(
        staged.join("manifest.json"),
        serde_json::to_vec_pretty(&manifest).unwrap_or_default(),
    )
    .map_err(io_step("writing manifest.json"))?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&staged, &dir).map_err(io_step("publishing the image"))?;
    Ok((
        Artifact {
            path: dir.join("rootfs.ext4"),
            key,
        },
        contents.pulled,
    ))
}

/// Builds the image's root filesystem in `root`: a rootfs folder copied, the layers applied in
/// order, then farm's agent and users added.
fn stage_root(
    source: &ImageSource,
    contents: &ImageContents,
    root: &Path,
    cache: &Path,
    agent: &Artifact,
) -> Result<(), ConvertError> {
    std::fs::create_dir_all(root).map_err(io_step("creating the staging root"))?;
    if let ImageSource::RootfsDir(src) = source {
        copy_rootfs(src, root)?;
    }
    for (i, layer) in contents.layers.iter().enumerate() {
        unpack::apply_layer(layer, root).map_err(|source| ConvertError::ApplyLayer {
            number: i + 1,
            name: layer.name.clone(),
            source,
        })?;
        // Checked against its digest as it was applied: into the blob store the registry
        // path shares, so an image met as an archive and from a registry is kept once.
        if contents.pulled.is_none() {
            let (unpack::LayerDigest::Blob(digest) | unpack::LayerDigest::DiffId(digest)) = &layer.digest;
            registry::keep_blob(cache, digest, &layer.path);
        }
    }
    staging::add_farm(root, agent)?;
    Ok(())
}

/// Reads the source's layers, config and content digest; an archive is unpacked into `work`
/// first, and an image in a registry pulled into the store in `cache`.
fn read_contents(source: &ImageSource, work: &Path, cache: &Path) -> Result<ImageContents, ConvertError> {
    let unpacked = |archive: &Path| {
        let layout = work.join("layout");
        unpack::unpack_archive(archive, &layout).map_err(|source| ConvertError::UnpackArchive {
            archive: archive.to_path_buf(),
            source,
        })?;
        Ok::<_, ConvertError>(layout)
    };
    Ok(match source {
        ImageSource::Builtin(_) => return Err(ConvertError::Builtin),
        ImageSource::RootfsDir(dir) => {
            if !dir.is_dir() {
                return Err(ConvertError::NotAFolder { path: dir.clone() });
            }
            let digest = staging::tree_digest(dir).map_err(|source| ConvertError::ReadRootfs {
                path: dir.clone(),
                source,
            })?;
            ImageContents {
                layers: Vec::new(),
                config: ImageConfig::default(),
                digest,
                pulled: None,
            }
        }
        ImageSource::OciDir(dir) => oci::read_layout(dir)?,
        ImageSource::OciArchive(tar) => oci::read_layout(&unpacked(tar)?)?,
        ImageSource::DockerArchive(tar) => docker::read_archive(&unpacked(tar)?)?,
        ImageSource::Registry(reference) => {
            let pulled = registry::pull(cache, reference)?;
            let contents = oci::read_manifest(&registry::store_dir(cache), &pulled.digest, pulled.size)?;
            ImageContents {
                pulled: Some(pulled),
                ..contents
            }
        }
    })
}

/// The cache key of a conversion: the content digest, the agent, the recipe and the size.
fn cache_key(digest: &str, agent: &Artifact, size_mib: Option<u64>) -> String {
    let mut h = Sha256::new();
    for part in [
        digest,
        agent.key.as_str(),
        RECIPE,
        &size_mib.map(|s| s.to_string()).unwrap_or_default(),
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    format!("{:x}", h.finalize())[..16].to_string()
}

/// Copies a root filesystem folder with everything kept (`cp -a`).
fn copy_rootfs(src: &Path, root: &Path) -> Result<(), ConvertError> {
    let out = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", src.display()))
        .arg(root)
        .output()
        .map_err(|source| ConvertError::RunCp {
            path: src.to_path_buf(),
            source,
        })?;
    if !out.status.success() {
        return Err(ConvertError::CopyRootfs {
            path: src.to_path_buf(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Writes `root` as `staged/rootfs.ext4`, read-only, of `size_mib` or a size that fits the
/// files with room to spare; returns the size (MiB).
fn write_image(root: &Path, staged: &Path, size_mib: Option<u64>) -> Result<u64, ConvertError> {
    let _ = std::fs::remove_dir_all(staged);
    std::fs::create_dir_all(staged).map_err(io_step("creating the image folder"))?;
    let used = staging::du_mib(root);
    let size = size_mib.unwrap_or(used + used / 4 + 256);
    if size < used + 16 {
        return Err(ConvertError::TooSmall { size, used });
    }
    let image = staged.join("rootfs.ext4");
    let out = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "root", "-E", "root_owner=0:0", "-d"])
        .arg(root)
        .arg(&image)
        .arg(format!("{size}M"))
        .output()
        .map_err(ConvertError::RunMkfs)?;
    if !out.status.success() {
        return Err(ConvertError::Mkfs {
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o444))
        .map_err(io_step("making the image read-only"))?;
    Ok(size)
}

/// The image config recorded with a converted image.
pub fn config_of(image: &Artifact) -> Option<ImageConfig> {
    let dir = image.path.parent()?;
    serde_json::from_slice(&std::fs::read(dir.join("image.json")).ok()?).ok()
}

/// The digest of a file's bytes, as `sha256:<hex>`.
fn sha256_file(path: &Path) -> io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    io::copy(&mut file, &mut h)?;
    Ok(format!("sha256:{:x}", h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_specs_parse_and_unknown_ones_are_named() {
        let base = Path::new("/suites");
        assert_eq!(
            ImageSource::parse("python", base).unwrap(),
            ImageSource::Builtin("python".into())
        );
        assert_eq!(
            ImageSource::parse("oci-archive:img.tar", base).unwrap(),
            ImageSource::OciArchive("/suites/img.tar".into())
        );
        assert_eq!(
            ImageSource::parse("docker-archive:/x/d.tar", base).unwrap(),
            ImageSource::DockerArchive("/x/d.tar".into())
        );
        assert_eq!(
            ImageSource::parse("oci:layout", base).unwrap(),
            ImageSource::OciDir("/suites/layout".into())
        );
        assert_eq!(
            ImageSource::parse("rootfs:r", base).unwrap(),
            ImageSource::RootfsDir("/suites/r".into())
        );
        assert!(ImageSource::parse("docker://ubuntu", base).is_err());
        assert!(ImageSource::parse("ubuntu", base).is_err());
    }
}
