//! Which way a template is built: from an image ([`crate::build`]), or from a Dockerfile
//! ([`crate::dockerfile`], each step a snapshot), then the template's own files, setup and
//! the caller's extras as one more content-addressed child snapshot.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::build::{build_image_template, provision, BuildError, Built, TemplateExtras};
use crate::dockerfile::DockerfileError;
use crate::fork::Forker;
use crate::store::SnapshotStore;
use crate::template::{hex, TemplateConfig};

/// Builds (or reuses) the snapshot of a template. `base_dir` is where the template's file
/// paths are relative to. `progress` receives one line per step.
pub async fn build_template(
    store: &SnapshotStore,
    forker: &Forker,
    template: &TemplateConfig,
    base_dir: &Path,
    label: &str,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Built, TemplateError> {
    build_template_with(
        store,
        forker,
        template,
        base_dir,
        label,
        &TemplateExtras::default(),
        progress,
    )
    .await
}

/// Why a template could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("building the template's Dockerfile failed")]
    Dockerfile(#[source] Box<DockerfileError>),
}

impl From<crate::template::TemplateConfigError> for TemplateError {
    fn from(e: crate::template::TemplateConfigError) -> TemplateError {
        TemplateError::Build(e.into())
    }
}

impl From<crate::fork::ForkError> for TemplateError {
    fn from(e: crate::fork::ForkError) -> TemplateError {
        TemplateError::Build(e.into())
    }
}

/// [`build_template`] with `extras` added after the template's own files and setup.
pub async fn build_template_with(
    store: &SnapshotStore,
    forker: &Forker,
    template: &TemplateConfig,
    base_dir: &Path,
    label: &str,
    extras: &TemplateExtras,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Built, TemplateError> {
    template.validate(base_dir)?;
    match &template.dockerfile {
        Some(dockerfile) => {
            from_dockerfile(
                store,
                forker,
                template,
                &base_dir.join(dockerfile),
                base_dir,
                label,
                extras,
                progress,
            )
            .await
        }
        None => Ok(build_image_template(store, forker, template, base_dir, label, extras, progress).await?),
    }
}

/// A template whose image a Dockerfile builds: the build (each step a child snapshot), then
/// the template's own files, setup and the extras as one more content-addressed child.
#[allow(clippy::too_many_arguments)]
async fn from_dockerfile(
    store: &SnapshotStore,
    forker: &Forker,
    template: &TemplateConfig,
    dockerfile: &Path,
    base_dir: &Path,
    label: &str,
    extras: &TemplateExtras,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Built, TemplateError> {
    let context = template
        .context
        .as_ref()
        .map(|c| base_dir.join(c))
        .unwrap_or_else(|| dockerfile.parent().unwrap_or(Path::new(".")).to_path_buf());
    let spec = crate::dockerfile::DockerfileBuild {
        dockerfile,
        context: &context,
        build_args: &template.build_args,
        target: template.target.as_deref(),
        template,
        label,
    };
    let image = crate::dockerfile::build(store, forker, &spec, progress)
        .await
        .map_err(|e| TemplateError::Dockerfile(Box::new(e)))?;
    let mut h = Sha256::new();
    h.update(template.digest(base_dir)?.as_bytes());
    h.update(serde_json::to_vec(extras).expect("extras serialize"));
    let id = crate::child::child_id(&image.snapshot, hex(&h.finalize()).as_bytes());
    let pulled = image.pulled.last().cloned();
    if let Ok(existing) = store.get(&id) {
        if existing.check_files().is_ok() {
            return Ok(Built {
                snapshot: existing,
                reused: true,
                pulled,
                images: image.pulled,
                image_config: Some(image.config),
            });
        }
    }
    let fork = forker.build_fork(store, &image.snapshot, label).await?;
    provision(&fork.machine, template, base_dir, &image.config, extras, progress).await?;
    progress("quiescing and snapshotting");
    let snapshot = fork.commit(store, forker, &image.snapshot, label, &id).await?;
    Ok(Built {
        snapshot,
        reused: false,
        pulled,
        images: image.pulled,
        image_config: Some(image.config),
    })
}
