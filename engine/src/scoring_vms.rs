//! Scoring VMs that serve many checks (`[scoring] isolation = "sandbox"`).
//!
//! Under TCG most of a check's cost is a fresh QEMU process translating every guest code
//! path it runs (the agent's request handling, the kernel's, Python's). A scoring VM that
//! serves check after check translates them once. The guest side keeps the checks apart
//! (a fresh candidate process in a private view for each, and a reset after each: see the
//! agent's `reset` module); this side only keeps the idle VMs, by snapshot, and retires a
//! VM that was not reset, that served `checks_per_vm` checks, or that finds no room among
//! the idle ones (at most one a rollout slot).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use snapshotter::Fork;

/// An idle scoring VM and the checks it served.
struct IdleVm {
    fork: Fork,
    checks: u32,
}

/// The idle shared scoring VMs of one engine.
pub struct ScoringVms {
    idle: Mutex<HashMap<String, Vec<IdleVm>>>,
    max_idle: AtomicUsize,
    /// Snapshots whose workspace is not empty in a fresh fork: a reset (which empties it)
    /// would not give the next check the task's pristine state, so their checks keep fresh
    /// forks.
    unshareable: Mutex<HashSet<String>>,
}

impl Default for ScoringVms {
    fn default() -> ScoringVms {
        ScoringVms {
            idle: Mutex::default(),
            max_idle: AtomicUsize::new(std::thread::available_parallelism().map_or(1, |n| n.get())),
            unshareable: Mutex::default(),
        }
    }
}

impl ScoringVms {
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

    /// Keeps a VM after a check it was reset from, unless it served its last check or the
    /// idle ones are enough; a VM not kept is dropped (its QEMU killed) outside the lock.
    pub fn give_back(&self, snapshot: &str, fork: Fork, checks: u32, checks_per_vm: u32) {
        if checks >= checks_per_vm {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let count: usize = idle.values().map(Vec::len).sum();
        if count >= self.max_idle.load(Ordering::Relaxed) {
            drop(idle);
            drop(fork);
            return;
        }
        idle.entry(snapshot.to_string())
            .or_default()
            .push(IdleVm { fork, checks });
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
