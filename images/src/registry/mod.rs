//! Images from OCI and Docker registries: `registry:REF`, pulled on the host (never in a
//! guest) with oci-client, the OCI distribution client the ORAS project keeps.
//!
//! A pull takes REF as Docker does (`python:3.12` is `docker.io/library/python:3.12`),
//! replaces it with the host's override if there is one (logged, and recorded with the
//! image), and fetches its manifest from each mirror of its registry in turn, then from the
//! registry itself. A multi-platform index is resolved to linux/amd64. The config and the
//! layers the store lacks are fetched; each is checked against its digest as it arrives and
//! again when it is read. A pinned digest (`REF@sha256:...`) is honoured exactly, and when
//! the store already holds that manifest and its blobs no request is made at all.
//!
//! The store is one content-addressed folder in the artifact cache, `oci/` (an OCI layout's
//! `blobs/sha256/`), and `oci/refs/` records the digest each reference last resolved to.

pub mod settings;

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{
    IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE,
};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::Deserialize;
use sha2::{Digest, Sha256};

pub use settings::{RegistrySettings, SettingsError};

/// The manifest kinds asked for: OCI and Docker, images and indexes.
const ACCEPTED: [&str; 4] = [
    OCI_IMAGE_MEDIA_TYPE,
    OCI_IMAGE_INDEX_MEDIA_TYPE,
    IMAGE_MANIFEST_MEDIA_TYPE,
    IMAGE_MANIFEST_LIST_MEDIA_TYPE,
];

/// An image pulled into the store.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Pulled {
    /// The image manifest's digest (linux/amd64's, for a multi-platform image).
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
    /// What was pulled: `registry/repository@digest`, after any override.
    pub resolved: String,
    /// The reference asked for, when an override replaced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overridden_from: Option<String>,
    /// The registry or mirror that answered (`store` when no request was needed).
    pub via: String,
}

/// Why an image could not be pulled.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{reference:?} is not an image reference (expected [REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST])")]
    Reference {
        reference: String,
        #[source]
        source: oci_client::ParseError,
    },
    #[error("registry settings")]
    Settings(#[from] SettingsError),
    #[error("pulling {reference} from {registry} failed")]
    Registry {
        reference: String,
        registry: String,
        #[source]
        source: oci_client::errors::OciDistributionError,
    },
    #[error("{registry} refused {reference} without valid credentials: set FARM_REGISTRY_USERNAME and FARM_REGISTRY_PASSWORD, or give {registry} an entry in the Docker config file ($DOCKER_CONFIG/config.json or ~/.docker/config.json)")]
    Unauthorized { reference: String, registry: String },
    #[error("{reference}: the image index has no linux/amd64 image (it has {platforms})")]
    NoPlatform { reference: String, platforms: String },
    #[error("{reference}: {what} from {registry} is not what it should be: {detail}")]
    Bad {
        reference: String,
        registry: String,
        what: String,
        detail: String,
    },
    #[error("{what} in the image store failed")]
    Store {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("starting the pull's runtime failed")]
    Runtime(#[source] io::Error),
}

fn store_err(what: &'static str) -> impl FnOnce(io::Error) -> PullError {
    move |source| PullError::Store { what, source }
}

/// Pulls `reference` into the store under `cache` with the host's settings. Blocking: the
/// pull runs on a thread of its own with its own runtime, so callers in and out of async
/// code alike wait for it as they wait for the rest of an image conversion.
pub fn pull(cache: &Path, reference: &str) -> Result<Pulled, PullError> {
    let settings = RegistrySettings::load()?;
    let store = cache.join("oci");
    let reference = reference.to_string();
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(PullError::Runtime)?;
                runtime.block_on(pull_with(&store, &reference, &settings))
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// The store's folder for blobs and references (an OCI layout's `blobs/sha256/`).
pub fn store_dir(cache: &Path) -> PathBuf {
    cache.join("oci")
}

/// Pulls `spec` into `store` with `settings`.
pub async fn pull_with(store: &Path, spec: &str, settings: &RegistrySettings) -> Result<Pulled, PullError> {
    let wanted: Reference = spec.parse().map_err(|source| PullError::Reference {
        reference: spec.to_string(),
        source,
    })?;
    let (reference, overridden_from) = match settings.overridden(&wanted) {
        Some(to) => {
            let source = settings
                .source
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            tracing::warn!(target: "farm::image", "image {} is pulled as {} (override in {source})", wanted.whole(), to.whole());
            (to.clone(), Some(wanted.whole()))
        }
        None => (wanted, None),
    };
    if let Some(pinned) = reference.digest() {
        if let Some(pulled) = from_store(store, &reference, pinned)? {
            return Ok(Pulled {
                overridden_from,
                ..pulled
            });
        }
    }
    // Mirrors in order, then the registry itself; a mirror's failure is logged and the next
    // one tried, the registry's is the answer.
    let mut last = None;
    for mirror in settings.mirrors(reference.registry()).iter().map(Some).chain([None]) {
        let mut attempt = reference.clone();
        if let Some(mirror) = mirror {
            attempt.set_mirror_registry(mirror.clone());
        }
        match pull_from(store, &attempt, settings).await {
            Ok(pulled) => {
                return Ok(Pulled {
                    overridden_from,
                    ..pulled
                })
            }
            Err(e) if mirror.is_some() => {
                tracing::warn!(target: "farm::image", "mirror {} of {}: {}", attempt.resolve_registry(), reference.registry(), chain(&e));
                last = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("the registry itself is always tried"))
}

/// The image `pinned` names, when the store holds its manifest and every blob of it.
fn from_store(store: &Path, reference: &Reference, pinned: &str) -> Result<Option<Pulled>, PullError> {
    let Ok(bytes) = std::fs::read(blob_path(store, pinned)) else {
        return Ok(None);
    };
    if sha256(&bytes) != pinned {
        return Ok(None);
    }
    let Ok(manifest) = serde_json::from_slice::<Manifest>(&bytes) else {
        return Ok(None);
    };
    if manifest
        .layers
        .iter()
        .chain([&manifest.config])
        .any(|d| !blob_path(store, &d.digest).is_file())
    {
        return Ok(None);
    }
    let resolved = format!("{}/{}@{pinned}", reference.registry(), reference.repository());
    Ok(Some(Pulled {
        digest: pinned.to_string(),
        size: bytes.len() as u64,
        resolved,
        overridden_from: None,
        via: "store".into(),
    }))
}

/// One attempt: `reference` (with its mirror set, if any) into `store`.
async fn pull_from(store: &Path, reference: &Reference, settings: &RegistrySettings) -> Result<Pulled, PullError> {
    let registry = reference.resolve_registry().to_string();
    let plain: Vec<String> = [registry.clone()]
        .into_iter()
        .filter(|r| settings.plain_http(r))
        .collect();
    let client = Client::new(ClientConfig {
        protocol: ClientProtocol::HttpsExcept(plain),
        connect_timeout: Some(Duration::from_secs(10)),
        read_timeout: Some(Duration::from_secs(120)),
        ..Default::default()
    });
    let auth = settings::credentials(&registry);
    let attempt = Attempt {
        client,
        auth,
        reference,
        registry,
    };
    let (bytes, digest) = attempt.image_manifest().await?;
    let manifest: Manifest = serde_json::from_slice(&bytes)
        .map_err(|e| attempt.bad("the image manifest", format!("no config and layers: {e}")))?;
    for blob in [&manifest.config].into_iter().chain(&manifest.layers) {
        let path = blob_path(store, &blob.digest);
        if path.is_file() {
            continue;
        }
        attempt.fetch_blob(store, blob, &path).await?;
    }
    write_blob(store, &digest, &bytes)?;
    record(store, reference, &digest)?;
    let resolved = format!("{}/{}@{digest}", reference.registry(), reference.repository());
    Ok(Pulled {
        digest,
        size: bytes.len() as u64,
        resolved,
        overridden_from: None,
        via: attempt.registry,
    })
}

/// One attempt's client for a registry (or a mirror of it), and how its failures name the
/// image and the registry.
struct Attempt<'a> {
    client: Client,
    auth: RegistryAuth,
    reference: &'a Reference,
    registry: String,
}

impl Attempt<'_> {
    fn failed(&self, source: OciDistributionError) -> PullError {
        match source {
            OciDistributionError::UnauthorizedError { .. } | OciDistributionError::AuthenticationFailure(_) => {
                PullError::Unauthorized {
                    reference: self.reference.whole(),
                    registry: self.registry.clone(),
                }
            }
            source => PullError::Registry {
                reference: self.reference.whole(),
                registry: self.registry.clone(),
                source,
            },
        }
    }

    fn bad(&self, what: &str, detail: String) -> PullError {
        PullError::Bad {
            reference: self.reference.whole(),
            registry: self.registry.clone(),
            what: what.to_string(),
            detail,
        }
    }

    /// The image manifest's bytes and digest (linux/amd64's, for a multi-platform index),
    /// each checked against the digest that named it.
    async fn image_manifest(&self) -> Result<(Vec<u8>, String), PullError> {
        let reference = self.reference;
        let (mut bytes, _) = self
            .client
            .pull_manifest_raw(reference, &self.auth, &ACCEPTED)
            .await
            .map_err(|e| self.failed(e))?;
        let mut digest = sha256(&bytes);
        if reference.digest().is_some_and(|pinned| pinned != digest) {
            return Err(self.bad("the manifest", format!("it hashes to {digest}, not the pinned digest")));
        }
        let head: Head = serde_json::from_slice(&bytes).map_err(|e| self.bad("the manifest", e.to_string()))?;
        if let Some(entries) = head.manifests {
            // A multi-platform index: linux/amd64's image manifest.
            let chosen = entries.iter().find(|e| {
                e.platform
                    .as_ref()
                    .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
            });
            let chosen = match chosen {
                Some(entry) => entry.digest.clone(),
                None if entries.len() == 1 && entries[0].platform.is_none() => entries[0].digest.clone(),
                None => {
                    let platforms = entries
                        .iter()
                        .filter_map(|e| e.platform.as_ref())
                        .map(|p| format!("{}/{}", p.os, p.architecture))
                        .collect::<Vec<_>>();
                    return Err(PullError::NoPlatform {
                        reference: reference.whole(),
                        platforms: if platforms.is_empty() {
                            "none named".into()
                        } else {
                            platforms.join(", ")
                        },
                    });
                }
            };
            let (entry_bytes, _) = self
                .client
                .pull_manifest_raw(&reference.clone_with_digest(chosen.clone()), &self.auth, &ACCEPTED)
                .await
                .map_err(|e| self.failed(e))?;
            if sha256(&entry_bytes) != chosen {
                return Err(self.bad(
                    "the linux/amd64 manifest",
                    format!("it does not hash to {chosen}, the digest the index gives"),
                ));
            }
            (bytes, digest) = (entry_bytes, chosen);
        }
        Ok((bytes, digest))
    }

    /// Fetches `blob` into the store at `path`, by way of a file in the store's `tmp/`.
    async fn fetch_blob(&self, store: &Path, blob: &Blob, path: &Path) -> Result<(), PullError> {
        check_digest(&blob.digest).map_err(|e| self.bad("a descriptor", e.to_string()))?;
        let tmp_dir = store.join("tmp");
        std::fs::create_dir_all(&tmp_dir).map_err(store_err("creating the store"))?;
        let tmp = tempfile::NamedTempFile::new_in(&tmp_dir).map_err(store_err("creating a blob file"))?;
        let mut file = tokio::fs::File::from_std(tmp.reopen().map_err(store_err("opening a blob file"))?);
        // oci-client checks the bytes against the descriptor's digest as they arrive.
        self.client
            .pull_blob(self.reference, blob.digest.as_str(), &mut file)
            .await
            .map_err(|e| self.failed(e))?;
        tokio::io::AsyncWriteExt::flush(&mut file)
            .await
            .map_err(store_err("writing a blob"))?;
        let size = tmp
            .as_file()
            .metadata()
            .map_err(store_err("reading a blob's size"))?
            .len();
        if size != blob.size {
            return Err(self.bad(
                &format!("blob {}", blob.digest),
                format!("{size} bytes, but its descriptor says {}", blob.size),
            ));
        }
        std::fs::create_dir_all(path.parent().expect("blob paths have a folder"))
            .map_err(store_err("creating the store"))?;
        tmp.persist(path).map_err(|e| PullError::Store {
            what: "storing a blob",
            source: e.error,
        })?;
        Ok(())
    }
}

/// Enough of a manifest or index to tell which it is.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    manifests: Option<Vec<IndexEntry>>,
}

#[derive(Deserialize)]
struct IndexEntry {
    digest: String,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    os: String,
    architecture: String,
}

/// An image manifest's blobs.
#[derive(Deserialize)]
struct Manifest {
    config: Blob,
    layers: Vec<Blob>,
}

#[derive(Deserialize)]
struct Blob {
    digest: String,
    size: u64,
}

/// An error and its causes on one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// A digest that is not `sha256:<64 lowercase hex digits>`.
#[derive(Debug, thiserror::Error)]
#[error("digest {0:?} is not sha256:<64 lowercase hex digits>")]
struct BadDigest(String);

fn check_digest(digest: &str) -> Result<(), BadDigest> {
    match digest.strip_prefix("sha256:") {
        Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) => Ok(()),
        _ => Err(BadDigest(digest.to_string())),
    }
}

/// Where a blob is in the store (digests are checked before they name a file).
fn blob_path(store: &Path, digest: &str) -> PathBuf {
    match check_digest(digest) {
        Ok(()) => store.join("blobs").join("sha256").join(&digest["sha256:".len()..]),
        Err(_) => store.join("blobs").join("invalid"),
    }
}

/// Keeps a verified blob (a layer of an archive) in the store, linked when it can be, copied
/// otherwise; best effort (the store is a cache).
pub(crate) fn keep_blob(cache: &Path, digest: &str, path: &Path) {
    let dest = blob_path(&store_dir(cache), digest);
    if check_digest(digest).is_err() || dest.is_file() {
        return;
    }
    let keep = || -> io::Result<()> {
        let dir = dest.parent().expect("blob paths have a folder");
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(".keep-{}-{}", std::process::id(), &digest["sha256:".len()..]));
        // A file of farm's own work folder is linked; a user's (an `oci:` layout) copied, so
        // a later change to it cannot reach the store.
        if !path.starts_with(cache) || std::fs::hard_link(path, &tmp).is_err() {
            std::fs::copy(path, &tmp)?;
        }
        std::fs::rename(&tmp, &dest)
    };
    if let Err(e) = keep() {
        tracing::debug!(target: "farm::image", "keeping blob {digest} in the store: {e}");
    }
}

fn write_blob(store: &Path, digest: &str, bytes: &[u8]) -> Result<(), PullError> {
    let path = blob_path(store, digest);
    std::fs::create_dir_all(path.parent().expect("blob paths have a folder"))
        .map_err(store_err("creating the store"))?;
    let tmp = tempfile::NamedTempFile::new_in(path.parent().expect("blob paths have a folder"))
        .map_err(store_err("creating a blob file"))?;
    std::fs::write(tmp.path(), bytes).map_err(store_err("writing a manifest"))?;
    tmp.persist(&path).map_err(|e| PullError::Store {
        what: "storing a manifest",
        source: e.error,
    })?;
    Ok(())
}

/// Notes the digest `reference` resolved to (`oci/refs/`), for the record and for tools that
/// must not reach the network.
fn record(store: &Path, reference: &Reference, digest: &str) -> Result<(), PullError> {
    let refs = store.join("refs");
    std::fs::create_dir_all(&refs).map_err(store_err("creating the references folder"))?;
    let name = format!("{:x}", Sha256::digest(reference.whole().as_bytes()));
    let line = serde_json::json!({ "reference": reference.whole(), "digest": digest }).to_string();
    std::fs::write(refs.join(&name[..32]), line).map_err(store_err("recording a reference"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_paths_take_only_well_formed_digests() {
        let store = Path::new("/s");
        let good = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            blob_path(store, &good),
            Path::new("/s/blobs/sha256").join("a".repeat(64))
        );
        for bad in [
            "sha256:../../etc/passwd",
            "md5:abc",
            &format!("sha256:{}", "A".repeat(64)),
        ] {
            assert_eq!(blob_path(store, bad), Path::new("/s/blobs/invalid"), "{bad}");
        }
    }

    #[test]
    fn a_pinned_image_whole_in_the_store_needs_no_request() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path();
        let config = b"{}".to_vec();
        write_blob(store, &sha256(&config), &config).unwrap();
        let manifest = format!(
            r#"{{"schemaVersion": 2, "config": {{"digest": "{}", "size": 2}}, "layers": []}}"#,
            sha256(&config)
        );
        let digest = sha256(manifest.as_bytes());
        write_blob(store, &digest, manifest.as_bytes()).unwrap();
        let reference: Reference = format!("reg.invalid:5000/img@{digest}").parse().unwrap();
        let pulled = from_store(store, &reference, &digest).unwrap().unwrap();
        assert_eq!(
            (pulled.via.as_str(), pulled.resolved),
            ("store", format!("reg.invalid:5000/img@{digest}"))
        );
        // A blob missing: the registry is asked.
        std::fs::remove_file(blob_path(store, &sha256(&config))).unwrap();
        assert!(from_store(store, &reference, &digest).unwrap().is_none());
    }
}
