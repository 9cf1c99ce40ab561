//! Connections a tenant holds open: output streams (a command's, a process's), terminals,
//! connections through its sandboxes' ports and OpenEnv sockets. Each holds some of the
//! service's memory for as long as it is open, whether or not its client reads, so a tenant
//! holds at most `connections` of them at once (its quota, else
//! `serve.max_connections_per_tenant`); one more is a 429. A connection opened with a
//! tenant's key ends when that key is revoked or expires: [`Connections::end_revoked`] looks
//! every second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tenants::{Exceeded, Quota, TenantId};
use tokio::sync::watch;

use super::Who;

/// Every tenant's open connections.
pub struct Connections {
    /// A tenant's bound when it has no `connections` quota.
    default_limit: u64,
    open: Mutex<HashMap<TenantId, u64>>,
    /// By the key that opened them: how many, and the signal that ends them.
    by_key: Mutex<HashMap<String, (u64, watch::Sender<bool>)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One open connection, counted until dropped.
pub struct Held {
    connections: Arc<Connections>,
    tenant: TenantId,
    key: Option<String>,
    /// True once its key is no longer live (None: opened without a key, never revoked).
    revoked: Option<watch::Receiver<bool>>,
}

impl Connections {
    pub fn new(default_limit: u64) -> Arc<Connections> {
        Arc::new(Connections {
            default_limit,
            open: Mutex::new(HashMap::new()),
            by_key: Mutex::new(HashMap::new()),
        })
    }

    /// One more connection of the caller's, within its bound.
    pub fn hold(self: &Arc<Self>, who: &Who) -> Result<Held, Exceeded> {
        let key = who.key_id.starts_with("k-").then(|| who.key_id.clone());
        let limit = who.profile.quotas.get(Quota::Connections);
        self.hold_for(who.tenant(), limit, key)
    }

    /// One more connection of `tenant` (with its `connections` quota, if any), opened with
    /// `key` (a tenant's key id; None for a port's token or the service token).
    pub fn hold_for(
        self: &Arc<Self>,
        tenant: TenantId,
        quota: Option<u64>,
        key: Option<String>,
    ) -> Result<Held, Exceeded> {
        let limit = quota.unwrap_or(self.default_limit);
        {
            let mut open = lock(&self.open);
            let used = open.get(&tenant).copied().unwrap_or(0);
            if used >= limit {
                return Err(Exceeded {
                    quota: Quota::Connections,
                    limit,
                    used,
                    retry_after_secs: None,
                });
            }
            open.insert(tenant, used + 1);
        }
        let revoked = key.as_ref().map(|k| {
            let mut by_key = lock(&self.by_key);
            let entry = by_key.entry(k.clone()).or_insert_with(|| (0, watch::channel(false).0));
            entry.0 += 1;
            entry.1.subscribe()
        });
        Ok(Held {
            connections: self.clone(),
            tenant,
            key,
            revoked,
        })
    }

    /// How many connections `tenant` holds now.
    #[cfg(test)]
    pub fn count(&self, tenant: TenantId) -> u64 {
        lock(&self.open).get(&tenant).copied().unwrap_or(0)
    }

    /// Ends the connections of every key that `live` says is no longer live.
    pub fn end_revoked(&self, live: impl Fn(&str) -> bool) {
        let keys: Vec<String> = lock(&self.by_key).keys().cloned().collect();
        for key in keys {
            if !live(&key) {
                if let Some((_, signal)) = lock(&self.by_key).get(&key) {
                    signal.send_replace(true);
                }
            }
        }
    }
}

impl Held {
    /// Waits until the key that opened it is revoked or expires (forever, for a connection
    /// opened without a key). A connection selects on this beside its work, and ends.
    pub async fn revoked(&mut self) {
        let Some(revoked) = self.revoked.as_mut() else {
            return std::future::pending().await;
        };
        // The sender lives while this is held (it is dropped with the last holder).
        let _ = revoked.wait_for(|r| *r).await;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        {
            let mut open = lock(&self.connections.open);
            if let Some(n) = open.get_mut(&self.tenant) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    open.remove(&self.tenant);
                }
            }
        }
        if let Some(key) = &self.key {
            let mut by_key = lock(&self.connections.by_key);
            if let Some(entry) = by_key.get_mut(key) {
                entry.0 = entry.0.saturating_sub(1);
                if entry.0 == 0 {
                    by_key.remove(key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_tenant_holds_at_most_its_bound_and_a_revoked_key_ends_its_own() {
        let connections = Connections::new(2);
        let (a, b) = (TenantId(2), TenantId(3));
        let mut first = connections.hold_for(a, None, Some("k-1".into())).unwrap();
        let second = connections.hold_for(a, None, Some("k-2".into())).unwrap();
        let over = connections.hold_for(a, None, None).err().unwrap();
        assert_eq!((over.quota, over.limit, over.used), (Quota::Connections, 2, 2));
        let _other = connections.hold_for(b, None, None).unwrap();
        assert_eq!(connections.count(a), 2, "B's are its own");
        assert!(
            connections.hold_for(a, Some(3), None).is_ok(),
            "a quota over the default"
        );
        drop(second);
        assert_eq!(connections.count(a), 1, "given back when dropped (the third too)");
        connections.end_revoked(|k| k != "k-1");
        tokio::time::timeout(std::time::Duration::from_secs(5), first.revoked())
            .await
            .expect("k-1 was revoked");
        let mut keyless = connections.hold_for(a, None, None).unwrap();
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), keyless.revoked()).await;
        assert!(waited.is_err(), "nothing to revoke");
        drop((first, keyless));
        assert_eq!(connections.count(a), 0);
        assert!(lock(&connections.by_key).is_empty());
    }
}
