//! What an environment is made of: a client's request (`POST /v1/environments`), checked
//! and resolved into a [`Spec`] whose digest is the environment's id.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::Environments;
use crate::bounds;
use crate::error::ErrorKind;
use crate::error::{ApiError, ApiResult};

/// `POST /v1/environments`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentRequest {
    pub image: Option<String>,
    pub dockerfile: Option<DockerfileRequest>,
    pub cpus: Option<u64>,
    pub memory_mib: Option<u64>,
    pub disk_mib: Option<u64>,
    #[serde(default)]
    pub setup: Vec<String>,
    /// Build again even when it exists.
    #[serde(default)]
    pub force: bool,
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DockerfileRequest {
    pub context: String,
    #[serde(default = "dockerfile_name")]
    pub path: String,
    #[serde(default)]
    pub build_args: BTreeMap<String, String>,
    pub target: Option<String>,
}

fn dockerfile_name() -> String {
    "Dockerfile".into()
}

/// What an environment is made of (its id is a digest of this).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Source {
    /// A built-in image or a registry reference.
    Image { image: String },
    /// A Dockerfile in an uploaded context.
    Dockerfile {
        context: String,
        path: String,
        build_args: BTreeMap<String, String>,
        target: Option<String>,
    },
    /// A sandbox's state.
    Sandbox { sandbox: String, environment: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub source: Source,
    pub cpus: u32,
    pub memory_mib: u32,
    pub disk_mib: Option<u64>,
    pub setup: Vec<String>,
}

impl Spec {
    pub(super) fn id(&self) -> String {
        let digest = Sha256::digest(serde_json::to_vec(self).expect("specs serialize"));
        format!("env-{}", engine::snapshots::hex(&digest[..12]))
    }
}

impl Environments {
    /// The spec a request asks for, or a 400 naming the field.
    pub(super) fn spec_of(&self, request: &EnvironmentRequest) -> ApiResult<Spec> {
        request.check_bounds()?;
        let source = match (&request.image, &request.dockerfile) {
            (Some(image), None) => Source::Image {
                image: image_reference(image)?,
            },
            (None, Some(d)) => {
                self.contexts.folder(&d.context, "dockerfile.context")?;
                if !super::super::contexts::plain_relative(&d.path) {
                    return Err(ApiError::field(
                        ErrorKind::Invalid,
                        "dockerfile.path",
                        "must be a plain path inside the context (no leading /, no ..)",
                    ));
                }
                for key in d.build_args.keys() {
                    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                        return Err(ApiError::field(
                            ErrorKind::Invalid,
                            format!("dockerfile.build_args.{key}"),
                            "a build argument's name is letters, digits and _",
                        ));
                    }
                }
                Source::Dockerfile {
                    context: d.context.clone(),
                    path: d.path.clone(),
                    build_args: d.build_args.clone(),
                    target: d.target.clone().filter(|t| !t.is_empty()),
                }
            }
            (Some(_), Some(_)) => {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    "dockerfile",
                    "give image or dockerfile, not both",
                ))
            }
            (None, None) => {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    "image",
                    "missing: give image (a registry reference, minimal or python) or dockerfile",
                ))
            }
        };
        let cpus = request.cpus.unwrap_or(1);
        bounds::range("cpus", cpus, bounds::CPUS, "vCPUs")?;
        let memory_mib = request.memory_mib.unwrap_or(512);
        bounds::range("memory_mib", memory_mib, bounds::MEMORY_MIB, "MiB")?;
        // Within their bounds, both fit.
        let (cpus, memory_mib) = (cpus as u32, memory_mib as u32);
        if let Some(disk) = request.disk_mib {
            bounds::range("disk_mib", disk, bounds::DISK_MIB, "MiB")?;
        }
        if let Some(i) = request.setup.iter().position(|c| c.trim().is_empty()) {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                format!("setup[{i}]"),
                "must be a command",
            ));
        }
        Ok(Spec {
            source,
            cpus,
            memory_mib,
            disk_mib: request.disk_mib,
            setup: request.setup.clone(),
        })
    }
}

impl EnvironmentRequest {
    /// The strings and lists within their bounds ([`bounds`]).
    fn check_bounds(&self) -> ApiResult<()> {
        if let Some(image) = &self.image {
            bounds::text("image", image, bounds::NAME_BYTES)?;
        }
        bounds::count("setup", self.setup.len(), bounds::SETUP_STEPS, "steps")?;
        for (i, step) in self.setup.iter().enumerate() {
            bounds::text(format!("setup[{i}]"), step, bounds::COMMAND_BYTES)?;
        }
        if let Some(d) = &self.dockerfile {
            bounds::text("dockerfile.context", &d.context, bounds::ID_BYTES)?;
            bounds::text("dockerfile.path", &d.path, bounds::PATH_BYTES)?;
            bounds::variables("dockerfile.build_args", &d.build_args)?;
            if let Some(target) = &d.target {
                bounds::text("dockerfile.target", target, bounds::NAME_BYTES)?;
            }
        }
        Ok(())
    }
}

/// The template image of a requested reference: the built-in images, or a registry
/// reference (with or without `registry:`). Host paths and archives are refused.
fn image_reference(image: &str) -> ApiResult<String> {
    let bad = |why: &str| ApiError::field(ErrorKind::Invalid, "image", format!("{image:?}: {why}"));
    let image = image.trim();
    if images::cache::IMAGES.contains(&image) {
        return Ok(image.to_string());
    }
    let reference = image.strip_prefix("registry:").unwrap_or(image);
    if ["oci-archive:", "docker-archive:", "oci:", "rootfs:", "farm:"]
        .iter()
        .any(|p| reference.starts_with(p))
        || reference.starts_with('/')
        || reference.starts_with('.')
        || reference.starts_with('~')
    {
        return Err(bad(
            "only minimal, python and registry references are served here (no host paths or archives)",
        ));
    }
    if reference.is_empty()
        || reference.len() > 512
        || !reference
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-/:@".contains(c))
    {
        return Err(bad(
            "not an image reference (e.g. python:3.12-slim or ghcr.io/org/image:tag)",
        ));
    }
    Ok(format!("registry:{reference}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_name_no_host_path() {
        assert_eq!(image_reference("python").unwrap(), "python");
        assert_eq!(
            image_reference("python:3.12-slim").unwrap(),
            "registry:python:3.12-slim"
        );
        assert_eq!(
            image_reference("registry:ghcr.io/o/i@sha256:ab").unwrap(),
            "registry:ghcr.io/o/i@sha256:ab"
        );
        for bad in [
            "oci-archive:/etc/x.tar",
            "registry:rootfs:/",
            "/srv/image",
            "./image",
            "~/x",
            "farm:python",
            "a b",
            "",
        ] {
            let e = image_reference(bad).unwrap_err();
            assert_eq!(
                (e.kind, e.field.as_deref()),
                (ErrorKind::Invalid, Some("image")),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_same_content_gives_the_same_id() {
        let spec = |image: &str, cpus| Spec {
            source: Source::Image { image: image.into() },
            cpus,
            memory_mib: 512,
            disk_mib: None,
            setup: vec![],
        };
        assert_eq!(spec("python", 1).id(), spec("python", 1).id());
        assert_ne!(spec("python", 1).id(), spec("python", 2).id());
        assert_ne!(spec("python", 1).id(), spec("minimal", 1).id());
        assert!(spec("python", 1).id().starts_with("env-"));
    }
}
