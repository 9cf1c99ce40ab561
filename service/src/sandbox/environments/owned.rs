//! The snapshot an environment made from a sandbox owns, removed when it is deleted.

use std::sync::Arc;

/// What an environment made from a sandbox's state owns: its snapshot, removed from the
/// store once the environment is deleted and the last sandbox or request holding it is done
/// (when the environment drops, so no fork in flight loses its files; its warm pool, an
/// earlier field, is gone by then), and the branch that snapshot descends from, held until
/// then (a child's disk is backed by its parent's).
pub(super) struct Owned {
    pub(super) store: engine::snapshots::SnapshotStore,
    pub(super) snapshot: String,
    pub(super) deleted: std::sync::atomic::AtomicBool,
    pub(super) _origin: Option<Arc<engine::Branch>>,
}

impl Drop for Owned {
    fn drop(&mut self) {
        if !self.deleted.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        // Left for `farm snapshot gc` while anything else needs it: a pin (another holder),
        // or children (a paused sandbox's state), which `remove` refuses.
        let id = &self.snapshot;
        if !self.store.pinned(true).contains(id) {
            if let Err(e) = self.store.remove(id) {
                tracing::info!("the snapshot {id} of a deleted environment stays: {e}");
            }
        }
    }
}
