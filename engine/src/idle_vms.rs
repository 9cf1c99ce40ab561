//! Idle VMs kept for another use, by snapshot. Two kinds, in two stores of the engine:
//!
//! - **Shared scoring VMs** (`[scoring] isolation = "sandbox"`). Under TCG most of a check's
//!   cost is a fresh QEMU process translating every guest code path it runs; a scoring VM
//!   that serves check after check translates them once. The guest side keeps the checks
//!   apart (a fresh candidate process in a private view for each, and a reset after each: see
//!   the agent's `reset` module); this side retires a VM that was not reset, that served
//!   `checks_per_vm` checks, or that finds no room among the idle ones.
//! - **VMs reset in place** (`[rollouts] reuse`): a rollout's or a scoring VM, given back when
//!   it is done and reset exactly to its snapshot when it is taken again
//!   ([`snapshotter::Fork::reset`]): memory, devices and disk are the snapshot's again, so
//!   what runs next is as sound as in a new fork.
//!
//! At most one idle VM a rollout slot (a slot holds one VM at a time).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use snapshotter::Fork;

/// An idle scoring VM and the checks it served.
struct IdleVm {
    fork: Fork,
    checks: u32,
    since: std::time::Instant,
}

/// Idle VMs of one engine, by snapshot.
pub struct IdleVms {
    idle: Mutex<HashMap<String, Vec<IdleVm>>>,
    max_idle: AtomicUsize,
    /// Shared scoring VMs: snapshots whose workspace is not empty in a fresh fork: the
    /// guest's reset (which empties it) would not give the next check the task's pristine
    /// state, so their checks keep fresh forks.
    unshareable: Mutex<HashSet<String>>,
}

impl Default for IdleVms {
    fn default() -> IdleVms {
        IdleVms {
            idle: Mutex::default(),
            max_idle: AtomicUsize::new(std::thread::available_parallelism().map_or(1, |n| n.get())),
            unshareable: Mutex::default(),
        }
    }
}

impl IdleVms {
    /// Idle VMs kept at most (one a rollout slot: a slot scores one rollout at a time).
    pub fn set_max_idle(&self, max: usize) {
        self.max_idle.store(max.max(1), Ordering::Relaxed);
    }

    /// An idle VM of this snapshot and the checks it served, if one is kept.
    pub fn take(&self, snapshot: &str) -> Option<(Fork, u32)> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let vm = idle.get_mut(snapshot)?.pop()?;
        Some((vm.fork, vm.checks))
    }

    /// Keeps a VM after a check it was reset from, unless it served its last check; when the
    /// idle ones are as many as allowed, the one idle longest goes to make room (a VM of a
    /// snapshot nobody asks for any more must not keep out the ones in use). A VM dropped
    /// is dropped (its QEMU killed) outside the lock.
    pub fn give_back(&self, snapshot: &str, fork: Fork, checks: u32, checks_per_vm: u32) {
        if checks >= checks_per_vm {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let count: usize = idle.values().map(Vec::len).sum();
        let evicted = if count >= self.max_idle.load(Ordering::Relaxed) {
            let oldest = idle
                .iter()
                .flat_map(|(key, vms)| vms.iter().enumerate().map(move |(i, vm)| (vm.since, key.clone(), i)))
                .min();
            oldest.map(|(_, key, i)| {
                let vms = idle.get_mut(&key).expect("listed above");
                let vm = vms.remove(i);
                if vms.is_empty() {
                    idle.remove(&key);
                }
                vm
            })
        } else {
            None
        };
        idle.entry(snapshot.to_string()).or_default().push(IdleVm {
            fork,
            checks,
            since: std::time::Instant::now(),
        });
        drop(idle);
        drop(evicted);
    }

    pub fn is_unshareable(&self, snapshot: &str) -> bool {
        self.unshareable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(snapshot)
    }

    pub fn mark_unshareable(&self, snapshot: &str) {
        self.unshareable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(snapshot.to_string());
    }

    /// Keeps a VM to be reset in place when it is taken again, unless the idle ones are
    /// enough (it is dropped, its QEMU killed).
    pub fn put(&self, fork: Fork) {
        let snapshot = fork.snapshot_id.clone();
        self.give_back(&snapshot, fork, 0, u32::MAX);
    }

    /// Drops the VMs idle for longer than `max` (their QEMU processes are killed): a service
    /// whose traffic moved to other snapshots does not keep their memory.
    pub fn prune(&self, max: std::time::Duration) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let mut gone = Vec::new();
        for vms in idle.values_mut() {
            let (old, young): (Vec<IdleVm>, Vec<IdleVm>) = vms.drain(..).partition(|vm| vm.since.elapsed() > max);
            *vms = young;
            gone.extend(old);
        }
        idle.retain(|_, vms| !vms.is_empty());
        drop(idle);
        drop(gone);
    }

    /// Drops every idle VM (their QEMU processes are killed).
    pub fn clear(&self) {
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|p| p.into_inner()));
        drop(idle);
    }

    /// Idle VMs kept now.
    pub fn idle_count(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(Vec::len)
            .sum()
    }
}
