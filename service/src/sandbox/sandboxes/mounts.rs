//! A sandbox's workspaces ([`crate::workspaces`]): mounted when it is made (the holds taken
//! before its VM is, and given back if it never comes to be), synced on request and before
//! a delete, and let go when it ends, however it ends.

use super::{SandboxId, Sandboxes};
use crate::error::{ApiError, ApiResult, ErrorKind};
use crate::wire::workspaces::WorkspacesSynced;
use crate::workspaces::{Mode, MountRequest, Mounted, Workspaces};

/// Holds a new sandbox took on its workspaces: given back when dropped unless kept.
pub(super) struct Claimed<'a> {
    workspaces: &'a Workspaces,
    fork: String,
    pub mounts: Vec<(Mounted, Vec<u8>)>,
    kept: bool,
}

impl Claimed<'_> {
    /// The sandbox came to be: its holds are its own now.
    pub fn keep(mut self) -> Vec<Mounted> {
        self.kept = true;
        std::mem::take(&mut self.mounts).into_iter().map(|(m, _)| m).collect()
    }
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.workspaces.release(&self.fork, self.mounts.iter().map(|(m, _)| m));
        }
    }
}

impl Sandboxes {
    /// Takes the holds `mounts` ask for, for the sandbox `fork` of `owner`.
    pub(super) fn claim_workspaces(
        &self,
        owner: tenants::TenantId,
        fork: &str,
        mounts: &[MountRequest],
    ) -> ApiResult<Claimed<'_>> {
        Ok(Claimed {
            workspaces: &self.workspaces,
            fork: fork.to_string(),
            mounts: self.workspaces.claim(owner, fork, mounts)?,
            kept: false,
        })
    }

    /// Writes each claimed workspace into the new VM at its path.
    pub(super) async fn mount(&self, run: &engine::session::Session, claimed: &Claimed<'_>) -> ApiResult<()> {
        if claimed.mounts.is_empty() {
            return Ok(());
        }
        let guest = run
            .guest()
            .map_err(|e| ApiError::new(ErrorKind::Internal, format!("mounting workspaces: {e}")))?;
        for (mount, bytes) in &claimed.mounts {
            let archive = if bytes.is_empty() {
                crate::workspaces::empty_archive()
            } else {
                bytes.clone()
            };
            guest.write_folder(&mount.path, archive).await.map_err(|e| {
                ApiError::new(
                    ErrorKind::GuestFailed,
                    format!("mounting workspace {:?} at {}: {e}", mount.name, mount.path),
                )
            })?;
        }
        Ok(())
    }

    /// `POST /v1/sandboxes/{id}/workspaces/sync`: each workspace it holds writable, read from
    /// its guest and installed, unless it was fenced (409: its writes are refused).
    pub async fn sync_workspaces(&self, id: &SandboxId) -> ApiResult<WorkspacesSynced> {
        let mounts: Vec<Mounted> = {
            let sandbox = self.get(id)?;
            let open = sandbox.lock().await;
            open.sandbox().mounts.clone()
        };
        let writable: Vec<&Mounted> = mounts.iter().filter(|m| m.mode == Mode::Writable).collect();
        if writable.is_empty() {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!("sandbox {id} holds no workspace writable"),
            ));
        }
        let _in_use = self.begin(id);
        let guest = self.guest(id).await?;
        let _turn = self.workspaces.syncs.acquire().await.expect("the semaphore stays open");
        let mut synced = Vec::new();
        for mount in writable {
            let archive = match guest.read_folder(&mount.path).await {
                Ok(archive) => archive,
                Err(e) => return Err(self.guest_error(id, &guest, e, Some(&mount.path)).await),
            };
            // Checked, written and fsynced off the runtime's workers.
            let (workspaces, fork, mount) = (self.workspaces.clone(), id.to_string(), mount.clone());
            let committed = tokio::task::spawn_blocking(move || workspaces.commit(&fork, &mount, archive)).await;
            synced.push(committed.map_err(|e| ApiError::new(ErrorKind::Internal, format!("syncing: {e}")))??);
        }
        Ok(WorkspacesSynced { workspaces: synced })
    }

    /// After a restart took it up, its first resume writes each of its workspaces into the
    /// guest as last synced, replacing the guest's copy (as of its checkpoint, or gone): what
    /// a sync acknowledged is what it finds.
    pub(super) async fn remount(&self, id: &str, guest: &engine::guest::Guest, mounts: &[Mounted]) -> ApiResult<()> {
        for mount in mounts {
            let archive = match self.workspaces.archive(mount)? {
                bytes if bytes.is_empty() => crate::workspaces::empty_archive(),
                bytes => bytes,
            };
            guest.replace_folder(&mount.path, archive).await.map_err(|e| {
                ApiError::new(
                    ErrorKind::GuestFailed,
                    format!(
                        "sandbox {id}: writing workspace {:?} again at {}: {e}",
                        mount.name, mount.path
                    ),
                )
            })?;
        }
        Ok(())
    }

    /// What a sandbox taken up by a restart must have written again at its next resume: none
    /// when it was paused (its guest's copies are exactly as it left them, and as a holder
    /// nothing synced since); every mount when it has no checkpoint (its guest is its
    /// environment again); else each writable mount synced after its checkpoint (the guest's
    /// copy is older than what was acknowledged; one not synced since holds more than the
    /// last sync, and stays).
    pub(super) fn stale_mounts(&self, part: &crate::record::SandboxPart, checkpoint_ms: Option<u64>) -> Vec<Mounted> {
        if part.paused {
            return Vec::new();
        }
        let Some(at) = checkpoint_ms else {
            return part.mounts.clone();
        };
        part.mounts
            .iter()
            .filter(|m| m.mode == Mode::Writable && self.workspaces.synced_ms(&m.id).is_some_and(|s| s > at))
            .cloned()
            .collect()
    }

    /// Whether a live sandbox holds a workspace writable.
    pub(super) async fn holds_workspaces(&self, id: &str) -> bool {
        let Ok(sandbox) = self.get(id) else { return false };
        let open = sandbox.lock().await;
        open.run.live().is_ok() && open.sandbox().mounts.iter().any(|m| m.mode == Mode::Writable)
    }

    /// Lets go of the writable holds of a sandbox that ended.
    pub(super) fn release_workspaces(&self, id: &str, mounts: &[Mounted]) {
        self.workspaces.release(id, mounts);
    }
}
