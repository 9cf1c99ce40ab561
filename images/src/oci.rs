//! OCI image layouts (`oci:DIR`, and `oci-archive:PATH` once unpacked), read as the OCI
//! image spec defines them: `index.json` lists manifest descriptors (through nested indexes
//! for multi-platform images); a manifest names the config and the layers by descriptor;
//! the config holds what commands run with (`config.Env`, `User`, `WorkingDir`). Every blob
//! read here is checked against its descriptor's size and digest; the layers are checked
//! when they are applied.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::unpack::{Layer, LayerDigest};
use super::{ImageConfig, ImageContents};

/// The annotation that names an image of a layout (its tag).
const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Why an OCI image layout could not be read.
#[derive(Debug, thiserror::Error)]
pub enum OciLayoutError {
    #[error("its index.json cannot be read")]
    ReadIndex(#[source] io::Error),
    #[error("{file} is not a valid {expected}")]
    Parse {
        file: String,
        expected: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("{file} lists no manifest")]
    NoManifest { file: String },
    #[error("digest {digest:?} is not of the form sha256:<64 hex digits>")]
    Digest { digest: String },
    #[error("reading blob {digest} failed")]
    ReadBlob {
        digest: String,
        #[source]
        source: io::Error,
    },
    #[error("blob {digest} is {actual} bytes, but its descriptor says {expected}")]
    Size { digest: String, actual: u64, expected: u64 },
    #[error("blob {digest} does not match its digest (it hashes to {actual})")]
    Mismatch { digest: String, actual: String },
}

/// An image index: `index.json`, or a nested index blob.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Index {
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

/// A reference to a blob.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    platform: Option<Platform>,
}

impl Descriptor {
    fn is_index(&self) -> bool {
        self.media_type.contains("index") || self.media_type.contains("manifest.list")
    }

    fn is_linux_amd64(&self) -> bool {
        self.platform
            .as_ref()
            .is_some_and(|p| p.architecture == "amd64" && p.os == "linux")
    }
}

#[derive(Debug, Clone, Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

/// An image manifest.
#[derive(Debug, Deserialize)]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

/// An image config (OCI's, which Docker's config files also are): the parts farm uses.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ConfigFile {
    #[serde(default)]
    config: Option<RunConfig>,
    #[serde(default)]
    pub rootfs: Option<RootFs>,
}

/// What commands of the image run with.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RunConfig {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    working_dir: Option<String>,
}

/// The layers' digests, uncompressed, in order.
#[derive(Debug, Default, Deserialize)]
pub(super) struct RootFs {
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

impl ConfigFile {
    pub(super) fn image_config(&self) -> ImageConfig {
        let run = self.config.as_ref();
        ImageConfig {
            env: run.and_then(|c| c.env.clone()).unwrap_or_default(),
            working_dir: run.and_then(|c| c.working_dir.clone()).unwrap_or_default(),
            user: run.and_then(|c| c.user.clone()).unwrap_or_default(),
        }
    }
}

/// Reads an OCI image layout: index, manifest, config and layers. The content digest is the
/// manifest's.
pub(super) fn read_layout(dir: &Path) -> Result<ImageContents, OciLayoutError> {
    let bytes = std::fs::read(dir.join("index.json")).map_err(OciLayoutError::ReadIndex)?;
    let index: Index = parse(&bytes, "index.json", "OCI image index")?;
    let descriptor = choose(&index, "index.json", |m| m.first())?;
    read_image(dir, descriptor)
}

/// Reads the image the manifest (or index) blob `digest` of `size` bytes names, from a
/// folder that holds blobs as an OCI layout does (the registry store is one).
pub(super) fn read_manifest(dir: &Path, digest: &str, size: u64) -> Result<ImageContents, OciLayoutError> {
    read_image(
        dir,
        Descriptor {
            media_type: String::new(),
            digest: digest.to_string(),
            size,
            annotations: BTreeMap::new(),
            platform: None,
        },
    )
}

fn read_image(dir: &Path, mut descriptor: Descriptor) -> Result<ImageContents, OciLayoutError> {
    // An index of indexes (multi-platform): take linux/amd64, else the first.
    for _ in 0..4 {
        if !descriptor.is_index() {
            break;
        }
        let file = format!("blob {}", descriptor.digest);
        let nested: Index = parse(&checked_blob(dir, &descriptor)?, &file, "OCI image index")?;
        descriptor = choose(&nested, &file, |m| m.iter().find(|d| d.is_linux_amd64()).or(m.first()))?;
    }
    let manifest: Manifest = parse(
        &checked_blob(dir, &descriptor)?,
        &format!("blob {}", descriptor.digest),
        "OCI image manifest",
    )?;
    let config: ConfigFile = parse(
        &checked_blob(dir, &manifest.config)?,
        &format!("blob {}", manifest.config.digest),
        "OCI image config",
    )?;
    let layers = manifest
        .layers
        .iter()
        .map(|layer| {
            Ok(Layer {
                path: blob_path(dir, &layer.digest)?,
                name: layer.digest.clone(),
                digest: LayerDigest::Blob(layer.digest.clone()),
            })
        })
        .collect::<Result<_, OciLayoutError>>()?;
    Ok(ImageContents {
        layers,
        config: config.image_config(),
        digest: descriptor.digest,
        pulled: None,
    })
}

/// The manifest `pick` takes from an index; when the index lists several, which one is said
/// in the log.
fn choose(
    index: &Index,
    file: &str,
    pick: impl Fn(&[Descriptor]) -> Option<&Descriptor>,
) -> Result<Descriptor, OciLayoutError> {
    let chosen = pick(&index.manifests).ok_or_else(|| OciLayoutError::NoManifest { file: file.to_string() })?;
    if index.manifests.len() > 1 {
        let name = chosen
            .annotations
            .get(REF_NAME)
            .map(String::as_str)
            .unwrap_or("untagged");
        tracing::info!(target: "farm::image", "{file} lists {} manifests; converting {} ({name})", index.manifests.len(), chosen.digest);
    }
    Ok(chosen.clone())
}

fn parse<'a, T: Deserialize<'a>>(bytes: &'a [u8], file: &str, expected: &'static str) -> Result<T, OciLayoutError> {
    serde_json::from_slice(bytes).map_err(|source| OciLayoutError::Parse {
        file: file.to_string(),
        expected,
        source,
    })
}

/// Where the blob of `digest` is in the layout (the digest must be sha256).
fn blob_path(dir: &Path, digest: &str) -> Result<PathBuf, OciLayoutError> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()));
    let hex = hex.ok_or_else(|| OciLayoutError::Digest {
        digest: digest.to_string(),
    })?;
    Ok(dir.join("blobs").join("sha256").join(hex))
}

/// The bytes of a blob, after checking its size (before reading it) and its digest.
fn checked_blob(dir: &Path, descriptor: &Descriptor) -> Result<Vec<u8>, OciLayoutError> {
    let digest = &descriptor.digest;
    let path = blob_path(dir, digest)?;
    let read_failed = |source| OciLayoutError::ReadBlob {
        digest: digest.clone(),
        source,
    };
    let actual_size = std::fs::metadata(&path).map_err(read_failed)?.len();
    if actual_size != descriptor.size {
        return Err(OciLayoutError::Size {
            digest: digest.clone(),
            actual: actual_size,
            expected: descriptor.size,
        });
    }
    let bytes = std::fs::read(&path).map_err(read_failed)?;
    let actual = format!("sha256:{:x}", <sha2::Sha256 as sha2::Digest>::digest(&bytes));
    if actual != *digest {
        return Err(OciLayoutError::Mismatch {
            digest: digest.clone(),
            actual,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_read_env_user_and_working_dir_and_tolerate_nulls() {
        let config: ConfigFile = serde_json::from_str(r#"{"config": {"Env": ["A=1"], "User": "1234", "WorkingDir": "/data", "Cmd": ["sh"]}, "rootfs": {"type": "layers", "diff_ids": ["sha256:aa"]}}"#).unwrap();
        assert_eq!(
            config.image_config(),
            ImageConfig {
                env: vec!["A=1".into()],
                working_dir: "/data".into(),
                user: "1234".into()
            }
        );
        assert_eq!(config.rootfs.unwrap().diff_ids, ["sha256:aa"]);
        let bare: ConfigFile = serde_json::from_str(r#"{"config": {"Env": null}}"#).unwrap();
        assert_eq!(bare.image_config(), ImageConfig::default());
    }

    #[test]
    fn blobs_are_checked_against_their_descriptors() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = br#"{"schemaVersion": 2}"#;
        let digest = format!("sha256:{:x}", <sha2::Sha256 as sha2::Digest>::digest(bytes));
        let path = blob_path(dir.path(), &digest).unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes).unwrap();
        let descriptor = |digest: &str, size: u64| Descriptor {
            media_type: String::new(),
            digest: digest.into(),
            size,
            annotations: BTreeMap::new(),
            platform: None,
        };
        assert_eq!(
            checked_blob(dir.path(), &descriptor(&digest, bytes.len() as u64)).unwrap(),
            bytes
        );
        let err = checked_blob(dir.path(), &descriptor(&digest, 3))
            .unwrap_err()
            .to_string();
        assert!(err.contains("its descriptor says 3"), "{err}");
        std::fs::write(&path, br#"{"schemaVersion": 3}"#).unwrap();
        let err = checked_blob(dir.path(), &descriptor(&digest, bytes.len() as u64))
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not match its digest"), "{err}");
        assert!(blob_path(dir.path(), "sha512:00").is_err());
        assert!(blob_path(dir.path(), "sha256:../../etc/passwd").is_err());
    }

    #[test]
    fn an_index_without_manifests_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("index.json"),
            r#"{"schemaVersion": 2, "manifests": []}"#,
        )
        .unwrap();
        let err = read_layout(dir.path()).err().unwrap().to_string();
        assert_eq!(err, "index.json lists no manifest");
        std::fs::write(
            dir.path().join("index.json"),
            r#"{"manifests": [{"digest": "sha256:00"}]}"#,
        )
        .unwrap();
        let err = read_layout(dir.path()).err().unwrap();
        assert!(
            err.to_string().contains("index.json is not a valid OCI image index"),
            "{err}"
        );
    }
}
