//! The build lock: one process at a time builds a snapshot id in a store shared by several
//! (shards on one machine, nodes on a shared file system).

use std::path::PathBuf;

use super::{io_err, Snapshot, SnapshotError, SnapshotStore};

/// What [`SnapshotStore::existing_or_lock`] found: the snapshot, whole, or the right to build it.
pub enum Claim {
    Existing(Box<Snapshot>),
    Build(BuildLock),
}

/// The right to build one snapshot id in a store; see [`SnapshotStore::lock_build`].
pub struct BuildLock {
    path: PathBuf,
    lock: Option<nix::fcntl::Flock<std::fs::File>>,
}

impl Drop for BuildLock {
    fn drop(&mut self) {
        // Unlinked while still held: a waiter that opened the old file sees it unlinked once
        // it gets the lock, and opens the path again.
        let _ = std::fs::remove_file(&self.path);
        drop(self.lock.take());
    }
}

impl SnapshotStore {
    /// The snapshot `id` when the store holds it whole; otherwise waits for the build lock
    /// and looks again (another process may have finished it meanwhile). A damaged or
    /// incomplete copy counts as absent: the holder of the lock rebuilds it.
    pub async fn existing_or_lock(&self, id: &str, waiting: &(dyn Fn(&str) + Sync)) -> Result<Claim, SnapshotError> {
        let whole = || self.get(id).ok().filter(|existing| existing.check_files().is_ok());
        if let Some(existing) = whole() {
            return Ok(Claim::Existing(Box::new(existing)));
        }
        let lock = self.lock_build(id, waiting).await?;
        Ok(match whole() {
            Some(existing) => Claim::Existing(Box::new(existing)),
            None => Claim::Build(lock),
        })
    }

    /// Waits until this process alone may build `id` in the store (an exclusive `flock` on
    /// `.lock-<id>`, which works across machines where the shared file system supports
    /// it: NFS v4, Lustre mounted with `flock`). `waiting` is told once if another process
    /// holds it. The caller checks again for the snapshot once it has the lock.
    pub async fn lock_build(&self, id: &str, waiting: &(dyn Fn(&str) + Sync)) -> Result<BuildLock, SnapshotError> {
        use std::os::unix::fs::MetadataExt;
        std::fs::create_dir_all(&self.root).map_err(io_err(format!("creating {}", self.root.display())))?;
        let path = self.root.join(format!(".lock-{id}"));
        let mut told = false;
        loop {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(io_err(format!("opening {}", path.display())))?;
            match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(lock) => {
                    // The holder before us may have unlinked the file we locked.
                    let same = match (lock.metadata(), std::fs::metadata(&path)) {
                        (Ok(held), Ok(now)) => held.ino() == now.ino() && held.dev() == now.dev(),
                        _ => false,
                    };
                    if same {
                        return Ok(BuildLock { path, lock: Some(lock) });
                    }
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                    if !told {
                        waiting(&format!("another process is building snapshot {id}; waiting for it"));
                        told = true;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                Err((_, errno)) => {
                    return Err(SnapshotError::Io {
                        what: format!("locking {}", path.display()),
                        source: errno.into(),
                    })
                }
            }
        }
    }
}
