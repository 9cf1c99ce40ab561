//! Workspaces: named volumes of a tenant (`POST /v1/workspaces`) that outlive every sandbox,
//! mounted at a path when a sandbox is made, writable by one holder at a time and readable
//! by any number.
//!
//! A workspace's bytes are a tar archive on the host (`OUT/workspaces/<id>/data.tar`), kept
//! as data: never unpacked on the host. A mount writes it into the guest at its path; a
//! **sync** (`POST /v1/sandboxes/{id}/workspaces/sync`, and a delete of the holder) reads the
//! folder back from the guest, checks it (plain relative paths, regular files, folders and
//! links that stay inside, within the workspace's size) and installs it, **only if the sandbox
//! still holds the workspace in its generation**: each new writable holder takes the next
//! generation, so once a lost holder is fenced (`POST /v1/workspaces/{name}/fence`, or its
//! sandbox ended or died) and another took the workspace, the old one's syncs are refused at
//! the host, whatever its guest does. A write is acknowledged when a sync that carried it
//! answers; nothing acknowledged is lost by a holder's death or a restart.
//!
//! A read-only mount and a branch's copy of a writable mount are the guest's own from then
//! on: their writes never reach the workspace.

mod archive;
mod calls;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tenants::{Claim, TenantId, WorkspaceRow};
use utoipa::ToSchema;

use crate::bounds;
use crate::error::{ApiError, ApiResult, ErrorKind};
use crate::wire::workspaces::{MountView, WorkspaceList, WorkspaceView};

/// The most a workspace may hold (what one folder read from a guest may be).
pub const MAX_SIZE_MIB: u64 = engine::guest::MAX_FOLDER_BYTES >> 20;
/// The most workspaces one sandbox mounts.
pub const MAX_MOUNTS: usize = 8;
/// The most one sandbox's mounts may hold together, MiB (what a create reads to write them).
pub const MAX_MOUNTED_MIB: u64 = 512;
/// The most workspaces a tenant has.
pub const MAX_PER_TENANT: usize = 64;

/// `POST /v1/workspaces`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceRequest {
    /// Letters, digits, `-`, `_` and `.`; unique among the tenant's workspaces.
    pub name: String,
    /// The most it may hold, 1-256 MiB.
    pub size_mib: u64,
    /// Removed this many days after its last use (1-3650; default: kept until deleted).
    pub keep_days: Option<u64>,
}

/// A workspace a new sandbox mounts (`"workspaces": [...]` of `POST /v1/sandboxes`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MountRequest {
    pub name: String,
    /// An absolute guest path (made if need be).
    pub path: String,
    /// A copy to read: its writes stay in the sandbox (default: writable, which takes the
    /// workspace's one writable hold).
    #[serde(default)]
    pub read_only: bool,
}

/// How a sandbox has a workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// It holds the workspace, in a generation: its syncs are the workspace's.
    Writable,
    ReadOnly,
    /// A branch's copy of its parent's writable mount.
    Copy,
}

/// A workspace mounted in a sandbox (kept with the sandbox, and in its restart record).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mounted {
    pub id: String,
    pub name: String,
    pub path: String,
    pub mode: Mode,
    pub generation: u64,
}

impl Mounted {
    pub fn view(&self) -> MountView {
        MountView {
            name: self.name.clone(),
            path: self.path.clone(),
            mode: match self.mode {
                Mode::Writable => "writable",
                Mode::ReadOnly => "read_only",
                Mode::Copy => "copy",
            }
            .into(),
            generation: self.generation,
        }
    }

    /// What a branch of the sandbox has of it: never the writable original.
    pub fn for_branch(&self) -> Mounted {
        let mode = match self.mode {
            Mode::Writable => Mode::Copy,
            other => other,
        };
        Mounted { mode, ..self.clone() }
    }
}

/// Checks a sandbox request's mounts (names, paths, how many, one path each).
pub fn check_mounts(mounts: &[MountRequest]) -> ApiResult<()> {
    bounds::range("workspaces", mounts.len() as u64, (0, MAX_MOUNTS as u64), "mounts")?;
    for (i, mount) in mounts.iter().enumerate() {
        check_name(&format!("workspaces[{i}].name"), &mount.name)?;
        let field = format!("workspaces[{i}].path");
        bounds::text(&field, &mount.path, bounds::PATH_BYTES)?;
        let plain =
            mount.path.starts_with('/') && mount.path.len() > 1 && mount.path.split('/').all(|c| c != ".." && c != ".");
        if !plain {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                field,
                "must be an absolute guest path other than / (no . or ..)",
            ));
        }
        if mounts[..i].iter().any(|m| m.path == mount.path || m.name == mount.name) {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                field,
                "each workspace once, each at its own path",
            ));
        }
    }
    Ok(())
}

fn check_name(field: &str, name: &str) -> ApiResult<()> {
    let ok = (1..=64).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && !name.starts_with('.');
    match ok {
        true => Ok(()),
        false => Err(ApiError::field(
            ErrorKind::Invalid,
            field,
            format!("{name:?} is not a workspace name (1-64 letters, digits, -, _ and ., not starting with .)"),
        )),
    }
}

fn db_error(e: tenants::Error) -> ApiError {
    ApiError::new(ErrorKind::Internal, format!("the tenants database: {e}"))
}

fn view(row: &WorkspaceRow) -> WorkspaceView {
    WorkspaceView {
        name: row.name.clone(),
        id: row.id.clone(),
        size_mib: row.size_mib,
        bytes: row.bytes,
        generation: row.generation,
        holder: row.holder.clone(),
        created_at_ms: row.created_ms,
        synced_at_ms: row.synced_ms,
        keep_days: row.keep_days,
    }
}

/// The service's workspaces: their rows in the tenants database, their bytes under `root`.
pub struct Workspaces {
    tenancy: Arc<crate::tenancy::Tenancy>,
    root: PathBuf,
    /// Held across a sync's staging and install: one at a time, so two syncs of a workspace
    /// (an explicit one and a delete's) never interleave.
    installing: std::sync::Mutex<()>,
    /// Syncs reading a guest's folder at once (each up to 256 MiB in memory).
    pub syncs: tokio::sync::Semaphore,
}

impl Workspaces {
    pub fn open(tenancy: Arc<crate::tenancy::Tenancy>, root: &Path) -> anyhow::Result<Workspaces> {
        std::fs::create_dir_all(root)?;
        Ok(Workspaces {
            tenancy,
            root: root.to_path_buf(),
            installing: std::sync::Mutex::new(()),
            syncs: tokio::sync::Semaphore::new(2),
        })
    }

    fn data(&self, id: &str) -> PathBuf {
        self.root.join(id).join("data.tar")
    }

    /// The caller's workspace `name`; another tenant's is the same 404 as none.
    fn mine(&self, tenant: TenantId, name: &str, field: &str) -> ApiResult<WorkspaceRow> {
        check_name(field, name)?;
        self.tenancy
            .db
            .workspace(tenant, name)
            .map_err(db_error)?
            .ok_or_else(|| ApiError::field(ErrorKind::NotFound, field, format!("no workspace {name:?}")))
    }

    /// `POST /v1/workspaces`.
    pub fn create(&self, tenant: TenantId, request: WorkspaceRequest) -> ApiResult<WorkspaceView> {
        check_name("name", &request.name)?;
        bounds::range("size_mib", request.size_mib, (1, MAX_SIZE_MIB), "MiB")?;
        if let Some(days) = request.keep_days {
            bounds::range("keep_days", days, (1, 3650), "days")?;
        }
        if self.tenancy.db.workspaces(Some(tenant)).map_err(db_error)?.len() >= MAX_PER_TENANT {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                "name",
                format!("a tenant has at most {MAX_PER_TENANT} workspaces: delete one first"),
            ));
        }
        let now = tenants::now_ms();
        let row = WorkspaceRow {
            id: crate::ids::new_id("ws"),
            tenant,
            name: request.name.clone(),
            size_mib: request.size_mib,
            keep_days: request.keep_days,
            created_ms: now,
            used_ms: now,
            generation: 0,
            holder: None,
            bytes: 0,
            synced_ms: None,
        };
        std::fs::create_dir_all(self.root.join(&row.id))
            .map_err(|e| ApiError::new(ErrorKind::Internal, format!("making the workspace's folder: {e}")))?;
        if !self.tenancy.db.workspace_add(&row).map_err(db_error)? {
            let _ = std::fs::remove_dir_all(self.root.join(&row.id));
            return Err(ApiError::field(
                ErrorKind::Conflict,
                "name",
                format!("a workspace {:?} exists already", request.name),
            ));
        }
        tracing::info!(workspace = %row.id, name = %row.name, "workspace made");
        Ok(view(&row))
    }

    pub fn get(&self, tenant: TenantId, name: &str) -> ApiResult<WorkspaceView> {
        Ok(view(&self.mine(tenant, name, "name")?))
    }

    pub fn list(&self, tenant: TenantId) -> ApiResult<WorkspaceList> {
        let rows = self.tenancy.db.workspaces(Some(tenant)).map_err(db_error)?;
        Ok(WorkspaceList {
            workspaces: rows.iter().map(view).collect(),
        })
    }

    /// `DELETE /v1/workspaces/{name}`: not while a sandbox holds it writable.
    pub fn delete(&self, tenant: TenantId, name: &str) -> ApiResult<()> {
        let row = self.mine(tenant, name, "name")?;
        if !self.tenancy.db.workspace_remove(&row.id).map_err(db_error)? {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!(
                    "workspace {name:?} is held writable by {}: delete that sandbox, or fence it first",
                    row.holder.as_deref().unwrap_or("a sandbox")
                ),
            ));
        }
        let _ = std::fs::remove_dir_all(self.root.join(&row.id));
        Ok(())
    }

    /// `POST /v1/workspaces/{name}/fence`: takes the workspace from its holder (one that is
    /// lost, or that should stop): that holder's later syncs are refused, and the next
    /// writable mount takes the next generation.
    pub fn fence(&self, tenant: TenantId, name: &str) -> ApiResult<WorkspaceView> {
        let row = self.mine(tenant, name, "name")?;
        let held = self.tenancy.db.workspace_fence(&row.id).map_err(db_error)?;
        tracing::warn!(workspace = %row.id, holder = ?held, generation = row.generation, "workspace fenced");
        self.get(tenant, name)
    }

    /// Takes the holds a new sandbox's mounts ask for (writable ones, each in its next
    /// generation), all or none; with the bytes to write into its guest.
    pub fn claim(&self, tenant: TenantId, fork: &str, mounts: &[MountRequest]) -> ApiResult<Vec<(Mounted, Vec<u8>)>> {
        let mut taken: Vec<(Mounted, Vec<u8>)> = Vec::new();
        let mut mounted_mib = 0;
        let fail = |taken: &[(Mounted, Vec<u8>)], e: ApiError| {
            self.release(fork, taken.iter().map(|(m, _)| m));
            Err(e)
        };
        for (i, mount) in mounts.iter().enumerate() {
            let row = match self.mine(tenant, &mount.name, &format!("workspaces[{i}].name")) {
                Ok(row) => row,
                Err(e) => return fail(&taken, e),
            };
            mounted_mib += row.size_mib;
            if mounted_mib > MAX_MOUNTED_MIB {
                let e = ApiError::field(
                    ErrorKind::Invalid,
                    "workspaces",
                    format!("a sandbox mounts workspaces of at most {MAX_MOUNTED_MIB} MiB together"),
                );
                return fail(&taken, e);
            }
            let (mode, generation) = match mount.read_only {
                true => (Mode::ReadOnly, row.generation),
                false => match self.tenancy.db.workspace_claim(&row.id, fork, tenants::now_ms()) {
                    Ok(Claim::Held(generation)) => (Mode::Writable, generation),
                    Ok(Claim::HeldBy(holder)) => {
                        let e = ApiError::field(
                            ErrorKind::Conflict,
                            format!("workspaces[{i}].name"),
                            format!(
                                "workspace {:?} is held writable by {holder}: mount it read_only, or fence a holder that is lost (POST /v1/workspaces/{}/fence)",
                                mount.name, mount.name
                            ),
                        );
                        return fail(&taken, e);
                    }
                    Ok(Claim::Missing) => {
                        let e = ApiError::field(
                            ErrorKind::NotFound,
                            format!("workspaces[{i}].name"),
                            format!("no workspace {:?}", mount.name),
                        );
                        return fail(&taken, e);
                    }
                    Err(e) => return fail(&taken, db_error(e)),
                },
            };
            let bytes = match std::fs::read(self.data(&row.id)) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => {
                    let e = ApiError::new(ErrorKind::Internal, format!("reading workspace {}: {e}", mount.name));
                    taken.push((
                        Mounted {
                            id: row.id,
                            name: mount.name.clone(),
                            path: mount.path.clone(),
                            mode,
                            generation,
                        },
                        Vec::new(),
                    ));
                    return fail(&taken, e);
                }
            };
            let mounted = Mounted {
                id: row.id,
                name: mount.name.clone(),
                path: mount.path.clone(),
                mode,
                generation,
            };
            taken.push((mounted, bytes));
        }
        Ok(taken)
    }

    /// Lets go of the writable holds among `mounts` that `fork` still has.
    pub fn release<'a>(&self, fork: &str, mounts: impl IntoIterator<Item = &'a Mounted>) {
        for mount in mounts.into_iter().filter(|m| m.mode == Mode::Writable) {
            match self
                .tenancy
                .db
                .workspace_release(&mount.id, fork, mount.generation, tenants::now_ms())
            {
                Ok(true) => tracing::info!(workspace = %mount.id, sandbox = %fork, "workspace let go"),
                Ok(false) => {}
                Err(e) => tracing::error!(workspace = %mount.id, "letting go of it: {e}"),
            }
        }
    }

    /// A sync of `fork`'s mount: `archive` (the guest's folder, as tar) checked and installed
    /// if `fork` still holds the workspace in the mount's generation; the workspace after.
    pub fn commit(&self, fork: &str, mount: &Mounted, archive: Vec<u8>) -> ApiResult<WorkspaceView> {
        let refused = |why: String| ApiError::field(ErrorKind::Conflict, "workspace", why);
        if mount.mode != Mode::Writable {
            return Err(refused(format!(
                "workspace {:?} is {} here: its writes never reach the workspace",
                mount.name,
                if mount.mode == Mode::Copy {
                    "a branch's copy"
                } else {
                    "read-only"
                }
            )));
        }
        let row = self
            .tenancy
            .db
            .workspace_by_id(&mount.id)
            .map_err(db_error)?
            .ok_or_else(|| refused(format!("workspace {:?} was deleted", mount.name)))?;
        let archive = archive::clean(&archive, row.size_mib << 20).map_err(|why| {
            ApiError::field(
                ErrorKind::Invalid,
                "workspace",
                format!("workspace {:?}: {why}", mount.name),
            )
        })?;
        let data = self.data(&mount.id);
        let staged = data.with_extension(format!("{}.tmp", crate::ids::random_hex()));
        let _installing = self.installing.lock().unwrap_or_else(|p| p.into_inner());
        write_synced(&staged, &archive)
            .map_err(|e| ApiError::new(ErrorKind::Internal, format!("writing workspace {:?}: {e}", mount.name)))?;
        let installed = self.tenancy.db.workspace_commit(
            &mount.id,
            fork,
            mount.generation,
            archive.len() as u64,
            tenants::now_ms(),
            || {
                std::fs::rename(&staged, &data)?;
                // The rename itself made durable before the sync is acknowledged.
                std::fs::File::open(self.root.join(&mount.id))?.sync_all()
            },
        );
        let installed = installed.map_err(db_error);
        if !matches!(installed, Ok(true)) {
            let _ = std::fs::remove_file(&staged);
        }
        if !installed? {
            tracing::warn!(workspace = %mount.id, sandbox = %fork, generation = mount.generation, "a fenced holder's sync refused");
            return Err(refused(format!(
                "workspace {:?} was taken from this sandbox (generation {} is fenced): its writes are refused",
                mount.name, mount.generation
            )));
        }
        Ok(view(
            &self
                .tenancy
                .db
                .workspace_by_id(&mount.id)
                .map_err(db_error)?
                .unwrap_or(row),
        ))
    }

    /// When workspace `id` last took a sync.
    pub fn synced_ms(&self, id: &str) -> Option<u64> {
        self.tenancy.db.workspace_by_id(id).ok().flatten()?.synced_ms
    }

    /// A mount's workspace as last synced (empty: never synced).
    pub fn archive(&self, mount: &Mounted) -> ApiResult<Vec<u8>> {
        match std::fs::read(self.data(&mount.id)) {
            Ok(bytes) => Ok(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(ApiError::new(
                ErrorKind::Internal,
                format!("reading workspace {}: {e}", mount.name),
            )),
        }
    }

    /// What `tenant`'s workspaces take of its disk: each its whole size, reserved when made.
    pub fn disk_usage(&self, tenant: TenantId) -> u64 {
        let rows = self.tenancy.db.workspaces(Some(tenant)).unwrap_or_default();
        rows.iter().map(|r| (r.size_mib << 20).max(r.bytes)).sum()
    }

    /// Lets go of writable holds whose sandbox is not among `live` (a crash between a hold and
    /// its sandbox's first record): after a restart took up every sandbox it could.
    pub fn release_orphans(&self, live: &std::collections::HashSet<String>) {
        for row in self.tenancy.db.workspaces(None).unwrap_or_default() {
            if let Some(holder) = row.holder.filter(|h| !live.contains(h)) {
                let _ = self
                    .tenancy
                    .db
                    .workspace_release(&row.id, &holder, row.generation, tenants::now_ms());
                tracing::warn!(workspace = %row.id, holder = %holder, "a hold of a sandbox that is gone, let go");
            }
        }
    }

    /// Removes workspaces past their retention that no one holds.
    pub fn expire(&self) {
        let now = tenants::now_ms();
        for row in self.tenancy.db.workspaces(None).unwrap_or_default() {
            let Some(days) = row.keep_days else { continue };
            if row.holder.is_none() && now.saturating_sub(row.used_ms) > days * 24 * 3600 * 1000 {
                if let Ok(true) = self.tenancy.db.workspace_remove(&row.id) {
                    let _ = std::fs::remove_dir_all(self.root.join(&row.id));
                    tracing::info!(workspace = %row.id, "workspace removed, unused past its keep_days");
                }
            }
        }
    }
}

/// An archive of nothing (what a workspace never synced holds).
pub fn empty_archive() -> Vec<u8> {
    tar::Builder::new(Vec::new()).into_inner().expect("an empty archive")
}

/// `bytes` at `path`, flushed to disk before it is renamed into place.
fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests;
