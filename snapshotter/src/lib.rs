//! Snapshots and forks: boot once, fork many.
//!
//! Data flows: a [`template::TemplateConfig`] is built by [`build::build_template`] into a
//! snapshot directory in the [`store::SnapshotStore`] (content-addressed: the same inputs
//! reuse the same snapshot). [`fork::Forker`] starts forks of a snapshot (copy-on-write RAM
//! and disk, fresh identity); [`pool::WarmPool`] keeps QEMUs waiting so forks skip process
//! start. [`build::snapshot_fork`] turns a running fork into a child snapshot (per-task
//! snapshots, mid-trajectory branches); [`child::child_snapshot`] makes content-addressed
//! children of a template with files and setup (per-task snapshots). The state file format
//! is in [`statefile`].
#![forbid(unsafe_code)]

// The checkout this crate is built in (`.cargo/config.toml`): its build is never another clone's.
const _: Option<&str> = option_env!("FARM_CHECKOUT");

pub mod build;
pub mod build_fork;
pub mod child;
pub mod dockerfile;
pub mod fork;
pub mod paused;
pub mod pool;
pub mod start;
pub mod statefile;
pub mod store;
pub mod template;
pub mod templates;

pub use build::{snapshot_fork, BuildError, Built, TemplateExtras};
pub use build_fork::BuildFork;
pub use child::{child_snapshot, ChildError, ChildSpec};
pub use fork::{boot_from_disk, BootFromDiskError, Fork, ForkError, ForkIdentity, Forker, Start};
pub use pool::{PoolCounts, PoolMode, PoolSize, WarmPool, WarmUp, DEMAND_WINDOW};
pub use store::{HostProfile, Snapshot, SnapshotError, SnapshotStore};
pub use template::{Network, TemplateConfig};
pub use templates::{build_template, build_template_with, TemplateError};
