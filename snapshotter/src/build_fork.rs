//! A build step's fork: a fork whose guest RAM is a writable copy of the parent's memory file,
//! shared, in the staging folder of the snapshot the step makes. Committing it saves the
//! device state alone (`x-ignore-shared`), since the RAM is already the child's memory file.
//!
//! A rollout's fork keeps its RAM private over the parent's file, so snapshotting one
//! ([`crate::snapshot_fork`]) streams all of its RAM into a helper QEMU. That helper faults in
//! every page of guest RAM, zero pages included, and the source reads every page too. On a
//! host where fresh memory is costly (a nested VM) that was about half of a short build
//! step's time. Here only the parent's allocated ranges are copied (holes stay holes), and
//! only what the guest touches is faulted in.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use vmm::qemu::RamBacking;

use crate::build::{finish_child, BuildError};
use crate::fork::{Fork, ForkError, ForkIdentity, Forker};
use crate::store::{remove_tree, Claim, Snapshot, SnapshotStore};

/// A fork for one build step; [`BuildFork::commit`] makes it a child snapshot. Dropped
/// without a commit, its QEMU is stopped and its staging folder removed.
pub struct BuildFork {
    /// Declared first: dropped (QEMU killed) before the staging folder goes.
    fork: Fork,
    staging: PathBuf,
}

impl std::ops::Deref for BuildFork {
    type Target = Fork;
    fn deref(&self) -> &Fork {
        &self.fork
    }
}

impl Drop for BuildFork {
    fn drop(&mut self) {
        if self.staging.exists() {
            self.fork.machine.kill();
            let _ = remove_tree(&self.staging);
        }
    }
}

impl Forker {
    /// Forks `parent` for a build step whose snapshot will be labelled `label` (see the
    /// module's documentation). Setup may install a lot: no disk limit applies.
    pub async fn build_fork(
        &self,
        store: &SnapshotStore,
        parent: &Snapshot,
        label: &str,
    ) -> Result<BuildFork, ForkError> {
        parent.check_host(&self.host)?;
        parent.check_files()?;
        let staging = store.staging_dir(label)?;
        let forker = Forker {
            max_disk_bytes: None,
            ..self.clone()
        };
        let memory = staging.join("memory");
        let forked = async {
            copy_sparse(&parent.memory_path(), &memory).map_err(ForkError::Memory)?;
            let ram = RamBacking::shared(memory.clone());
            let machine = forker.prepare_on(parent, ram).await?;
            forker.resume(machine, parent, ForkIdentity::new(0)).await
        };
        match forked.await {
            Ok(fork) => Ok(BuildFork { fork, staging }),
            Err(e) => {
                let _ = remove_tree(&staging);
                Err(e)
            }
        }
    }
}

impl BuildFork {
    /// Makes the step's state the child snapshot `id` of `parent` (the store's copy when
    /// another build finished the same one first).
    pub async fn commit(
        mut self,
        store: &SnapshotStore,
        forker: &Forker,
        parent: &Snapshot,
        label: &str,
        id: &str,
    ) -> Result<Snapshot, BuildError> {
        let _lock = match store.existing_or_lock(id, &|line| tracing::info!("{line}")).await? {
            Claim::Existing(existing) => return Ok(*existing),
            Claim::Build(lock) => lock,
        };
        let staging = std::mem::take(&mut self.staging);
        let machine = &mut self.fork.machine;
        let result = async {
            machine.agent().quiesce().await?;
            // The fork's disk at this moment becomes the child's disk (its backing is the
            // parent's).
            crate::build::copy_off_runtime(&machine.spec().disk, &staging.join("disk.qcow2")).await?;
            let raw = staging.join("state.raw");
            machine.save_state(&raw).await?;
            let _ = std::fs::copy(machine.run_dir().join("console.log"), staging.join("console.log"));
            machine.kill();
            finish_child(&staging, &raw, store, id, label, parent, forker).await
        }
        .await;
        if result.is_err() {
            let _ = remove_tree(&staging);
        }
        result
    }
}

/// Copies `src` to a new file `dst` of the same length, leaving `src`'s holes as holes.
fn copy_sparse(src: &Path, dst: &Path) -> std::io::Result<()> {
    use nix::unistd::{lseek, Whence};
    let from = File::open(src)?;
    let to = File::create(dst)?;
    let len = from.metadata()?.len();
    to.set_len(len)?;
    let fd_in = from.as_raw_fd();
    let mut offset: i64 = 0;
    while (offset as u64) < len {
        let start = match lseek(fd_in, offset, Whence::SeekData) {
            Ok(start) => start,
            // No data after `offset`: the rest is a hole.
            Err(nix::errno::Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let end = lseek(fd_in, start, Whence::SeekHole).map_err(std::io::Error::from)?;
        // std copies between files with copy_file_range(2): in the kernel, no user buffer.
        (&from).seek(SeekFrom::Start(start as u64))?;
        (&to).seek(SeekFrom::Start(start as u64))?;
        let want = (end - start) as u64;
        let copied = std::io::copy(&mut (&from).take(want), &mut &to)?;
        if copied != want {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{} ended while copying it", src.display()),
            ));
        }
        offset = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::copy_sparse;
    use std::io::{Read, Seek, SeekFrom, Write};

    #[test]
    fn a_sparse_copy_has_the_same_bytes_and_keeps_the_holes() {
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        let mut f = std::fs::File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        for (at, byte) in [(0u64, 1u8), (5 << 20, 2), ((64 << 20) - 4096, 3)] {
            f.seek(SeekFrom::Start(at)).unwrap();
            f.write_all(&vec![byte; 8192.min(((64 << 20) - at) as usize)]).unwrap();
        }
        drop(f);
        copy_sparse(&src, &dst).unwrap();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        std::fs::File::open(&src).unwrap().read_to_end(&mut a).unwrap();
        std::fs::File::open(&dst).unwrap().read_to_end(&mut b).unwrap();
        assert_eq!(a.len(), 64 << 20);
        assert!(a == b, "the copy differs");
        use std::os::unix::fs::MetadataExt;
        let blocks = std::fs::metadata(&dst).unwrap().blocks() * 512;
        assert!(
            blocks < 4 << 20,
            "the copy allocated {blocks} bytes: its holes were filled"
        );
    }
}
