//! `docker save` archives (`docker-archive:PATH`, once unpacked): `manifest.json` lists the
//! images, each with its config file, tags and layer files. The layers are checked, when they
//! are applied, against the config's diff ids (digests of the uncompressed layers); the
//! content digest is the config's (the image id).

use std::io;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::oci::ConfigFile;
use super::unpack::{Layer, LayerDigest};
use super::ImageContents;

/// Why a docker archive could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DockerArchiveError {
    #[error("its manifest.json cannot be read")]
    ReadManifest(#[source] io::Error),
    #[error("manifest.json lists no image")]
    NoImage,
    #[error("manifest.json is not a valid docker archive manifest (a list of {{Config, RepoTags, Layers}})")]
    ParseManifest(#[source] serde_json::Error),
    #[error("path {path:?} in manifest.json leaves the archive")]
    Outside { path: String },
    #[error("reading the image config {path:?} failed")]
    ReadConfig {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("the image config {path:?} is not a valid image config")]
    ParseConfig {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("manifest.json lists {layers} layers but the config {config:?} has {diff_ids} diff ids")]
    LayerCount {
        config: String,
        layers: usize,
        diff_ids: usize,
    },
}

/// One image of `manifest.json`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ArchiveImage {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

/// Reads a `docker save` folder: manifest.json, the first image's config and its layers.
pub(super) fn read_archive(dir: &Path) -> Result<ImageContents, DockerArchiveError> {
    let bytes = std::fs::read(dir.join("manifest.json")).map_err(DockerArchiveError::ReadManifest)?;
    let images: Vec<ArchiveImage> = serde_json::from_slice(&bytes).map_err(DockerArchiveError::ParseManifest)?;
    let image = images.first().ok_or(DockerArchiveError::NoImage)?;
    if images.len() > 1 {
        let tags = image.repo_tags.as_deref().unwrap_or_default().join(", ");
        tracing::info!(target: "farm::image", "manifest.json lists {} images; converting the first ({})", images.len(), if tags.is_empty() { "untagged" } else { &tags });
    }
    let config_bytes = std::fs::read(inside(dir, &image.config)?).map_err(|source| DockerArchiveError::ReadConfig {
        path: image.config.clone(),
        source,
    })?;
    let config: ConfigFile =
        serde_json::from_slice(&config_bytes).map_err(|source| DockerArchiveError::ParseConfig {
            path: image.config.clone(),
            source,
        })?;
    let diff_ids = config
        .rootfs
        .as_ref()
        .map(|r| r.diff_ids.as_slice())
        .unwrap_or_default();
    if image.layers.len() != diff_ids.len() {
        return Err(DockerArchiveError::LayerCount {
            config: image.config.clone(),
            layers: image.layers.len(),
            diff_ids: diff_ids.len(),
        });
    }
    let layers = image
        .layers
        .iter()
        .zip(diff_ids)
        .map(|(path, id)| {
            Ok(Layer {
                path: inside(dir, path)?,
                name: path.clone(),
                digest: LayerDigest::DiffId(id.clone()),
            })
        })
        .collect::<Result<_, DockerArchiveError>>()?;
    Ok(ImageContents {
        layers,
        config: config.image_config(),
        digest: format!("sha256:{:x}", Sha256::digest(&config_bytes)),
        pulled: None,
    })
}

/// A path of manifest.json inside the archive's folder.
fn inside(dir: &Path, path: &str) -> Result<PathBuf, DockerArchiveError> {
    let rel = Path::new(path);
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(DockerArchiveError::Outside { path: path.to_string() });
    }
    Ok(dir.join(rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_name_config_tags_and_layers_inside_the_archive() {
        let dir = tempfile::tempdir().unwrap();
        let config = r#"{"config": {"User": "app"}, "rootfs": {"type": "layers", "diff_ids": ["sha256:aa"]}}"#;
        std::fs::write(dir.path().join("c.json"), config).unwrap();
        std::fs::write(
            dir.path().join("manifest.json"),
            r#"[{"Config": "c.json", "RepoTags": ["farm/t:1"], "Layers": ["l/layer.tar"]}]"#,
        )
        .unwrap();
        let contents = read_archive(dir.path()).unwrap();
        assert_eq!(contents.config.user, "app");
        assert_eq!(contents.layers.len(), 1);
        assert_eq!(contents.layers[0].path, dir.path().join("l/layer.tar"));

        std::fs::write(
            dir.path().join("manifest.json"),
            r#"[{"Config": "../c.json", "RepoTags": null, "Layers": []}]"#,
        )
        .unwrap();
        let err = read_archive(dir.path()).err().unwrap().to_string();
        assert!(err.contains("leaves the archive"), "{err}");
        std::fs::write(
            dir.path().join("manifest.json"),
            r#"[{"Config": "c.json", "Layers": []}]"#,
        )
        .unwrap();
        let err = read_archive(dir.path()).err().unwrap().to_string();
        assert!(
            err.contains("0 layers but the config \"c.json\" has 1 diff ids"),
            "{err}"
        );
        std::fs::write(dir.path().join("manifest.json"), r#"[{"Layers": []}]"#).unwrap();
        assert!(matches!(
            read_archive(dir.path()),
            Err(DockerArchiveError::ParseManifest(_))
        ));
    }
}
