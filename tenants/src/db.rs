//! The database: opening it (WAL, migrations), tenants, quotas and grants.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

use crate::{check_name, now_ms, Quota, Quotas, Tenant, TenantId};

/// The migrations, in order: migration `i` (from 0) brings `user_version` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_tenants.sql"),
    include_str!("../migrations/0002_events.sql"),
    include_str!("../migrations/0003_workspaces.sql"),
];

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Invalid(String),
    #[error("no tenant {0:?} (farm tenant list)")]
    NoTenant(String),
    #[error("a tenant {0:?} exists already")]
    TenantExists(String),
    #[error("no key {0:?} (farm tenant key list)")]
    NoKey(String),
    #[error(
        "{path}: the tenants database is at version {found}; this farm knows versions up to {known}: use a newer farm"
    )]
    TooNew { path: PathBuf, found: u32, known: u32 },
    #[error("{path}: {source}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
}

/// The tenants database, behind one connection.
pub struct Db {
    path: PathBuf,
    conn: Mutex<Connection>,
}

/// One tenant as `farm tenant list` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TenantSummary {
    pub tenant: Tenant,
    /// Keys neither revoked nor expired.
    pub live_keys: usize,
    pub quotas: Quotas,
    pub grants: BTreeSet<String>,
}

impl Db {
    /// Opens (creating it, and its folder, if need be) and migrates the database at `path`.
    pub fn open(path: &Path) -> Result<Db, Error> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::Invalid(format!("creating {}: {e}", dir.display())))?;
        }
        let wrap = |source| Error::Sqlite {
            path: path.to_path_buf(),
            source,
        };
        let conn = Connection::open(path).map_err(wrap)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(wrap)?;
        // Switching a new file to WAL does not wait on the busy handler when another process
        // opening it at the same moment holds its lock: try again for as long as it would.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mode: String = loop {
            match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)) {
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::DatabaseBusy && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                other => break other.map_err(wrap)?,
            }
        };
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::Invalid(format!(
                "{}: the database could not be put in WAL mode (got {mode})",
                path.display()
            )));
        }
        conn.execute_batch("PRAGMA foreign_keys = ON; PRAGMA synchronous = NORMAL;")
            .map_err(wrap)?;
        let db = Db {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
        };
        db.migrate()?;
        Ok(db)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn err(&self, source: rusqlite::Error) -> Error {
        Error::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// Runs the migrations past the database's `user_version`, each in one transaction that
    /// holds the write lock from its start and reads the version under it: two processes
    /// opening a new file at once (`farm serve` and `farm tenant`) apply each migration once.
    fn migrate(&self) -> Result<(), Error> {
        let mut conn = self.conn();
        let known = MIGRATIONS.len() as u32;
        loop {
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(|e| self.err(e))?;
            let version: u32 = tx
                .query_row("PRAGMA user_version", [], |r| r.get(0))
                .map_err(|e| self.err(e))?;
            if version > known {
                return Err(Error::TooNew {
                    path: self.path.clone(),
                    found: version,
                    known,
                });
            }
            if version == known {
                return Ok(());
            }
            tx.execute_batch(MIGRATIONS[version as usize])
                .map_err(|e| self.err(e))?;
            tx.execute_batch(&format!("PRAGMA user_version = {}", version + 1))
                .map_err(|e| self.err(e))?;
            tx.commit().map_err(|e| self.err(e))?;
        }
    }

    /// `farm tenant add NAME`.
    pub fn add_tenant(&self, name: &str, weight: u32) -> Result<Tenant, Error> {
        check_name(name)?;
        if !(1..=1000).contains(&weight) {
            return Err(Error::Invalid(format!("a weight is 1 to 1000; got {weight}")));
        }
        let created_ms = now_ms();
        let conn = self.conn();
        match conn.execute(
            "INSERT INTO tenants (name, weight, created_ms) VALUES (?1, ?2, ?3)",
            params![name, weight, created_ms as i64],
        ) {
            Ok(_) => Ok(Tenant {
                id: TenantId(conn.last_insert_rowid()),
                name: name.to_string(),
                weight,
                created_ms,
            }),
            Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == rusqlite::ErrorCode::ConstraintViolation => {
                Err(Error::TenantExists(name.to_string()))
            }
            Err(e) => Err(self.err(e)),
        }
    }

    /// `farm tenant weight NAME W`.
    pub fn set_weight(&self, name: &str, weight: u32) -> Result<(), Error> {
        if !(1..=1000).contains(&weight) {
            return Err(Error::Invalid(format!("a weight is 1 to 1000; got {weight}")));
        }
        let n = self
            .conn()
            .execute("UPDATE tenants SET weight = ?1 WHERE name = ?2", params![weight, name])
            .map_err(|e| self.err(e))?;
        if n == 0 {
            return Err(Error::NoTenant(name.to_string()));
        }
        Ok(())
    }

    pub fn tenant(&self, name: &str) -> Result<Tenant, Error> {
        self.conn()
            .query_row(
                "SELECT id, name, weight, created_ms FROM tenants WHERE name = ?1",
                [name],
                tenant_of_row,
            )
            .optional()
            .map_err(|e| self.err(e))?
            .ok_or_else(|| Error::NoTenant(name.to_string()))
    }

    pub fn tenant_by_id(&self, id: TenantId) -> Result<Tenant, Error> {
        self.conn()
            .query_row(
                "SELECT id, name, weight, created_ms FROM tenants WHERE id = ?1",
                [id.0],
                tenant_of_row,
            )
            .optional()
            .map_err(|e| self.err(e))?
            .ok_or_else(|| Error::NoTenant(format!("#{}", id.0)))
    }

    /// Every tenant, with its live keys, quotas and grants.
    pub fn tenants(&self) -> Result<Vec<TenantSummary>, Error> {
        let tenants: Vec<Tenant> = {
            let conn = self.conn();
            let mut stmt = conn
                .prepare("SELECT id, name, weight, created_ms FROM tenants ORDER BY id")
                .map_err(|e| self.err(e))?;
            let rows = stmt.query_map([], tenant_of_row).map_err(|e| self.err(e))?;
            rows.collect::<Result<_, _>>().map_err(|e| self.err(e))?
        };
        let now = now_ms() as i64;
        tenants
            .into_iter()
            .map(|tenant| {
                let live_keys: i64 = self
                    .conn()
                    .query_row(
                        "SELECT COUNT(*) FROM keys WHERE tenant = ?1 AND revoked_ms IS NULL AND (expires_ms IS NULL OR expires_ms > ?2)",
                        params![tenant.id.0, now],
                        |r| r.get(0),
                    )
                    .map_err(|e| self.err(e))?;
                Ok(TenantSummary {
                    quotas: self.quotas(tenant.id)?,
                    grants: self.grants(tenant.id)?,
                    live_keys: live_keys as usize,
                    tenant,
                })
            })
            .collect()
    }

    /// How many tenants there are (`default` included).
    pub fn tenant_count(&self) -> Result<u64, Error> {
        self.conn()
            .query_row("SELECT COUNT(*) FROM tenants", [], |r| r.get::<_, i64>(0))
            .map(|n| n.max(0) as u64)
            .map_err(|e| self.err(e))
    }

    /// `farm tenant quota set NAME QUOTA VALUE` (None: no limit).
    pub fn set_quota(&self, name: &str, quota: Quota, value: Option<u64>) -> Result<(), Error> {
        let tenant = self.tenant(name)?;
        let conn = self.conn();
        match value {
            Some(v) => conn.execute(
                "INSERT INTO quotas (tenant, name, value) VALUES (?1, ?2, ?3) ON CONFLICT (tenant, name) DO UPDATE SET value = excluded.value",
                params![tenant.id.0, quota.as_str(), v.min(i64::MAX as u64) as i64],
            ),
            None => conn.execute(
                "DELETE FROM quotas WHERE tenant = ?1 AND name = ?2",
                params![tenant.id.0, quota.as_str()],
            ),
        }
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn quotas(&self, tenant: TenantId) -> Result<Quotas, Error> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare("SELECT name, value FROM quotas WHERE tenant = ?1")
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([tenant.0], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .map_err(|e| self.err(e))?;
        let mut quotas = Quotas::default();
        for row in rows {
            let (name, value) = row.map_err(|e| self.err(e))?;
            // A quota this farm does not know (a newer farm's) is skipped.
            if let Ok(q) = name.parse::<Quota>() {
                quotas.set(q, value.max(0) as u64);
            }
        }
        Ok(quotas)
    }

    /// `farm tenant grant NAME POLICY`: the tenant may name this network policy.
    pub fn grant(&self, name: &str, policy: &str, granted: bool) -> Result<(), Error> {
        let tenant = self.tenant(name)?;
        let conn = self.conn();
        if granted {
            conn.execute(
                "INSERT OR IGNORE INTO grants (tenant, policy) VALUES (?1, ?2)",
                params![tenant.id.0, policy],
            )
        } else {
            conn.execute(
                "DELETE FROM grants WHERE tenant = ?1 AND policy = ?2",
                params![tenant.id.0, policy],
            )
        }
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn grants(&self, tenant: TenantId) -> Result<BTreeSet<String>, Error> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare("SELECT policy FROM grants WHERE tenant = ?1")
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([tenant.0], |r| r.get::<_, String>(0))
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// Seconds of builds a tenant started on `day` (days since the epoch, UTC).
    pub fn build_seconds(&self, tenant: TenantId, day: u64) -> Result<f64, Error> {
        self.conn()
            .query_row(
                "SELECT seconds FROM build_time WHERE tenant = ?1 AND day = ?2",
                params![tenant.0, day as i64],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))
            .map(|s| s.unwrap_or(0.0))
    }

    pub fn add_build_seconds(&self, tenant: TenantId, day: u64, seconds: f64) -> Result<(), Error> {
        self.conn()
            .execute(
                "INSERT INTO build_time (tenant, day, seconds) VALUES (?1, ?2, ?3) ON CONFLICT (tenant, day) DO UPDATE SET seconds = seconds + excluded.seconds",
                params![tenant.0, day as i64, seconds],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// This database's secret (made on first use): the key of tenants' MCP session tokens.
    pub fn secret(&self) -> Result<[u8; 32], Error> {
        let conn = self.conn();
        let found: Option<Vec<u8>> = conn
            .query_row("SELECT value FROM secrets WHERE name = 'mcp'", [], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(e))?;
        if let Some(v) = found.filter(|v| v.len() == 32) {
            let mut out = [0u8; 32];
            out.copy_from_slice(&v);
            return Ok(out);
        }
        let mut fresh = [0u8; 32];
        getrandom::getrandom(&mut fresh).map_err(|e| Error::Invalid(format!("no randomness: {e}")))?;
        conn.execute(
            "INSERT OR IGNORE INTO secrets (name, value) VALUES ('mcp', ?1)",
            [fresh.to_vec()],
        )
        .map_err(|e| self.err(e))?;
        drop(conn);
        // Another process may have won the race: its secret is the one.
        let value: Vec<u8> = self
            .conn()
            .query_row("SELECT value FROM secrets WHERE name = 'mcp'", [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        let mut out = [0u8; 32];
        out.copy_from_slice(&value[..32]);
        Ok(out)
    }
}

fn tenant_of_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Tenant> {
    tenant_of_row_at(r, 0)
}

/// A tenant from the columns id, name, weight, created_ms from `at` on.
pub(crate) fn tenant_of_row_at(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Tenant> {
    Ok(Tenant {
        id: TenantId(r.get(at)?),
        name: r.get(at + 1)?,
        weight: r.get::<_, i64>(at + 2)? as u32,
        created_ms: r.get::<_, i64>(at + 3)? as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_database_has_the_default_tenant_and_is_in_wal_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/tenants.db");
        let db = Db::open(&path).unwrap();
        let all = db.tenants().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].tenant.name, "default");
        assert_eq!(all[0].tenant.id, crate::DEFAULT);
        let mode: String = db.conn().query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
        assert_eq!(mode, "wal");
        drop(db);
        // Opening again runs no migration twice.
        let db = Db::open(&path).unwrap();
        assert_eq!(db.tenants().unwrap().len(), 1);
        db.conn().execute_batch("PRAGMA user_version = 99").unwrap();
        drop(db);
        let err = Db::open(&path).err().unwrap().to_string();
        assert!(err.contains("version 99"), "{err}");
    }

    #[test]
    fn processes_opening_a_new_database_at_once_migrate_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants.db");
        let opened: Vec<Result<Db, Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..6).map(|_| s.spawn(|| Db::open(&path))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for db in opened {
            let db = db.unwrap();
            assert_eq!(db.tenants().unwrap().len(), 1, "one default tenant");
        }
    }

    #[test]
    fn tenants_quotas_and_grants() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db")).unwrap();
        let a = db.add_tenant("team-a", 2).unwrap();
        assert_eq!(a.weight, 2);
        assert!(matches!(db.add_tenant("team-a", 1), Err(Error::TenantExists(_))));
        assert!(matches!(db.add_tenant("Team A", 1), Err(Error::Invalid(_))));
        assert!(matches!(db.add_tenant("b", 0), Err(Error::Invalid(_))));
        db.set_quota("team-a", Quota::Live, Some(3)).unwrap();
        db.set_quota("team-a", Quota::MemoryMib, Some(2048)).unwrap();
        db.set_quota("team-a", Quota::MemoryMib, None).unwrap();
        let q = db.quotas(a.id).unwrap();
        assert_eq!(q.get(Quota::Live), Some(3));
        assert_eq!(q.get(Quota::MemoryMib), None);
        assert!(matches!(
            db.set_quota("nobody", Quota::Live, Some(1)),
            Err(Error::NoTenant(_))
        ));
        db.grant("team-a", "pypi", true).unwrap();
        db.grant("team-a", "pypi", true).unwrap();
        assert_eq!(db.grants(a.id).unwrap().len(), 1);
        db.grant("team-a", "pypi", false).unwrap();
        assert!(db.grants(a.id).unwrap().is_empty());
        db.add_build_seconds(a.id, 7, 30.0).unwrap();
        db.add_build_seconds(a.id, 7, 12.5).unwrap();
        assert_eq!(db.build_seconds(a.id, 7).unwrap(), 42.5);
        assert_eq!(db.build_seconds(a.id, 8).unwrap(), 0.0);
        assert_eq!(db.secret().unwrap(), db.secret().unwrap());
    }
}
