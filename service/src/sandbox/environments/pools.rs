//! Each environment's pool: warm forks of its snapshot, and the VMs of its sandboxes given
//! back when they end, reset in place for the next sandbox (`snapshotter::pool`).
//!
//! `serve.sandboxes.warm_pool` forks are kept ready from the moment an environment is ready
//! in this process (built, or asked for again); one recorded by an earlier process starts its
//! pool with its first sandbox. A burst that finds the pool short grows it, up to
//! `warm_pool_max`, while the host keeps twice the memory reserve; it shrinks back once the
//! bursts stop. A sandbox that ends (deleted, or past its time) gives its VM back unless it
//! died, was paused or branched: its next user gets it reset exactly to the environment's
//! snapshot, in the same QEMU process.

use std::sync::Arc;

use engine::snapshots::{Fork, PoolSize, WarmPool};

use super::{Environment, Environments, Ready};

/// The pools' size, from `[serve.sandboxes]`: growth needs twice the reserve free, and the
/// memory of one more VM (a guest's at most).
pub(super) fn size(settings: &crate::sandbox::SandboxSection, reserve_percent: u64) -> PoolSize {
    let room = move || {
        let Some(host) = engine::sizing::HostMemory::probe() else {
            return true;
        };
        let reserve = crate::admission::reserve_bytes(&host, reserve_percent);
        host.available >= reserve.saturating_mul(2).saturating_add(GROWTH_VM_BYTES)
    };
    PoolSize {
        base: settings.warm_pool,
        max: settings.warm_pool_max.max(settings.warm_pool),
        room: Some(Arc::new(room)),
        window: snapshotter::DEMAND_WINDOW,
    }
}

/// What one more pooled VM is counted at when the pool grows (an idle fork's resident memory
/// is well under this; a guest that runs grows).
const GROWTH_VM_BYTES: u64 = 256 << 20;

impl Environments {
    /// `env`'s pool (None when pools are off: `warm_pool_max = 0`, or it could not start).
    pub async fn pool<'a>(&self, env: &'a Environment, ready: &Ready) -> Option<&'a WarmPool> {
        if self.pool_size.max == 0 {
            return None;
        }
        env.pool
            .get_or_init(|| async { self.host.environment_pool(&env.id, ready, self.pool_size.clone()) })
            .await
            .as_ref()
    }

    /// Starts `env`'s pool now when it keeps warm forks, so they are ready before its first
    /// sandbox.
    pub(super) fn warm(self: &Arc<Self>, env: &Arc<Environment>) {
        if self.pool_size.base == 0 || env.pool.initialized() {
            return;
        }
        let Ok(ready) = env.ready("environment") else { return };
        let (environments, env) = (self.clone(), env.clone());
        tokio::spawn(async move {
            environments.pool(&env, &ready).await;
        });
    }
}

impl Environment {
    /// Gives back the VM of one of `owner`'s sandboxes that ended, for a later sandbox of
    /// the same owner's (dropped, its QEMU killed, when it has no pool or the pool does not
    /// need it).
    pub fn give_back(&self, fork: Fork, owner: u64) {
        match self.pool.get().and_then(Option::as_ref) {
            Some(pool) => pool.give_back(fork, owner),
            None => drop(fork),
        }
    }
}
