//! Workspaces as the database keeps them: who owns each, who holds it writable and in which
//! generation, and how far its last accepted sync got. The service keeps the bytes; a sync's
//! bytes take effect only through [`Db::workspace_commit`], which checks the holder and its
//! generation and renames the new archive into place under the same lock, so a fence (or a
//! newer holder) and a late sync of an old holder can never both win.

use rusqlite::{params, OptionalExtension};

use crate::{Db, Error, TenantId};

/// One workspace's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceRow {
    pub id: String,
    pub tenant: TenantId,
    pub name: String,
    pub size_mib: u64,
    /// Removed this many days after its last use (None: kept until deleted).
    pub keep_days: Option<u64>,
    pub created_ms: u64,
    pub used_ms: u64,
    /// The generation of its current (or last) writable holder.
    pub generation: u64,
    /// The fork that holds it writable now.
    pub holder: Option<String>,
    pub bytes: u64,
    pub synced_ms: Option<u64>,
}

const COLUMNS: &str =
    "id, tenant, name, size_mib, keep_days, created_ms, used_ms, generation, holder, bytes, synced_ms";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<WorkspaceRow> {
    Ok(WorkspaceRow {
        id: r.get(0)?,
        tenant: TenantId(r.get(1)?),
        name: r.get(2)?,
        size_mib: r.get::<_, i64>(3)? as u64,
        keep_days: r.get::<_, Option<i64>>(4)?.map(|d| d as u64),
        created_ms: r.get::<_, i64>(5)? as u64,
        used_ms: r.get::<_, i64>(6)? as u64,
        generation: r.get::<_, i64>(7)? as u64,
        holder: r.get(8)?,
        bytes: r.get::<_, i64>(9)? as u64,
        synced_ms: r.get::<_, Option<i64>>(10)?.map(|m| m as u64),
    })
}

/// What a writable mount's claim came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Held now by the fork, in this generation.
    Held(u64),
    /// Another fork holds it.
    HeldBy(String),
    Missing,
}

impl Db {
    /// Adds a workspace; false when the tenant has one of that name.
    pub fn workspace_add(&self, w: &WorkspaceRow) -> Result<bool, Error> {
        let n = self
            .conn()
            .execute(
                "INSERT OR IGNORE INTO workspaces (id, tenant, name, size_mib, keep_days, created_ms, used_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)",
                params![
                    w.id,
                    w.tenant.0,
                    w.name,
                    w.size_mib as i64,
                    w.keep_days.map(|d| d as i64),
                    w.created_ms as i64
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(n == 1)
    }

    /// `tenant`'s workspace `name`.
    pub fn workspace(&self, tenant: TenantId, name: &str) -> Result<Option<WorkspaceRow>, Error> {
        self.conn()
            .query_row(
                &format!("SELECT {COLUMNS} FROM workspaces WHERE tenant = ?1 AND name = ?2"),
                params![tenant.0, name],
                row,
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    pub fn workspace_by_id(&self, id: &str) -> Result<Option<WorkspaceRow>, Error> {
        self.conn()
            .query_row(
                &format!("SELECT {COLUMNS} FROM workspaces WHERE id = ?1"),
                params![id],
                row,
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// `tenant`'s workspaces (every tenant's when None), by name.
    pub fn workspaces(&self, tenant: Option<TenantId>) -> Result<Vec<WorkspaceRow>, Error> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM workspaces WHERE ?1 IS NULL OR tenant = ?1 ORDER BY tenant, name"
            ))
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params![tenant.map(|t| t.0)], row)
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// Removes a workspace no one holds; whether it did.
    pub fn workspace_remove(&self, id: &str) -> Result<bool, Error> {
        let n = self
            .conn()
            .execute("DELETE FROM workspaces WHERE id = ?1 AND holder IS NULL", params![id])
            .map_err(|e| self.err(e))?;
        Ok(n == 1)
    }

    /// `fork` takes workspace `id` writable, in the next generation, unless another holds it.
    pub fn workspace_claim(&self, id: &str, fork: &str, now_ms: u64) -> Result<Claim, Error> {
        let conn = self.conn();
        let n = conn
            .execute(
                "UPDATE workspaces SET holder = ?2, generation = generation + 1, used_ms = ?3
                 WHERE id = ?1 AND holder IS NULL",
                params![id, fork, now_ms as i64],
            )
            .map_err(|e| self.err(e))?;
        let found: Option<(Option<String>, i64)> = conn
            .query_row(
                "SELECT holder, generation FROM workspaces WHERE id = ?1",
                params![id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        Ok(match found {
            None => Claim::Missing,
            Some((Some(holder), generation)) if n == 1 && holder == fork => Claim::Held(generation as u64),
            Some((Some(holder), _)) => Claim::HeldBy(holder),
            Some((None, _)) => Claim::Missing,
        })
    }

    /// `fork` lets go of workspace `id` (only if it still holds it, in `generation`).
    pub fn workspace_release(&self, id: &str, fork: &str, generation: u64, now_ms: u64) -> Result<bool, Error> {
        let n = self
            .conn()
            .execute(
                "UPDATE workspaces SET holder = NULL, used_ms = ?4 WHERE id = ?1 AND holder = ?2 AND generation = ?3",
                params![id, fork, generation as i64, now_ms as i64],
            )
            .map_err(|e| self.err(e))?;
        Ok(n == 1)
    }

    /// Takes workspace `id` from whoever holds it (a holder that is lost): its later syncs are
    /// refused. The holder it had, if any.
    pub fn workspace_fence(&self, id: &str) -> Result<Option<String>, Error> {
        let conn = self.conn();
        let holder: Option<String> = conn
            .query_row("SELECT holder FROM workspaces WHERE id = ?1", params![id], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(e))?
            .flatten();
        conn.execute("UPDATE workspaces SET holder = NULL WHERE id = ?1", params![id])
            .map_err(|e| self.err(e))?;
        Ok(holder)
    }

    /// A sync of `fork`'s, in `generation`: when it still holds workspace `id` in that
    /// generation, `install` puts its bytes in place (under this lock) and the row says so;
    /// otherwise nothing is installed and the answer is false (fenced).
    pub fn workspace_commit(
        &self,
        id: &str,
        fork: &str,
        generation: u64,
        bytes: u64,
        now_ms: u64,
        install: impl FnOnce() -> std::io::Result<()>,
    ) -> Result<bool, Error> {
        let conn = self.conn();
        let holds: bool = conn
            .query_row(
                "SELECT holder = ?2 AND generation = ?3 FROM workspaces WHERE id = ?1",
                params![id, fork, generation as i64],
                |r| r.get::<_, Option<bool>>(0),
            )
            .optional()
            .map_err(|e| self.err(e))?
            .flatten()
            .unwrap_or(false);
        if !holds {
            return Ok(false);
        }
        install().map_err(|e| Error::Invalid(format!("installing workspace {id}'s new bytes: {e}")))?;
        conn.execute(
            "UPDATE workspaces SET bytes = ?2, synced_ms = ?3, used_ms = ?3 WHERE id = ?1",
            params![id, bytes as i64, now_ms as i64],
        )
        .map_err(|e| self.err(e))?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace(db: &Db) -> WorkspaceRow {
        let w = WorkspaceRow {
            id: "ws-1".into(),
            tenant: crate::DEFAULT,
            name: "data".into(),
            size_mib: 64,
            keep_days: None,
            created_ms: 1,
            used_ms: 1,
            generation: 0,
            holder: None,
            bytes: 0,
            synced_ms: None,
        };
        assert!(db.workspace_add(&w).unwrap());
        w
    }

    #[test]
    fn one_writable_holder_at_a_time_and_a_fenced_holder_commits_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db")).unwrap();
        let w = workspace(&db);
        assert!(!db.workspace_add(&w).unwrap(), "a name once per tenant");
        assert_eq!(db.workspace_claim("ws-1", "sb-a", 2).unwrap(), Claim::Held(1));
        assert_eq!(
            db.workspace_claim("ws-1", "sb-b", 3).unwrap(),
            Claim::HeldBy("sb-a".into())
        );
        assert!(!db.workspace_remove("ws-1").unwrap(), "not while held");
        let mut installed = 0;
        assert!(db
            .workspace_commit("ws-1", "sb-a", 1, 10, 4, || {
                installed += 1;
                Ok(())
            })
            .unwrap());
        // A holder is lost: fenced, and another takes the next generation.
        assert_eq!(db.workspace_fence("ws-1").unwrap().as_deref(), Some("sb-a"));
        assert_eq!(db.workspace_claim("ws-1", "sb-b", 5).unwrap(), Claim::Held(2));
        assert!(!db
            .workspace_commit("ws-1", "sb-a", 1, 99, 6, || {
                installed += 1;
                Ok(())
            })
            .unwrap());
        assert!(
            !db.workspace_release("ws-1", "sb-a", 1, 7).unwrap(),
            "the old holder releases nothing"
        );
        assert_eq!(installed, 1, "the fenced holder's bytes never installed");
        let row = db.workspace_by_id("ws-1").unwrap().unwrap();
        assert_eq!(
            (row.bytes, row.holder.as_deref(), row.generation),
            (10, Some("sb-b"), 2)
        );
        assert!(db.workspace_release("ws-1", "sb-b", 2, 8).unwrap());
        assert!(db.workspace_remove("ws-1").unwrap());
        assert_eq!(db.workspace_claim("ws-1", "sb-c", 9).unwrap(), Claim::Missing);
    }
}
