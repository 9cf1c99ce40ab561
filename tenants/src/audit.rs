//! The audit: one row per call that changed state (tenant, key id, route, target id, result,
//! time), appended and never changed (triggers refuse UPDATE and DELETE). Secrets and file
//! contents never reach it: a route is its template (`POST /v1/sandboxes/{id}/exec`) and the
//! target an id.

use rusqlite::params;

use crate::{Db, Error};

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuditRecord {
    pub at_ms: u64,
    pub tenant: String,
    pub key_id: String,
    /// Method and route template.
    pub route: String,
    /// The id acted on or made, if any.
    pub target: Option<String>,
    /// The HTTP status answered.
    pub status: u16,
}

/// Which records `farm tenant audit` shows.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub tenant: Option<String>,
    pub since_ms: Option<u64>,
    /// The newest this many (in time order).
    pub limit: usize,
}

impl Db {
    pub fn audit_append(&self, record: &AuditRecord) -> Result<(), Error> {
        self.conn()
            .execute(
                "INSERT INTO audit (at_ms, tenant, key_id, route, target, status) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    record.at_ms as i64,
                    record.tenant,
                    record.key_id,
                    record.route,
                    record.target,
                    record.status
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn audit(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>, Error> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(
                "SELECT at_ms, tenant, key_id, route, target, status FROM audit
                 WHERE (?1 IS NULL OR tenant = ?1) AND at_ms >= ?2 ORDER BY seq DESC LIMIT ?3",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(
                params![
                    filter.tenant,
                    filter.since_ms.unwrap_or(0) as i64,
                    filter.limit.max(1) as i64
                ],
                |r| {
                    Ok(AuditRecord {
                        at_ms: r.get::<_, i64>(0)? as u64,
                        tenant: r.get(1)?,
                        key_id: r.get(2)?,
                        route: r.get(3)?,
                        target: r.get(4)?,
                        status: r.get(5)?,
                    })
                },
            )
            .map_err(|e| self.err(e))?;
        let mut out: Vec<AuditRecord> = rows.collect::<Result<_, _>>().map_err(|e| self.err(e))?;
        out.reverse();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_is_append_only() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db")).unwrap();
        for (i, tenant) in ["a", "b", "a"].iter().enumerate() {
            db.audit_append(&AuditRecord {
                at_ms: 1000 + i as u64,
                tenant: tenant.to_string(),
                key_id: "k-1".into(),
                route: "POST /v1/sandboxes".into(),
                target: Some(format!("sb-{i}")),
                status: 201,
            })
            .unwrap();
        }
        let a = db
            .audit(&AuditFilter {
                tenant: Some("a".into()),
                limit: 10,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[1].target.as_deref(), Some("sb-2"), "oldest first");
        let conn = db.conn();
        let err = conn.execute("DELETE FROM audit", []).unwrap_err().to_string();
        assert!(err.contains("append-only"), "{err}");
        let err = conn
            .execute("UPDATE audit SET status = 200", [])
            .unwrap_err()
            .to_string();
        assert!(err.contains("append-only"), "{err}");
        let err = conn
            .execute(
                "INSERT OR REPLACE INTO audit (seq, at_ms, tenant, key_id, route, status) \
                 SELECT seq, at_ms, tenant, key_id, route, 200 FROM audit LIMIT 1",
                [],
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("append-only"), "{err}");
    }
}
