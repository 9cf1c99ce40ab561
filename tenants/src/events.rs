//! Stored lifecycle events and webhooks. The service decides what an event says (its `body`,
//! serialised); this keeps them in order per database, filters them by tenant and fork, and
//! forgets those past their retention. A webhook is a URL of a tenant, its signing secret and
//! how far its delivery got.

use rusqlite::{params, OptionalExtension};

use crate::{Db, Error, TenantId};

/// One stored event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// Its place in the database's order (ids only grow).
    pub seq: u64,
    pub at_ms: u64,
    pub tenant: TenantId,
    /// The sandbox or session it is about.
    pub fork: String,
    pub body: String,
}

/// Which events a list or a stream takes.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub tenant: Option<TenantId>,
    /// Only those after this seq.
    pub after: u64,
    pub fork: Option<String>,
    /// At most this many (the oldest first).
    pub limit: usize,
}

/// A tenant's webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webhook {
    pub id: String,
    pub tenant: TenantId,
    pub url: String,
    pub secret: Vec<u8>,
    pub created_ms: u64,
    /// The last event seq it answered with success.
    pub delivered: u64,
    /// Failed deliveries in a row.
    pub failures: u64,
    pub last_error: Option<String>,
}

impl Db {
    /// Appends an event; its seq.
    pub fn event_append(&self, at_ms: u64, tenant: TenantId, fork: &str, body: &str) -> Result<u64, Error> {
        let conn = self.conn();
        conn.execute(
            "INSERT INTO events (at_ms, tenant, fork, body) VALUES (?1, ?2, ?3, ?4)",
            params![at_ms as i64, tenant.0, fork, body],
        )
        .map_err(|e| self.err(e))?;
        Ok(conn.last_insert_rowid() as u64)
    }

    /// Events the filter keeps, oldest first.
    pub fn events(&self, filter: &EventFilter) -> Result<Vec<StoredEvent>, Error> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(
                "SELECT seq, at_ms, tenant, fork, body FROM events
                 WHERE seq > ?1 AND (?2 IS NULL OR tenant = ?2) AND (?3 IS NULL OR fork = ?3)
                 ORDER BY seq LIMIT ?4",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(
                params![
                    filter.after as i64,
                    filter.tenant.map(|t| t.0),
                    filter.fork,
                    filter.limit.max(1) as i64
                ],
                |r| {
                    Ok(StoredEvent {
                        seq: r.get::<_, i64>(0)? as u64,
                        at_ms: r.get::<_, i64>(1)? as u64,
                        tenant: TenantId(r.get(2)?),
                        fork: r.get(3)?,
                        body: r.get(4)?,
                    })
                },
            )
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// The newest event's seq (0: none yet).
    pub fn last_event(&self) -> Result<u64, Error> {
        self.conn()
            .query_row("SELECT COALESCE(MAX(seq), 0) FROM events", [], |r| r.get::<_, i64>(0))
            .map(|s| s as u64)
            .map_err(|e| self.err(e))
    }

    /// Forgets events older than `before_ms`; how many. (AUTOINCREMENT keeps later seqs
    /// above every seq handed out, so a follower's cursor stays valid.)
    pub fn events_prune(&self, before_ms: u64) -> Result<usize, Error> {
        self.conn()
            .execute("DELETE FROM events WHERE at_ms < ?1", params![before_ms as i64])
            .map_err(|e| self.err(e))
    }

    /// Adds a webhook unless its tenant has `max` already (one statement: concurrent adds
    /// cannot pass the cap); whether it did.
    pub fn webhook_add(&self, hook: &Webhook, max: usize) -> Result<bool, Error> {
        let n = self
            .conn()
            .execute(
                "INSERT INTO webhooks (id, tenant, url, secret, created_ms, delivered)
                 SELECT ?1, ?2, ?3, ?4, ?5, ?6 WHERE (SELECT COUNT(*) FROM webhooks WHERE tenant = ?2) < ?7",
                params![
                    hook.id,
                    hook.tenant.0,
                    hook.url,
                    hook.secret,
                    hook.created_ms as i64,
                    hook.delivered as i64,
                    max as i64
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(n == 1)
    }

    /// Webhooks of `tenant`, or of every tenant.
    pub fn webhooks(&self, tenant: Option<TenantId>) -> Result<Vec<Webhook>, Error> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(
                "SELECT id, tenant, url, secret, created_ms, delivered, failures, last_error FROM webhooks
                 WHERE ?1 IS NULL OR tenant = ?1 ORDER BY created_ms, id",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params![tenant.map(|t| t.0)], webhook_row)
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    pub fn webhook(&self, id: &str) -> Result<Option<Webhook>, Error> {
        self.conn()
            .query_row(
                "SELECT id, tenant, url, secret, created_ms, delivered, failures, last_error FROM webhooks WHERE id = ?1",
                params![id],
                webhook_row,
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Removes `tenant`'s webhook `id`; whether there was one.
    pub fn webhook_remove(&self, tenant: TenantId, id: &str) -> Result<bool, Error> {
        let n = self
            .conn()
            .execute(
                "DELETE FROM webhooks WHERE id = ?1 AND tenant = ?2",
                params![id, tenant.0],
            )
            .map_err(|e| self.err(e))?;
        Ok(n > 0)
    }

    /// A delivery's outcome: `delivered` moves on with a success, `failures` counts misses.
    pub fn webhook_progress(&self, id: &str, delivered: u64, error: Option<&str>) -> Result<(), Error> {
        let conn = self.conn();
        let done = match error {
            None => conn.execute(
                "UPDATE webhooks SET delivered = MAX(delivered, ?2), failures = 0, last_error = NULL WHERE id = ?1",
                params![id, delivered as i64],
            ),
            Some(error) => conn.execute(
                "UPDATE webhooks SET failures = failures + 1, last_error = ?2 WHERE id = ?1",
                params![id, error],
            ),
        };
        done.map_err(|e| self.err(e))?;
        Ok(())
    }
}

fn webhook_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Webhook> {
    Ok(Webhook {
        id: r.get(0)?,
        tenant: TenantId(r.get(1)?),
        url: r.get(2)?,
        secret: r.get(3)?,
        created_ms: r.get::<_, i64>(4)? as u64,
        delivered: r.get::<_, i64>(5)? as u64,
        failures: r.get::<_, i64>(6)? as u64,
        last_error: r.get(7)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_keep_their_order_per_tenant_and_fork_and_seqs_never_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db")).unwrap();
        let b = db.add_tenant("b", 1).unwrap().id;
        let a = crate::DEFAULT;
        for (at, tenant, fork) in [(10, a, "sb-1"), (20, b, "sb-2"), (30, a, "sb-3"), (40, a, "sb-1")] {
            db.event_append(at, tenant, fork, "{}").unwrap();
        }
        let of = |tenant, fork: Option<&str>, after| {
            db.events(&EventFilter {
                tenant: Some(tenant),
                after,
                fork: fork.map(String::from),
                limit: 100,
            })
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect::<Vec<_>>()
        };
        assert_eq!(of(a, None, 0), [1, 3, 4]);
        assert_eq!(of(a, Some("sb-1"), 1), [4]);
        assert_eq!(of(b, None, 0), [2]);
        assert_eq!(
            of(b, Some("sb-1"), 0),
            Vec::<u64>::new(),
            "another tenant's fork is not b's"
        );
        assert_eq!(db.events_prune(35).unwrap(), 3);
        assert_eq!(db.last_event().unwrap(), 4);
        assert_eq!(
            db.event_append(50, a, "sb-1", "{}").unwrap(),
            5,
            "a pruned seq is never handed out again"
        );
        drop(db);
        let db = Db::open(&dir.path().join("t.db")).unwrap();
        assert_eq!(db.event_append(60, a, "sb-1", "{}").unwrap(), 6, "nor after a reopen");
    }

    #[test]
    fn a_webhook_moves_on_only_with_a_success() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db")).unwrap();
        let hook = Webhook {
            id: "wh-1".into(),
            tenant: crate::DEFAULT,
            url: "http://127.0.0.1:9/".into(),
            secret: vec![7; 32],
            created_ms: 1,
            delivered: 3,
            failures: 0,
            last_error: None,
        };
        assert!(db.webhook_add(&hook, 1).unwrap());
        let second = Webhook {
            id: "wh-2".into(),
            ..hook.clone()
        };
        assert!(!db.webhook_add(&second, 1).unwrap(), "past the cap");
        db.webhook_progress("wh-1", 9, Some("connection refused")).unwrap();
        let got = db.webhook("wh-1").unwrap().unwrap();
        assert_eq!((got.delivered, got.failures), (3, 1));
        db.webhook_progress("wh-1", 9, None).unwrap();
        db.webhook_progress("wh-1", 5, None).unwrap();
        let got = db.webhook("wh-1").unwrap().unwrap();
        assert_eq!((got.delivered, got.failures, got.last_error), (9, 0, None));
        let other = db.add_tenant("b", 1).unwrap().id;
        assert!(
            !db.webhook_remove(other, "wh-1").unwrap(),
            "another tenant cannot remove it"
        );
        assert!(db.webhook_remove(crate::DEFAULT, "wh-1").unwrap());
        assert!(db.webhooks(None).unwrap().is_empty());
    }
}
