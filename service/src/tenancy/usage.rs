//! What a tenant uses now, against its quotas: live forks and their memory, disk of its
//! environments and saved forks, build minutes today.

use std::sync::Arc;

use tenants::{Exceeded, Quota, TenantId};

use super::{Tenancy, Who};

/// Forks a request is about to make, held against the tenant's quotas until it answers.
pub struct Pending {
    tenancy: Arc<Tenancy>,
    tenant: TenantId,
    count: u64,
    mib: u64,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut pending = self.tenancy.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((n, m)) = pending.get_mut(&self.tenant) {
            *n = n.saturating_sub(self.count);
            *m = m.saturating_sub(self.mib);
        }
    }
}

/// A build a request may start, counted against the tenant's build minutes until it ends
/// (or, when the request started none, until it answers).
pub struct BuildSlot {
    tenancy: Arc<Tenancy>,
    tenant: TenantId,
}

impl Drop for BuildSlot {
    fn drop(&mut self) {
        let mut builds = self.tenancy.builds.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = builds.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
        }
    }
}

/// Days since the epoch, UTC, and the seconds to the next one.
pub fn today() -> (u64, u64) {
    let secs = tenants::now_ms() / 1000;
    (secs / 86_400, 86_400 - secs % 86_400)
}

impl Tenancy {
    /// Holds `count` forks of `mib` MiB each against the caller's `live` and `memory_mib`
    /// quotas (it uses `used`: live forks and MiB now) beside the forks being made right now,
    /// until the returned guard drops; or says which quota they would pass.
    pub fn reserve_forks(
        self: &Arc<Self>,
        who: &Who,
        used: (u64, u64),
        count: u64,
        mib: u64,
    ) -> Result<Pending, Exceeded> {
        let quotas = &who.profile.quotas;
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let (n, m) = pending.entry(who.tenant()).or_default();
        let adding = count.saturating_mul(mib);
        quotas
            .check(Quota::Live, used.0 + *n, count)
            .and_then(|()| quotas.check(Quota::MemoryMib, used.1 + *m, adding))?;
        *n = n.saturating_add(count);
        *m = m.saturating_add(adding);
        Ok(Pending {
            tenancy: self.clone(),
            tenant: who.tenant(),
            count,
            mib: adding,
        })
    }

    /// A build the caller may start against `limit` build minutes a day, `done_minutes` of
    /// them used today, each build it has running counted as at least a minute; past them,
    /// a refusal to retry in `to_midnight` seconds.
    pub fn reserve_build(
        self: &Arc<Self>,
        who: &Who,
        limit: Option<u64>,
        done_minutes: u64,
        to_midnight: u64,
    ) -> Result<BuildSlot, Exceeded> {
        let mut builds = self.builds.lock().unwrap_or_else(|p| p.into_inner());
        let running = builds.entry(who.tenant()).or_default();
        let used = done_minutes + *running;
        if let Some(limit) = limit.filter(|l| used >= *l) {
            return Err(Exceeded {
                quota: Quota::BuildMinutesPerDay,
                limit,
                used,
                retry_after_secs: Some(to_midnight),
            });
        }
        *running += 1;
        Ok(BuildSlot {
            tenancy: self.clone(),
            tenant: who.tenant(),
        })
    }
}
