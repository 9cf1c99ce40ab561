//! API keys: made with 32 random bytes, shown once, stored as their SHA-256; revocable, with
//! an optional expiry. A key is 256 bits of randomness, so one round of SHA-256 is enough to
//! store it (a slow hash guards guessable passwords, which keys are not).

use rusqlite::{params, OptionalExtension};
use sha2::{Digest, Sha256};

use crate::db::tenant_of_row_at;
use crate::{now_ms, Caller, Db, Error, TenantId};

/// Every key starts with this: a bearer token that does is checked as a tenant's key, and is
/// refused (401) when it is not a live one.
pub const KEY_PREFIX: &str = "farm_";

/// A key just made: its secret is shown this once.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NewKey {
    pub id: String,
    pub tenant: String,
    pub secret: String,
    pub expires_ms: Option<u64>,
}

/// A key as `farm tenant key list` shows it (never its secret).
#[derive(Debug, Clone, serde::Serialize)]
pub struct KeyInfo {
    pub id: String,
    pub tenant: String,
    pub created_ms: u64,
    pub expires_ms: Option<u64>,
    pub revoked_ms: Option<u64>,
}

/// Why a key does not open the service (each a 401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("the key is not one of this service's")]
    Unknown,
    #[error("key {0} was revoked")]
    Revoked(String),
    #[error("key {0} has expired")]
    Expired(String),
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn random(n: usize) -> Result<Vec<u8>, Error> {
    let mut bytes = vec![0u8; n];
    getrandom::getrandom(&mut bytes).map_err(|e| Error::Invalid(format!("no randomness: {e}")))?;
    Ok(bytes)
}

impl Db {
    /// `farm tenant key add NAME`: a new key; its secret is in the answer and nowhere else.
    pub fn add_key(&self, tenant: &str, expires_ms: Option<u64>) -> Result<NewKey, Error> {
        let t = self.tenant(tenant)?;
        let secret = format!("{KEY_PREFIX}{}", hex(&random(32)?));
        let id = format!("k-{}", hex(&random(6)?));
        let hash = Sha256::digest(secret.as_bytes()).to_vec();
        self.conn()
            .execute(
                "INSERT INTO keys (id, tenant, hash, created_ms, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    id,
                    t.id.0,
                    hash,
                    now_ms() as i64,
                    expires_ms.map(|e| e.min(i64::MAX as u64) as i64)
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(NewKey {
            id,
            tenant: t.name,
            secret,
            expires_ms,
        })
    }

    /// `farm tenant key revoke ID`: the key opens nothing from the next request on.
    pub fn revoke_key(&self, id: &str) -> Result<(), Error> {
        let n = self
            .conn()
            .execute(
                "UPDATE keys SET revoked_ms = ?1 WHERE id = ?2 AND revoked_ms IS NULL",
                params![now_ms() as i64, id],
            )
            .map_err(|e| self.err(e))?;
        if n == 0 {
            let exists: Option<i64> = self
                .conn()
                .query_row("SELECT 1 FROM keys WHERE id = ?1", [id], |r| r.get(0))
                .optional()
                .map_err(|e| self.err(e))?;
            if exists.is_none() {
                return Err(Error::NoKey(id.to_string()));
            }
        }
        Ok(())
    }

    /// Every key (of one tenant, or all).
    pub fn keys(&self, tenant: Option<&str>) -> Result<Vec<KeyInfo>, Error> {
        let filter = match tenant {
            Some(name) => Some(self.tenant(name)?.id),
            None => None,
        };
        let conn = self.conn();
        let mut stmt = conn
            .prepare(
                "SELECT keys.id, tenants.name, keys.created_ms, keys.expires_ms, keys.revoked_ms, keys.tenant
                 FROM keys JOIN tenants ON tenants.id = keys.tenant ORDER BY keys.created_ms, keys.id",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    KeyInfo {
                        id: r.get(0)?,
                        tenant: r.get(1)?,
                        created_ms: r.get::<_, i64>(2)? as u64,
                        expires_ms: r.get::<_, Option<i64>>(3)?.map(|v| v as u64),
                        revoked_ms: r.get::<_, Option<i64>>(4)?.map(|v| v as u64),
                    },
                    TenantId(r.get(5)?),
                ))
            })
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (info, id) = row.map_err(|e| self.err(e))?;
            if filter.is_none_or(|f| f == id) {
                out.push(info);
            }
        }
        Ok(out)
    }

    /// Whether the key with this id is neither revoked nor expired at `now_ms`.
    pub fn key_live(&self, id: &str, now_ms: u64) -> Result<bool, Error> {
        self.conn()
            .query_row(
                "SELECT COUNT(*) FROM keys WHERE id = ?1 AND revoked_ms IS NULL AND (expires_ms IS NULL OR expires_ms > ?2)",
                params![id, now_ms as i64],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n > 0)
            .map_err(|e| self.err(e))
    }

    /// The tenant a key opens, if it is live at `now_ms`. The lookup is by the secret's
    /// digest (an index probe on 32 bytes of a hash: nothing of the secret's own bytes is
    /// compared, so its timing says nothing of them).
    pub fn authenticate(&self, secret: &str, now_ms: u64) -> Result<Result<Caller, AuthError>, Error> {
        let hash = Sha256::digest(secret.as_bytes()).to_vec();
        let conn = self.conn();
        let found = conn
            .query_row(
                "SELECT keys.id, keys.expires_ms, keys.revoked_ms, tenants.id, tenants.name, tenants.weight, tenants.created_ms
                 FROM keys JOIN tenants ON tenants.id = keys.tenant WHERE keys.hash = ?1",
                [hash],
                |r| {
                    let id: String = r.get(0)?;
                    let expires: Option<i64> = r.get(1)?;
                    let revoked: Option<i64> = r.get(2)?;
                    let tenant = tenant_of_row_at(r, 3)?;
                    Ok((id, expires, revoked, tenant))
                },
            )
            .optional()
            .map_err(|e| self.err(e))?;
        Ok(match found {
            None => Err(AuthError::Unknown),
            Some((id, _, Some(_), _)) => Err(AuthError::Revoked(id)),
            Some((id, Some(expires), None, _)) if expires as u64 <= now_ms => Err(AuthError::Expired(id)),
            Some((key_id, _, None, tenant)) => Ok(Caller { tenant, key_id }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_shown_once_stored_hashed_and_can_be_revoked_or_expire() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let db = Db::open(&path).unwrap();
        db.add_tenant("a", 1).unwrap();
        let key = db.add_key("a", None).unwrap();
        assert!(key.secret.starts_with(KEY_PREFIX) && key.secret.len() == KEY_PREFIX.len() + 64);
        let caller = db.authenticate(&key.secret, now_ms()).unwrap().unwrap();
        assert_eq!(
            (caller.tenant.name.as_str(), caller.key_id.as_str()),
            ("a", key.id.as_str())
        );
        // The secret is nowhere in the file.
        drop(db);
        let bytes = std::fs::read(&path).unwrap();
        let wal = std::fs::read(path.with_extension("db-wal")).unwrap_or_default();
        for b in [&bytes, &wal] {
            assert!(!b.windows(key.secret.len()).any(|w| w == key.secret.as_bytes()));
        }
        let db = Db::open(&path).unwrap();
        assert_eq!(db.authenticate("farm_nope", now_ms()).unwrap(), Err(AuthError::Unknown));
        assert!(db.key_live(&key.id, now_ms()).unwrap());
        db.revoke_key(&key.id).unwrap();
        db.revoke_key(&key.id).unwrap();
        assert!(!db.key_live(&key.id, now_ms()).unwrap());
        assert_eq!(
            db.authenticate(&key.secret, now_ms()).unwrap(),
            Err(AuthError::Revoked(key.id.clone()))
        );
        assert!(matches!(db.revoke_key("k-none"), Err(Error::NoKey(_))));
        let expiring = db.add_key("a", Some(now_ms() + 60_000)).unwrap();
        assert!(db.authenticate(&expiring.secret, now_ms()).unwrap().is_ok());
        assert_eq!(
            db.authenticate(&expiring.secret, now_ms() + 61_000).unwrap(),
            Err(AuthError::Expired(expiring.id.clone()))
        );
        // An expiry past what SQLite holds is "never" for every check alike.
        let far = db.add_key("a", Some(u64::MAX)).unwrap();
        assert!(db.authenticate(&far.secret, now_ms()).unwrap().is_ok());
        assert!(db.key_live(&far.id, now_ms()).unwrap());
        let keys = db.keys(Some("a")).unwrap();
        assert_eq!(keys.len(), 3);
        assert!(keys[0].revoked_ms.is_some());
        assert_eq!(db.tenants().unwrap()[1].live_keys, 2);
    }
}
