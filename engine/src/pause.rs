//! Pausing a live fork to disk, and forking it again later (`pause`, `unpause`, which
//! [`crate::session::Session`] drives): its memory, processes, open files and disk as they
//! were.
//!
//! ```text
//! DIR/                 a paused fork's folder (farm serve: out/paused/<session id>/)
//!   fork.json          what the fork was: identity, workspace baseline, place, network
//!   state/             a snapshot of the fork, packed against the snapshot it came from
//!                      (snapshotter::paused: RAM as the differing pages, disk over its disk)
//! ```
//!
//! A fork made from it again keeps the paused fork's identity (hostname, `FARM_FORK_ID`,
//! `FARM_SEED` and its variables) when it resumes the same session, or takes a new one for a
//! branch. Either way its clock is set to the host's time (it jumps by the time spent
//! paused) and its kernel gets fresh entropy, as every fork does.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use farm_protocol::FileEntry;
use serde::{Deserialize, Serialize};
use snapshotter::paused::Packed;
use snapshotter::{ForkIdentity, Forker, Snapshot, SnapshotStore};

use crate::harbor::Place;
use crate::live::{Branch, LiveFork};
use crate::metrics::{Role, VmGauge};

/// Version of `fork.json`.
pub const PAUSED_FORMAT_VERSION: u32 = 1;
const STATE: &str = "state";

/// `fork.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PausedRecord {
    pub format_version: u32,
    /// The snapshot the fork came from (its task's, or the template): the RAM and disk are
    /// stored against it, and it is pinned in the store while the folder exists.
    pub base: String,
    pub fork_id: String,
    pub seed: u64,
    pub env: Vec<(String, String)>,
    /// The workspace as the task left it (artifacts are told apart from it at scoring).
    pub baseline: Vec<FileEntry>,
    pub workdir: String,
    pub user: Option<String>,
    pub place_env: Vec<(String, String)>,
    /// `host:port` entries the fork may reach.
    pub network: Vec<String>,
    pub packed: Packed,
    pub paused_unix: u64,
}

/// Why a fork could not be paused or forked again.
#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    #[error("snapshotting the fork")]
    Snapshot(#[source] snapshotter::BuildError),
    #[error("storing the paused state")]
    Store(#[source] snapshotter::SnapshotError),
    #[error("forking the paused state")]
    Fork(#[source] snapshotter::ForkError),
    #[error("{}: {what}", dir.display())]
    Folder { dir: PathBuf, what: String },
}

/// A paused fork on disk. Shared by whoever needs its state (the paused session, forks made
/// from it); the folder is removed when the last holder drops it.
pub struct PausedFork {
    pub dir: PathBuf,
    pub record: PausedRecord,
    state: Arc<Branch>,
}

impl PausedFork {
    /// Leaves the folder on disk when the last holder drops it (a service stopping: the
    /// next start takes the session up).
    pub fn keep_on_disk(&self) {
        self.state.keep();
    }

    /// Bytes the folder takes on disk (allocated blocks).
    pub fn disk_bytes(&self) -> u64 {
        disk_usage(&self.dir)
    }

    /// Loads the paused fork in `dir` (after a restart). `base` is its base snapshot.
    pub fn load(dir: &Path, base_store: &SnapshotStore) -> Result<PausedFork, PauseError> {
        let folder = |what: String| PauseError::Folder {
            dir: dir.to_path_buf(),
            what,
        };
        let text = std::fs::read_to_string(dir.join("fork.json")).map_err(|e| folder(format!("fork.json: {e}")))?;
        let record: PausedRecord = serde_json::from_str(&text).map_err(|e| folder(format!("fork.json: {e}")))?;
        if record.format_version != PAUSED_FORMAT_VERSION {
            return Err(folder(format!(
                "fork.json has format version {} (this farm reads {PAUSED_FORMAT_VERSION})",
                record.format_version
            )));
        }
        let store = SnapshotStore::new(dir.to_path_buf());
        let snapshot = store.get(STATE).map_err(PauseError::Store)?;
        base_store.get(&record.base).map_err(PauseError::Store)?;
        let state = Arc::new(Branch::holding(
            snapshot,
            store,
            Some(dir.to_path_buf()),
            Some((base_store.clone(), dir.to_path_buf())),
        ));
        Ok(PausedFork {
            dir: dir.to_path_buf(),
            record,
            state,
        })
    }
}

/// Saves `live` into `dir` (which must not exist) and returns it paused, its base pinned in
/// `store`. The VM is left stopped; the caller drops it to free its memory, or resumes it if
/// it keeps it. `base` is the snapshot the fork was opened from.
pub(crate) async fn pause(
    forker: &Forker,
    store: &SnapshotStore,
    live: &LiveFork,
    base: &Arc<Snapshot>,
    dir: &Path,
) -> Result<PausedFork, PauseError> {
    let folder = |what: String| PauseError::Folder {
        dir: dir.to_path_buf(),
        what,
    };
    std::fs::create_dir_all(dir).map_err(|e| folder(format!("creating it: {e}")))?;
    let state_store = SnapshotStore::new(dir.to_path_buf());
    let parent: Snapshot = match live.origin() {
        Some(b) => b.snapshot.clone(),
        None => (**base).clone(),
    };
    let mut snapshot = snapshotter::snapshot_fork(
        &state_store,
        forker,
        &parent,
        &live.fork,
        "paused",
        Some(STATE.into()),
        false,
    )
    .await
    .map_err(PauseError::Snapshot)?;
    let packed = {
        let base = (**base).clone();
        tokio::task::spawn_blocking(move || snapshotter::paused::pack(&mut snapshot, &base).map(|p| (p, snapshot)))
            .await
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()))
            .map_err(PauseError::Store)?
    };
    let (packed, snapshot) = packed;
    let identity = &live.fork.identity;
    let place = live.place.clone();
    let record = PausedRecord {
        format_version: PAUSED_FORMAT_VERSION,
        base: base.id().to_string(),
        fork_id: identity.fork_id.clone(),
        seed: identity.seed,
        env: identity.env.clone(),
        baseline: live.baseline().to_vec(),
        workdir: place.workdir,
        user: place.user,
        place_env: place.env,
        network: live.fork.machine.network().allow,
        packed,
        paused_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    };
    let tmp = dir.join("fork.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&record).expect("records serialize"))
        .map_err(|e| folder(format!("writing fork.json: {e}")))?;
    std::fs::rename(&tmp, dir.join("fork.json")).map_err(|e| folder(format!("writing fork.json: {e}")))?;
    store.pin(base.id(), dir).map_err(PauseError::Store)?;
    let state = Arc::new(Branch::holding(
        snapshot,
        state_store,
        Some(dir.to_path_buf()),
        Some((store.clone(), dir.to_path_buf())),
    ));
    Ok(PausedFork {
        dir: dir.to_path_buf(),
        record,
        state,
    })
}

/// A running fork of a paused one, made by `forker` (its base in `store`): with its own
/// identity again (`identity` None: the same session resumes) or a new one (a branch),
/// reaching what `network` allows (its CA installed again: after a restart it is new). The
/// paused folder stays while the fork (or anything branched from it) lives.
pub(crate) async fn unpause(
    forker: &Forker,
    store: &SnapshotStore,
    paused: &Arc<PausedFork>,
    identity: Option<ForkIdentity>,
    role: Role,
    network: &egress::Policy,
) -> Result<LiveFork, PauseError> {
    let record = &paused.record;
    let base = store.get(&record.base).map_err(PauseError::Store)?;
    let snapshot = paused.state.snapshot.clone();
    {
        let (snapshot, base) = (snapshot.clone(), base.clone());
        tokio::task::spawn_blocking(move || snapshotter::paused::rebuild_memory(&snapshot, &base))
            .await
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()))
            .map_err(PauseError::Store)?;
    }
    let identity = identity.unwrap_or(ForkIdentity {
        fork_id: record.fork_id.clone(),
        seed: record.seed,
        env: record.env.clone(),
    });
    let fork = forker.fork(&snapshot, identity).await;
    // The fork maps the RAM file: the rebuilt copy is not needed on disk any more.
    let _ = std::fs::remove_file(snapshot.memory_path());
    let fork = fork.map_err(PauseError::Fork)?;
    crate::live::install_ca(&fork, network)
        .await
        .map_err(|what| PauseError::Folder {
            dir: paused.dir.clone(),
            what: crate::engine::describe(&what),
        })?;
    fork.machine.set_network(network.clone());
    let place = Place {
        workdir: record.workdir.clone(),
        user: record.user.clone(),
        env: record.place_env.clone(),
    };
    Ok(LiveFork::from_parts(
        fork,
        Arc::new(record.baseline.clone()),
        Some(paused.state.clone()),
        place,
        VmGauge::new(role),
    ))
}

/// Allocated bytes of the files under `dir`.
pub fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    for entry in entries.flatten() {
        match entry.metadata() {
            Ok(m) if m.is_dir() => total += disk_usage(&entry.path()),
            Ok(m) => total += m.blocks() * 512,
            Err(_) => {}
        }
    }
    total
}
