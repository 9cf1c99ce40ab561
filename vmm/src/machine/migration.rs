//! State-only migrations in and out of a machine: what snapshots and forks are made of.
//! Guest RAM stays in the shared memory file (`x-ignore-shared`); only device state travels,
//! through descriptors passed over QMP (never `exec:`, which QEMU's sandbox forbids).

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{io_err, tail, Machine, MachineError};

/// The name the migration channel's descriptor is passed under (QMP `getfd`).
const MIGRATION_FD_NAME: &str = "farm-migration";

impl Machine {
    /// Pauses the guest, then writes its device and CPU state (not its shared RAM) to
    /// `state_path`. The guest stays paused; the disk overlay is flushed.
    pub async fn save_state(&self, state_path: &Path) -> Result<(), MachineError> {
        let file = std::fs::File::create(state_path).map_err(io_err(format!("creating {}", state_path.display())))?;
        self.migrate_out(file.into(), true).await
    }

    /// Pauses the guest and migrates it into `channel` (a file or a socket, passed to QEMU as
    /// a descriptor: QEMU may not spawn `exec:` helpers). With `ignore_shared`, RAM in a
    /// shared memory file stays out of the stream (private RAM is always sent). The guest
    /// stays paused afterwards; `resume` continues it.
    pub async fn migrate_out(&self, channel: OwnedFd, ignore_shared: bool) -> Result<(), MachineError> {
        self.qmp("stop", None).await?;
        self.set_ignore_shared(ignore_shared).await?;
        self.pass_fd(MIGRATION_FD_NAME, channel).await?;
        let uri = format!("fd:{MIGRATION_FD_NAME}");
        self.qmp("migrate", Some(json!({ "uri": uri }))).await?;
        let started = Instant::now();
        loop {
            let info = self.qmp("query-migrate", None).await?;
            match info.get("status").and_then(|s| s.as_str()).unwrap_or("") {
                "completed" => return Ok(()),
                "failed" | "cancelled" => {
                    return Err(MachineError::Migration {
                        what: "out".into(),
                        detail: info
                            .get("error-desc")
                            .map(|d| d.to_string())
                            .unwrap_or_else(|| info.to_string()),
                    })
                }
                _ if started.elapsed() > Duration::from_secs(300) => {
                    return Err(MachineError::Migration {
                        what: "out".into(),
                        detail: "did not finish within 300 s".into(),
                    })
                }
                _ => tokio::time::sleep(Duration::from_millis(2)).await,
            }
        }
    }

    /// Hands QEMU a descriptor under a name (QMP `getfd`).
    pub(super) async fn pass_fd(&self, name: &str, fd: OwnedFd) -> Result<(), MachineError> {
        let mut qmp = self.qmp.lock().await;
        qmp.pass_fd(name, fd).await.map_err(|source| MachineError::Qmp {
            what: "getfd".into(),
            source,
        })
    }

    /// Loads state written by [`Machine::save_state`] into a machine launched with
    /// `incoming = true`, skipping `offset` header bytes, and resumes the guest. A
    /// resettable machine takes its reset point in between, before the guest runs.
    pub async fn load_state(&self, state_path: &Path, offset: u64) -> Result<(), MachineError> {
        use std::io::Seek;
        let mut file = std::fs::File::open(state_path).map_err(io_err(format!("opening {}", state_path.display())))?;
        file.seek(std::io::SeekFrom::Start(offset))
            .map_err(io_err(format!("reading {}", state_path.display())))?;
        self.migrate_in(file.into(), true).await?;
        if self.resettable() {
            self.mark_reset_point().await?;
        }
        self.resume().await
    }

    /// Receives migration state from `channel` (a file positioned at the stream, or a
    /// socket) in a machine launched with `incoming = true`; the guest is left paused.
    pub async fn migrate_in(&self, channel: OwnedFd, ignore_shared: bool) -> Result<(), MachineError> {
        self.set_ignore_shared(ignore_shared).await?;
        self.pass_fd(MIGRATION_FD_NAME, channel).await?;
        let uri = format!("fd:{MIGRATION_FD_NAME}");
        self.qmp("migrate-incoming", Some(json!({ "uri": uri }))).await?;
        let started = Instant::now();
        loop {
            let status = self.qmp("query-status", None).await?;
            let state = status.get("status").and_then(|s| s.as_str()).unwrap_or("").to_string();
            match state.as_str() {
                "inmigrate" if started.elapsed() < Duration::from_secs(300) => {
                    tokio::time::sleep(Duration::from_millis(1)).await
                }
                "inmigrate" => {
                    return Err(MachineError::Migration {
                        what: "in".into(),
                        detail: "did not finish within 300 s".into(),
                    })
                }
                "paused" | "postmigrate" | "prelaunch" | "running" => return Ok(()),
                other => {
                    let migrate = self
                        .qmp("query-migrate", None)
                        .await
                        .map(|v| v.to_string())
                        .unwrap_or_default();
                    return Err(MachineError::Migration {
                        what: "in".into(),
                        detail: format!(
                            "guest state {other:?} after loading; {migrate}; QEMU log: {}",
                            tail(&self.run_dir.path().join("qemu.log"), 5)
                        ),
                    });
                }
            }
        }
    }

    /// Continues a paused guest.
    pub async fn resume(&self) -> Result<(), MachineError> {
        self.qmp("cont", None).await.map(|_| ())
    }

    pub(super) async fn set_ignore_shared(&self, on: bool) -> Result<(), MachineError> {
        self.qmp(IGNORE_SHARED, Some(ignore_shared(on))).await.map(|_| ())
    }
}

/// The QMP command that sets `x-ignore-shared`, and its arguments.
pub(super) const IGNORE_SHARED: &str = "migrate-set-capabilities";

pub(super) fn ignore_shared(on: bool) -> serde_json::Value {
    json!({ "capabilities": [ { "capability": "x-ignore-shared", "state": on } ] })
}
