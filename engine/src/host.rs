//! The host core: what every front-end stands on before any suite, and what suites share.
//! It owns the forker (QEMU settings of this host, as the operator chose them), the snapshot
//! store, template builds and warm pools. A suite's [`crate::Engine`] is built on one
//! ([`crate::Engine::start`]); the sandbox API uses one alone: its environments are
//! templates built here, its sandboxes forks opened here ([`Host::open_sandbox`]).
//!
//! Templates are built in one place ([`Host::build_template`]: a suite's, a Harbor task's
//! environment, a sandbox environment), and warm pools start in one place
//! ([`Host::start_pool`]).

use std::path::Path;
use std::sync::Arc;

use snapshotter::{Built, Forker, Snapshot, SnapshotStore, TemplateConfig, TemplateError, TemplateExtras, WarmPool};
use vmm::VmSettings;

use vmm::AccelSetting;

/// Why the engine could not start or prepare.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("setting up QEMU")]
    Machine(#[from] vmm::MachineError),
    #[error("building the suite's template")]
    Template(#[source] snapshotter::TemplateError),
    #[error("starting the warm pool")]
    Pool(#[source] snapshotter::ForkError),
    #[error("a task snapshot build panicked")]
    Panicked,
    #[error(transparent)]
    Egress(egress::rules::ResolveError),
}

/// How this host runs VMs, as the operator chose.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostChoices {
    pub accel: AccelSetting,
    /// Same-page merging of QEMU's memory (checked by the caller against the host).
    pub ksm: vmm::Ksm,
}

impl From<AccelSetting> for HostChoices {
    fn from(accel: AccelSetting) -> HostChoices {
        HostChoices {
            accel,
            ksm: vmm::Ksm::Off,
        }
    }
}

/// This host's forker and snapshot store.
pub struct Host {
    /// Forks without a disk limit of their own (each user sets its own).
    pub forker: Forker,
    pub store: SnapshotStore,
    pub choices: HostChoices,
}

impl Host {
    /// Detects the accelerator (KVM where it runs stock guests, else TCG) and readies the
    /// forker; the store is the default one (`FARM_SNAPSHOT_DIR`, else the cache's).
    pub fn start(choices: impl Into<HostChoices>) -> Result<Arc<Host>, EngineError> {
        let choices = choices.into();
        let mut vm = VmSettings::detect(choices.accel)?;
        vm.ksm = choices.ksm;
        Ok(Arc::new(Host {
            forker: Forker::new(vm)?,
            store: SnapshotStore::default_location(),
            choices,
        }))
    }

    /// The forker, with forks' disk overlays stopped past `max_disk_bytes`.
    pub fn forker_limited(&self, max_disk_bytes: Option<u64>) -> Forker {
        Forker {
            max_disk_bytes,
            ..self.forker.clone()
        }
    }

    /// Builds a template snapshot into the store, or reuses the one with the same content.
    pub async fn build_template(
        &self,
        template: &TemplateConfig,
        base_dir: &Path,
        label: &str,
        extras: &TemplateExtras,
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<Built, TemplateError> {
        snapshotter::build_template_with(&self.store, &self.forker, template, base_dir, label, extras, progress).await
    }

    /// Forks of `snapshot` kept resumed and warm (made by `forker`, as many as `size` says),
    /// each having run `warm_up` once.
    pub fn start_pool(
        &self,
        forker: Forker,
        snapshot: &Snapshot,
        size: snapshotter::PoolSize,
        warm_up: snapshotter::WarmUp,
    ) -> Result<WarmPool, snapshotter::ForkError> {
        WarmPool::start_sized(forker, snapshot.clone(), size, snapshotter::PoolMode::Resumed, warm_up)
    }
}
