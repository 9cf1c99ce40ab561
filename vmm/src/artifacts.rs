//! Finding the guest kernel and root images that `scripts/setup.sh` built.
//!
//! The set-up script keeps artifacts in a cache directory (`FARM_CACHE_DIR`, default
//! `~/.cache/farm`), each in a folder named by a hash of its inputs with a `manifest.json`,
//! and points `current/<name>` at the latest build of each.

use std::path::{Path, PathBuf};

use serde::Serialize;

pub use images::cache::{cache_dir, Artifact, IMAGES};

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("{what} not found at {path}: run scripts/setup.sh to build the guest kernel, agent and images")]
    Missing { what: String, path: PathBuf },
    #[error(transparent)]
    UnknownImage(#[from] images::UnknownImage),
    #[error("manifest {path} is unreadable or malformed: {detail}; re-run scripts/setup.sh")]
    BadManifest { path: PathBuf, detail: String },
    #[error(transparent)]
    Image(#[from] images::ImageError),
}

/// Everything needed to boot an image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuestArtifacts {
    pub image_name: String,
    pub kernel: Artifact,
    pub image: Artifact,
    pub agent: Artifact,
    /// For an image from a registry: what this lookup's pull resolved it to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pulled: Option<images::registry::Pulled>,
}

impl GuestArtifacts {
    /// The artifacts of `image_name`: a built-in image, or an image archive or folder
    /// (converted once, then cached; see the `images` crate) with relative paths taken from
    /// the current folder.
    pub fn locate(cache: &Path, image_name: &str) -> Result<GuestArtifacts, ArtifactError> {
        GuestArtifacts::locate_in(cache, image_name, Path::new("."))
    }

    /// As [`GuestArtifacts::locate`], with relative image paths taken from `base`.
    pub fn locate_in(cache: &Path, image_name: &str, base: &Path) -> Result<GuestArtifacts, ArtifactError> {
        GuestArtifacts::locate_sized(cache, image_name, base, None)
    }

    /// As [`GuestArtifacts::locate_in`], with the size of a converted image (MiB).
    pub fn locate_sized(
        cache: &Path,
        image_name: &str,
        base: &Path,
        size_mib: Option<u64>,
    ) -> Result<GuestArtifacts, ArtifactError> {
        let source = images::ImageSource::parse(image_name, base)?;
        if !matches!(source, images::ImageSource::Builtin(_)) {
            let current = cache.join("current");
            let agent = artifact(&current.join("agent"), "farm-agent", "guest agent")?;
            let (image, pulled) = images::converted(cache, &source, &agent, size_mib)?;
            return Ok(GuestArtifacts {
                image_name: image_name.to_string(),
                kernel: artifact(&current.join("kernel"), "vmlinux", "guest kernel")?,
                image,
                agent,
                pulled,
            });
        }
        let current = cache.join("current");
        Ok(GuestArtifacts {
            image_name: image_name.to_string(),
            kernel: artifact(&current.join("kernel"), "vmlinux", "guest kernel")?,
            image: artifact(
                &current.join(image_name),
                "rootfs.ext4",
                &format!("root image {image_name:?}"),
            )?,
            agent: artifact(&current.join("agent"), "farm-agent", "guest agent")?,
            pulled: None,
        })
    }
}

/// The RAM shim a fork's QEMU preloads (built by the set-up script from
/// `scripts/qemu-ram-shim.c`; see [`crate::jail`]).
pub fn ram_shim(cache: &Path) -> Result<Artifact, ArtifactError> {
    artifact(
        &cache.join("current").join("shim"),
        "libfarm-ramshim.so",
        "QEMU RAM shim",
    )
}

/// QEMU built with farm's reset patch by the set-up script (`scripts/build-qemu.sh`), or
/// None when it has not been built here.
pub fn reset_qemu(cache: &Path) -> Option<PathBuf> {
    let path = cache
        .join("current")
        .join("qemu-farm-reset")
        .join("bin")
        .join("qemu-system-x86_64");
    // The real path: the QEMU uid cannot pass through the cache in root's home.
    path.canonicalize().ok().filter(|p| p.is_file())
}

fn artifact(dir: &Path, file: &str, what: &str) -> Result<Artifact, ArtifactError> {
    let path = dir.join(file);
    if !path.is_file() {
        return Err(ArtifactError::Missing {
            what: what.to_string(),
            path,
        });
    }
    let manifest_path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&manifest_path).map_err(|e| ArtifactError::BadManifest {
        path: manifest_path.clone(),
        detail: e.to_string(),
    })?;
    let manifest: serde_json::Value = serde_json::from_str(&text).map_err(|e| ArtifactError::BadManifest {
        path: manifest_path.clone(),
        detail: e.to_string(),
    })?;
    let key = manifest
        .get("key")
        .and_then(|k| k.as_str())
        .ok_or_else(|| ArtifactError::BadManifest {
            path: manifest_path.clone(),
            detail: "no \"key\" string".into(),
        })?;
    // Resolve the `current/` symlink so what is recorded names the exact build.
    let path = path.canonicalize().unwrap_or(path);
    Ok(Artifact {
        path,
        key: key.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_artifacts_point_to_the_setup_script() {
        let dir = tempfile::tempdir().unwrap();
        let err = GuestArtifacts::locate(dir.path(), "minimal").unwrap_err().to_string();
        assert!(err.contains("scripts/setup.sh") && err.contains("vmlinux"), "{err}");
    }

    #[test]
    fn unknown_image_lists_the_known_ones() {
        let err = GuestArtifacts::locate(Path::new("/nonexistent"), "ubuntu")
            .unwrap_err()
            .to_string();
        assert!(err.contains("minimal, python"), "{err}");
    }

    #[test]
    fn keys_come_from_manifests() {
        let dir = tempfile::tempdir().unwrap();
        for (name, file) in [
            ("kernel", "vmlinux"),
            ("minimal", "rootfs.ext4"),
            ("agent", "farm-agent"),
        ] {
            let d = dir.path().join("current").join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(file), b"x").unwrap();
            std::fs::write(d.join("manifest.json"), format!(r#"{{"key":"k-{name}"}}"#)).unwrap();
        }
        let found = GuestArtifacts::locate(dir.path(), "minimal").unwrap();
        assert_eq!(found.kernel.key, "k-kernel");
        assert_eq!(found.image.key, "k-minimal");
        assert_eq!(found.agent.key, "k-agent");
    }
}
