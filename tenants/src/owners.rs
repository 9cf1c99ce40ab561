//! Which tenant owns each id: written to the database as an id is made, and held in memory
//! for the check every request makes. An id nobody owns answers as one that does not exist.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::RwLock;

use rusqlite::params;

use crate::{Db, Error, TenantId};

/// What an id names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Rollout,
    Session,
    Sandbox,
    Environment,
    Context,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Rollout,
        Kind::Session,
        Kind::Sandbox,
        Kind::Environment,
        Kind::Context,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Rollout => "rollout",
            Kind::Session => "session",
            Kind::Sandbox => "sandbox",
            Kind::Environment => "environment",
            Kind::Context => "context",
        }
    }
}

impl FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Kind, String> {
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("no kind of id {s:?}"))
    }
}

/// One owner of an id: a tenant, and from when it may see the id as what it is (later than
/// now for content another tenant had built: it looks built when a build of its own would
/// have been).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub tenant: TenantId,
    /// When it asked for the id.
    pub since_ms: u64,
    pub visible_ms: u64,
}

/// What a build is taken to last when its time was not recorded.
pub const UNKNOWN_BUILD_MS: u64 = 60_000;

impl Owner {
    /// Whether this owner may see an environment as what it is at `now_ms`: at once when its
    /// own request built it (`visible_ms` set), else once the build's time (`build_ms`, when
    /// known) has passed since it asked, strictly, so that the answer to its own request
    /// always reads `building`. A build still running with no recorded time: not yet; one
    /// that ended with none recorded counts [`UNKNOWN_BUILD_MS`].
    pub fn sees_built(&self, now_ms: u64, build_ms: Option<u64>, building: bool) -> bool {
        if self.visible_ms != 0 {
            return now_ms >= self.visible_ms;
        }
        match (build_ms, building) {
            (Some(ms), _) => now_ms > self.since_ms + ms,
            (None, false) => now_ms > self.since_ms + UNKNOWN_BUILD_MS,
            (None, true) => false,
        }
    }
}

type Map = HashMap<(Kind, String), Vec<Owner>>;

/// The owners of every id, in memory, written through to the database.
pub struct Owners {
    map: RwLock<Map>,
}

impl Db {
    /// Records how long an environment's build took.
    pub fn set_build_ms(&self, env: &str, ms: u64) -> Result<(), Error> {
        self.conn()
            .execute(
                "INSERT OR REPLACE INTO builds (env, ms) VALUES (?1, ?2)",
                params![env, ms as i64],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// How long an environment's build took, if known.
    pub fn build_ms(&self, env: &str) -> Result<Option<u64>, Error> {
        use rusqlite::OptionalExtension;
        self.conn()
            .query_row("SELECT ms FROM builds WHERE env = ?1", [env], |r| r.get::<_, i64>(0))
            .optional()
            .map(|v| v.map(|ms| ms.max(0) as u64))
            .map_err(|e| self.err(e))
    }
}

impl Owners {
    /// Every owner the database holds.
    pub fn load(db: &Db) -> Result<Owners, Error> {
        let mut map: Map = HashMap::new();
        {
            let conn = db.conn();
            let mut stmt = conn
                .prepare("SELECT kind, id, tenant, since_ms, visible_ms FROM owners")
                .map_err(|e| db.err(e))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, i64>(3)?,
                        r.get::<_, i64>(4)?,
                    ))
                })
                .map_err(|e| db.err(e))?;
            for row in rows {
                let (kind, id, tenant, since, visible) = row.map_err(|e| db.err(e))?;
                let Ok(kind) = kind.parse::<Kind>() else { continue };
                map.entry((kind, id)).or_default().push(Owner {
                    tenant: TenantId(tenant),
                    since_ms: since.max(0) as u64,
                    visible_ms: visible.max(0) as u64,
                });
            }
        }
        Ok(Owners { map: RwLock::new(map) })
    }

    /// The owners of an id (none: nobody's, or no such id).
    pub fn of(&self, kind: Kind, id: &str) -> Vec<Owner> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(kind, id.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    /// The tenant's ownership of an id, if it has it.
    pub fn owner(&self, kind: Kind, id: &str, tenant: TenantId) -> Option<Owner> {
        self.of(kind, id).into_iter().find(|o| o.tenant == tenant)
    }

    /// Records that `tenant` owns these ids (one transaction; owning twice changes nothing).
    pub fn own(
        &self,
        db: &Db,
        kind: Kind,
        ids: &[String],
        tenant: TenantId,
        since_ms: u64,
        visible_ms: u64,
    ) -> Result<(), Error> {
        // The map's lock first, then the database's (the only order anywhere): a concurrent
        // `disown` of the same id lands in both in the same order.
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        {
            let mut conn = db.conn();
            let tx = conn.transaction().map_err(|e| db.err(e))?;
            for id in ids {
                tx.execute(
                    "INSERT OR IGNORE INTO owners (kind, id, tenant, since_ms, visible_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![kind.as_str(), id, tenant.0, since_ms as i64, visible_ms as i64],
                )
                .map_err(|e| db.err(e))?;
            }
            tx.commit().map_err(|e| db.err(e))?;
        }
        for id in ids {
            let owners = map.entry((kind, id.clone())).or_default();
            if !owners.iter().any(|o| o.tenant == tenant) {
                owners.push(Owner {
                    tenant,
                    since_ms,
                    visible_ms,
                });
            }
        }
        Ok(())
    }

    /// The tenant's ownership starts again at `since_ms`, as for content another built: what
    /// it sees of the id is a build's time old again (a rebuild it asked for, which others'
    /// use of the same content kept from happening).
    pub fn renew(&self, db: &Db, kind: Kind, id: &str, tenant: TenantId, since_ms: u64) -> Result<(), Error> {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        db.conn()
            .execute(
                "UPDATE owners SET since_ms = ?1, visible_ms = 0 WHERE kind = ?2 AND id = ?3 AND tenant = ?4",
                params![since_ms as i64, kind.as_str(), id, tenant.0],
            )
            .map_err(|e| db.err(e))?;
        if let Some(owner) = map
            .get_mut(&(kind, id.to_string()))
            .and_then(|owners| owners.iter_mut().find(|o| o.tenant == tenant))
        {
            owner.since_ms = since_ms;
            owner.visible_ms = 0;
        }
        Ok(())
    }

    /// `tenant` no longer owns the id; true when nobody owns it now.
    pub fn disown(&self, db: &Db, kind: Kind, id: &str, tenant: TenantId) -> Result<bool, Error> {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        db.conn()
            .execute(
                "DELETE FROM owners WHERE kind = ?1 AND id = ?2 AND tenant = ?3",
                params![kind.as_str(), id, tenant.0],
            )
            .map_err(|e| db.err(e))?;
        let key = (kind, id.to_string());
        let empty = match map.get_mut(&key) {
            Some(owners) => {
                owners.retain(|o| o.tenant != tenant);
                owners.is_empty()
            }
            None => true,
        };
        if empty {
            map.remove(&key);
        }
        Ok(empty)
    }

    /// Every id of a kind with each of its owners.
    pub fn all(&self, kind: Kind) -> Vec<(String, TenantId)> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .flat_map(|((_, id), owners)| owners.iter().map(|o| (id.clone(), o.tenant)))
            .collect()
    }

    /// The ids of a kind a tenant owns.
    pub fn owned(&self, kind: Kind, tenant: TenantId) -> Vec<String> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|((k, _), owners)| *k == kind && owners.iter().any(|o| o.tenant == tenant))
            .map(|((_, id), _)| id.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_tenants_build_looks_like_ones_own() {
        let builder = Owner {
            tenant: TenantId(2),
            since_ms: 1000,
            visible_ms: 1000,
        };
        assert!(
            builder.sees_built(1000, None, true),
            "the builder sees its own build at once"
        );
        let later = Owner {
            tenant: TenantId(3),
            since_ms: 5000,
            visible_ms: 0,
        };
        assert!(
            !later.sees_built(5000, Some(0), false),
            "its own request's answer reads building"
        );
        assert!(!later.sees_built(5000 + 30_000, Some(30_000), false));
        assert!(later.sees_built(5000 + 30_001, Some(30_000), false));
        assert!(
            !later.sees_built(10_000_000, None, true),
            "still building, no time known"
        );
        assert!(!later.sees_built(5000 + UNKNOWN_BUILD_MS, None, false));
        assert!(later.sees_built(5001 + UNKNOWN_BUILD_MS, None, false));
    }

    #[test]
    fn owners_are_written_through_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let db = Db::open(&path).unwrap();
        let a = db.add_tenant("a", 1).unwrap().id;
        let b = db.add_tenant("b", 1).unwrap().id;
        let owners = Owners::load(&db).unwrap();
        owners
            .own(&db, Kind::Sandbox, &["sb-1".into(), "sb-2".into()], a, 0, 0)
            .unwrap();
        owners.own(&db, Kind::Environment, &["env-x".into()], a, 0, 0).unwrap();
        owners
            .own(&db, Kind::Environment, &["env-x".into()], b, 50, 99)
            .unwrap();
        assert!(owners.owner(Kind::Sandbox, "sb-1", a).is_some());
        assert!(owners.owner(Kind::Sandbox, "sb-1", b).is_none());
        assert!(owners.owner(Kind::Session, "sb-1", a).is_none(), "kinds apart");
        let again = Owners::load(&db).unwrap();
        assert_eq!(again.owner(Kind::Environment, "env-x", b).unwrap().visible_ms, 99);
        let mut mine = again.owned(Kind::Sandbox, a);
        mine.sort();
        assert_eq!(mine, ["sb-1", "sb-2"]);
        again.renew(&db, Kind::Environment, "env-x", a, 700).unwrap();
        let renewed = Owners::load(&db).unwrap().owner(Kind::Environment, "env-x", a).unwrap();
        assert_eq!((renewed.since_ms, renewed.visible_ms), (700, 0));
        assert!(!again.disown(&db, Kind::Environment, "env-x", a).unwrap());
        assert!(again.disown(&db, Kind::Environment, "env-x", b).unwrap());
        assert!(Owners::load(&db).unwrap().of(Kind::Environment, "env-x").is_empty());
    }
}
