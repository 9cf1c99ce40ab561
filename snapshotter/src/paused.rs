//! A paused fork's state, kept small: a snapshot of the fork (see [`crate::snapshot_fork`])
//! whose RAM is stored as the pages that differ from a base snapshot's RAM, and whose disk is
//! a qcow2 over the base's disk. The base is the task snapshot the fork descends from, so a
//! paused session stores what it changed, not a RAM image.
//!
//! ```text
//! <snapshot dir>/
//!   manifest.json    the snapshot's manifest: `parent` is the base; `files.memory` records
//!                    the full RAM's size and SHA-256, which a rebuild must match
//!   memory.diff      "FARMMDIF", u32 version, u32 page size, u64 RAM bytes, then records:
//!                    u64 page index + one page of bytes, for each page unlike the base's
//!   disk.qcow2       over the base's disk.qcow2
//!   state.bin, overlay.qcow2, console.log   as in any snapshot
//! ```
//!
//! [`rebuild_memory`] writes `memory` back (the base's RAM with the pages applied, checked
//! against the manifest's SHA-256) before the snapshot is forked; the fork maps it, and the
//! caller removes it again once the fork runs.

use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::store::{io_err, sha256_file, FileRecord, Snapshot, SnapshotError};

const MAGIC: &[u8; 8] = b"FARMMDIF";
const VERSION: u32 = 1;
const PAGE: usize = 4096;

/// What packing left on disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Packed {
    /// Pages of RAM unlike the base's.
    pub pages: u64,
    /// The guest's RAM size.
    pub memory_bytes: u64,
}

/// Turns a just-committed snapshot of a fork into its paused form against `base` (the task
/// snapshot it descends from, through `snapshot`'s parents): the disk rebased onto the
/// base's disk when the parent is another snapshot, the RAM replaced by its differing pages.
/// The manifest is rewritten to match (parent = base).
pub fn pack(snapshot: &mut Snapshot, base: &Snapshot) -> Result<Packed, SnapshotError> {
    let dir = snapshot.dir.clone();
    let disk = snapshot.disk_path();
    if snapshot.manifest.parent.as_deref() != Some(base.id()) {
        // Safe mode: qemu-img compares against the old chain and copies what differs.
        set_writable(&disk)?;
        let out = std::process::Command::new("qemu-img")
            .args(["rebase", "-f", "qcow2", "-F", "qcow2", "-b"])
            .arg(base.disk_path())
            .arg(&disk)
            .output()
            .map_err(io_err("running qemu-img rebase"))?;
        if !out.status.success() {
            return Err(SnapshotError::Io {
                what: format!("qemu-img rebase: {}", String::from_utf8_lossy(&out.stderr).trim()),
                source: std::io::Error::other("rebase failed"),
            });
        }
        let bytes = std::fs::metadata(&disk)
            .map_err(io_err("reading the rebased disk"))?
            .len();
        snapshot.manifest.files.insert(
            "disk.qcow2".into(),
            FileRecord {
                bytes,
                sha256: sha256_file(&disk)?,
            },
        );
        snapshot.manifest.parent = Some(base.id().to_string());
    }
    let memory = snapshot.memory_path();
    let packed = write_diff(&base.memory_path(), &memory, &dir.join("memory.diff"))?;
    std::fs::remove_file(&memory).map_err(io_err("removing the full RAM file"))?;
    write_manifest(snapshot)?;
    Ok(packed)
}

/// Writes `memory` of a packed snapshot back from `base`'s RAM and `memory.diff`, and checks
/// it against the manifest. Returns at once when it is there already.
pub fn rebuild_memory(snapshot: &Snapshot, base: &Snapshot) -> Result<(), SnapshotError> {
    let memory = snapshot.memory_path();
    let record = snapshot
        .manifest
        .files
        .get("memory")
        .ok_or_else(|| damaged(snapshot, "the manifest has no memory record"))?;
    if std::fs::metadata(&memory).is_ok_and(|m| m.len() == record.bytes) {
        return Ok(());
    }
    let tmp = snapshot.dir.join("memory.rebuilding");
    let _ = std::fs::remove_file(&tmp);
    std::fs::copy(base.memory_path(), &tmp).map_err(io_err(format!("copying {}", base.memory_path().display())))?;
    let result = apply_diff(snapshot, &snapshot.dir.join("memory.diff"), &tmp, record.bytes);
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let sha = sha256_file(&tmp)?;
    if sha != record.sha256 {
        let _ = std::fs::remove_file(&tmp);
        return Err(damaged(
            snapshot,
            &format!(
                "the rebuilt RAM's SHA-256 is {}, the manifest says {}",
                &sha[..12],
                &record.sha256[..12.min(record.sha256.len())]
            ),
        ));
    }
    std::fs::rename(&tmp, &memory).map_err(io_err("renaming the rebuilt RAM"))
}

fn damaged(snapshot: &Snapshot, detail: &str) -> SnapshotError {
    SnapshotError::Damaged {
        id: snapshot.id().to_string(),
        detail: detail.to_string(),
    }
}

fn set_writable(path: &Path) -> Result<(), SnapshotError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
        .map_err(io_err(format!("chmod {}", path.display())))
}

fn write_manifest(snapshot: &Snapshot) -> Result<(), SnapshotError> {
    let path = snapshot.dir.join("manifest.json");
    let tmp = snapshot.dir.join("manifest.json.tmp");
    let text = serde_json::to_string_pretty(&snapshot.manifest).expect("manifest serializes");
    std::fs::write(&tmp, text).map_err(io_err("writing manifest.json"))?;
    std::fs::rename(&tmp, &path).map_err(io_err("renaming manifest.json"))
}

/// The pages of `full` unlike `base`'s, into `out`.
fn write_diff(base: &Path, full: &Path, out: &Path) -> Result<Packed, SnapshotError> {
    let open = |p: &Path| std::fs::File::open(p).map_err(io_err(format!("opening {}", p.display())));
    let memory_bytes = std::fs::metadata(full)
        .map_err(io_err(format!("reading {}", full.display())))?
        .len();
    let base_bytes = std::fs::metadata(base)
        .map_err(io_err(format!("reading {}", base.display())))?
        .len();
    if base_bytes != memory_bytes {
        return Err(SnapshotError::Io {
            what: format!("the base RAM is {base_bytes} bytes and the fork's {memory_bytes}"),
            source: std::io::Error::other("RAM sizes differ"),
        });
    }
    let (mut a, mut b) = (
        BufReader::with_capacity(1 << 20, open(base)?),
        BufReader::with_capacity(1 << 20, open(full)?),
    );
    let file = std::fs::File::create(out).map_err(io_err(format!("creating {}", out.display())))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let write =
        |w: &mut BufWriter<std::fs::File>, bytes: &[u8]| w.write_all(bytes).map_err(io_err("writing memory.diff"));
    write(&mut w, MAGIC)?;
    write(&mut w, &VERSION.to_le_bytes())?;
    write(&mut w, &(PAGE as u32).to_le_bytes())?;
    write(&mut w, &memory_bytes.to_le_bytes())?;
    let (mut pa, mut pb) = (vec![0u8; PAGE], vec![0u8; PAGE]);
    let mut pages = 0u64;
    for index in 0..memory_bytes.div_ceil(PAGE as u64) {
        let len = (memory_bytes - index * PAGE as u64).min(PAGE as u64) as usize;
        a.read_exact(&mut pa[..len]).map_err(io_err("reading the base RAM"))?;
        b.read_exact(&mut pb[..len]).map_err(io_err("reading the fork's RAM"))?;
        if pa[..len] != pb[..len] {
            pb[len..].fill(0);
            write(&mut w, &index.to_le_bytes())?;
            write(&mut w, &pb)?;
            pages += 1;
        }
    }
    let file = w.into_inner().map_err(|e| SnapshotError::Io {
        what: "writing memory.diff".into(),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(io_err("syncing memory.diff"))?;
    Ok(Packed { pages, memory_bytes })
}

/// Applies `diff` onto `target` (a copy of the base RAM).
fn apply_diff(snapshot: &Snapshot, diff: &Path, target: &Path, memory_bytes: u64) -> Result<(), SnapshotError> {
    let file = std::fs::File::open(diff).map_err(io_err(format!("opening {}", diff.display())))?;
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut header = [0u8; 24];
    r.read_exact(&mut header)
        .map_err(|_| damaged(snapshot, "memory.diff is shorter than its header"))?;
    let word = |range: std::ops::Range<usize>| {
        u64::from_le_bytes({
            let mut b = [0u8; 8];
            b[..range.len()].copy_from_slice(&header[range]);
            b
        })
    };
    if &header[..8] != MAGIC
        || word(8..12) != VERSION as u64
        || word(12..16) != PAGE as u64
        || word(16..24) != memory_bytes
    {
        return Err(damaged(snapshot, "memory.diff has another format or RAM size"));
    }
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .open(target)
        .map_err(io_err(format!("opening {}", target.display())))?;
    let mut page = vec![0u8; PAGE];
    let mut index = [0u8; 8];
    loop {
        match r.read_exact(&mut index) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(io_err("reading memory.diff")(e)),
        }
        let at = u64::from_le_bytes(index) * PAGE as u64;
        r.read_exact(&mut page)
            .map_err(|_| damaged(snapshot, "memory.diff ends inside a page"))?;
        if at >= memory_bytes {
            return Err(damaged(snapshot, "memory.diff names a page past the RAM's end"));
        }
        let len = (memory_bytes - at).min(PAGE as u64) as usize;
        out.seek(SeekFrom::Start(at))
            .map_err(io_err("seeking in the rebuilt RAM"))?;
        out.write_all(&page[..len]).map_err(io_err("writing the rebuilt RAM"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diff_holds_the_changed_pages_and_rebuilds_the_ram_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let (base, full, diff, target) = (
            dir.path().join("base"),
            dir.path().join("full"),
            dir.path().join("memory.diff"),
            dir.path().join("target"),
        );
        let size = 64 * PAGE + 100; // a last, partial page
        let base_bytes: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let mut full_bytes = base_bytes.clone();
        full_bytes[5 * PAGE + 7] ^= 0xff;
        full_bytes[size - 1] ^= 0x01;
        full_bytes[20 * PAGE..21 * PAGE].fill(0);
        std::fs::write(&base, &base_bytes).unwrap();
        std::fs::write(&full, &full_bytes).unwrap();
        let packed = write_diff(&base, &full, &diff).unwrap();
        assert_eq!(
            packed,
            Packed {
                pages: 3,
                memory_bytes: size as u64
            }
        );
        assert_eq!(std::fs::metadata(&diff).unwrap().len(), 24 + 3 * (8 + PAGE as u64));
        std::fs::write(&target, &base_bytes).unwrap();
        let snapshot = Snapshot {
            dir: dir.path().to_path_buf(),
            manifest: crate::store::tests::manifest("p", None, 0),
        };
        apply_diff(&snapshot, &diff, &target, size as u64).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), full_bytes);
        // A truncated diff is damage, named.
        let bytes = std::fs::read(&diff).unwrap();
        std::fs::write(&diff, &bytes[..bytes.len() - 10]).unwrap();
        let err = apply_diff(&snapshot, &diff, &target, size as u64).unwrap_err();
        assert!(
            err.to_string().contains("damaged") || format!("{err:?}").contains("ends inside a page"),
            "{err:?}"
        );
    }
}
