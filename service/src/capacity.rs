//! `GET /v1/capacity`: what the service has room for, and what runs.

use engine::book::Kind;

use crate::state::Service;
use crate::tenancy::Who;
use crate::wire::{Capacity, MemoryCapacity};

impl Service {
    /// `GET /v1/capacity`: the node's figures; for a tenant other than `default` (the
    /// single-token set-up), its own rollouts, sessions and sandboxes in place of the node's,
    /// which are every tenant's work.
    pub fn capacity(&self, who: &Who) -> Capacity {
        let tenant = who.tenant();
        let own = !who.profile.is_default();
        let (slots_in_flight, queued) = {
            let inner = self.lock();
            match own {
                true => (
                    inner
                        .running
                        .keys()
                        .filter(|id| self.tenancy.owns(tenant, tenants::Kind::Rollout, id))
                        .count(),
                    inner.queue.len_of(tenant),
                ),
                false => (inner.running.len(), inner.queue.len()),
            }
        };
        let warm: usize = match own {
            true => 0,
            false => self.suites.values().map(|s| s.engine.warm()).sum(),
        };
        let (sessions, sandboxes) = match own {
            true => {
                let forks = self.forks();
                let mine = |of: Kind| {
                    forks
                        .cards()
                        .filter(|(_, kind, paused, card)| *kind == of && !paused && card.owner == tenant)
                        .count()
                };
                (mine(Kind::Session), mine(Kind::Sandbox))
            }
            false => {
                let forks = self.forks();
                (forks.count(Kind::Session).0, forks.count(Kind::Sandbox).0)
            }
        };
        Capacity {
            slots: self.slots,
            in_flight: slots_in_flight,
            queued,
            warm,
            queue_limit: self.settings.queue_limit,
            sessions,
            sandboxes,
            max_sessions: self.max_sessions,
            memory: self.memory_capacity(),
        }
    }

    /// The memory part of `GET /v1/capacity`.
    fn memory_capacity(&self) -> MemoryCapacity {
        let host = engine::sizing::HostMemory::probe().unwrap_or_default();
        let cost = self.vm_cost.current();
        let reserve = crate::admission::reserve_bytes(&host, self.settings.memory_reserve_percent);
        MemoryCapacity {
            available_mib: host.available >> 20,
            reserve_mib: reserve >> 20,
            vm_cost_mib: cost.bytes >> 20,
            vm_cost_sampled: cost.sampled,
            more_vms: host.available.saturating_sub(reserve) / cost.bytes.max(1),
        }
    }
}
