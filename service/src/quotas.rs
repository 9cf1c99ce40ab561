//! What each tenant uses now, against its quotas: live forks and their memory, disk of its
//! environments and saved forks, build minutes today. The service checks these before a
//! call makes anything (`admit_forks`, `check_disk`, `admit_build`).

use std::collections::HashMap;

use tenants::{Kind, Quota, TenantId};

use crate::error::ApiError;
use crate::state::Service;
use crate::tenancy::usage::{today, BuildSlot, Pending};
use crate::tenancy::{over_quota, Who};

impl Service {
    /// The guest memory a session of the served suites takes (the largest template's).
    pub fn session_mib(&self) -> u64 {
        self.suites
            .values()
            .map(|s| u64::from(s.suite.config.template.memory_mib))
            .max()
            .unwrap_or(512)
    }

    /// The tenant's live forks (not paused) and their guest memory in MiB, from the book's
    /// cards (no fork's lock is taken, so this never waits on a command).
    pub fn live_usage(&self, tenant: TenantId) -> (u64, u64) {
        let book = self.forks();
        book.cards()
            .filter(|(_, _, paused, card)| !paused && card.owner == tenant)
            .fold((0, 0), |(n, mib), (_, _, _, card)| (n + 1, mib + card.memory_mib))
    }

    /// Sets `farm_tenant_forks`: each tenant's live and paused sessions and sandboxes.
    pub fn count_tenant_forks(&self) {
        let mut counts: HashMap<(TenantId, &'static str), i64> = HashMap::new();
        for (_, _, paused, card) in self.forks().cards() {
            let state = if paused { "paused" } else { "live" };
            *counts.entry((card.owner, state)).or_default() += 1;
        }
        let gauge = &engine::metrics::get().tenant_forks;
        gauge.reset();
        let Ok(all) = self.tenancy.db.tenants() else { return };
        for summary in all {
            for state in ["live", "paused"] {
                let n = counts.get(&(summary.tenant.id, state)).copied().unwrap_or(0);
                gauge.with_label_values(&[summary.tenant.name.as_str(), state]).set(n);
            }
        }
    }

    /// Holds `count` forks of `mib` MiB each against the caller's `live` and `memory_mib`
    /// quotas until the returned guard drops, or says which quota they would pass.
    pub async fn admit_forks(&self, who: &Who, count: u64, mib: u64) -> Result<Pending, ApiError> {
        let quotas = &who.profile.quotas;
        let (live, memory) = if quotas.get(Quota::Live).is_some() || quotas.get(Quota::MemoryMib).is_some() {
            self.live_usage(who.tenant())
        } else {
            (0, 0)
        };
        self.tenancy
            .reserve_forks(who, (live, memory), count, mib)
            .map_err(|e| over_quota(who, e))
    }

    /// Disk the tenant's environments, build contexts and saved forks (pauses, checkpoints)
    /// take, in bytes.
    /// An environment several tenants asked for counts in full for each.
    pub fn disk_usage(&self, tenant: TenantId) -> u64 {
        let mut total = 0;
        if let Some(api) = &self.sandbox {
            for id in self.tenancy.owners.owned(Kind::Environment, tenant) {
                if let Some(dir) = api.environments.get(&id, "id").ok().and_then(|e| e.snapshot_dir()) {
                    total += engine::pause::disk_usage(&dir);
                }
            }
            for id in self.tenancy.owners.owned(Kind::Context, tenant) {
                if let Ok(dir) = api.environments.contexts.folder(&id, "context") {
                    total += engine::pause::disk_usage(&dir);
                }
            }
        }
        if let Some(api) = &self.sandbox {
            total += api.workspaces.disk_usage(tenant);
        }
        let mut roots = vec![self.paused_root()];
        if let Some(api) = &self.sandbox {
            roots.push(api.sandboxes.saved_dir().to_path_buf());
        }
        for root in roots {
            let Ok(entries) = std::fs::read_dir(&root) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let id = name.rsplit_once('.').map_or(name.as_str(), |(id, _)| id);
                if self.tenancy.owns(tenant, Kind::Sandbox, id) || self.tenancy.owns(tenant, Kind::Session, id) {
                    total += engine::pause::disk_usage(&entry.path());
                }
            }
        }
        total
    }

    /// Ok while the caller's disk is under its `disk_mib` quota.
    pub fn check_disk(&self, who: &Who) -> Result<(), ApiError> {
        if who.profile.quotas.get(Quota::DiskMib).is_none() {
            return Ok(());
        }
        let used = self.disk_usage(who.tenant()) >> 20;
        who.profile
            .quotas
            .check(Quota::DiskMib, used, 1)
            .map_err(|e| over_quota(who, e))
    }

    /// A build the caller may start: while it has build minutes left today, counting each
    /// build it has running as at least a minute; past them, a 429 to retry at midnight UTC.
    pub fn admit_build(&self, who: &Who) -> Result<BuildSlot, ApiError> {
        let limit = who.profile.quotas.get(Quota::BuildMinutesPerDay);
        let (day, to_midnight) = today();
        let seconds = match limit {
            Some(_) => self.tenancy.db.build_seconds(who.tenant(), day)?,
            None => 0.0,
        };
        let done_minutes = (seconds / 60.0).ceil() as u64;
        self.tenancy
            .reserve_build(who, limit, done_minutes, to_midnight)
            .map_err(|e| over_quota(who, e))
    }
}
