//! Snapshot directories and the store that holds them.
//!
//! ```text
//! $FARM_CACHE_DIR/snapshots/
//!   <id>/
//!     manifest.json   what the snapshot is: format version, template config and digests,
//!                     kernel/image/agent keys, QEMU version, accelerator, CPU model, parent
//!     state.bin       device and CPU state (see statefile.rs), checksummed
//!     memory          guest RAM, mapped MAP_PRIVATE by forks
//!     disk.qcow2      the guest disk at snapshot time (qcow2 over the image or the parent's disk)
//!     overlay.qcow2   an empty overlay over disk.qcow2, copied for each fork
//!     console.log     the serial console up to the snapshot
//!   .staging-*/       snapshots being built (removed on failure or by gc)
//!   .lock-<id>        held (flock) while a process builds <id>; removed when it is done
//!   .pins/<digest>.json  {"snapshot", "holder"}: a snapshot something outside the store
//!                     still needs (a paused session's folder, the holder): `gc` keeps it
//!                     while the holder exists, and removes the pin once it is gone
//! ```
//!
//! Processes that share a store (shards on one machine, nodes on a shared file system) build
//! each id once: the first takes the id's lock, the others wait for it and then reuse the
//! snapshot it published. A process that dies holding the lock loses it with its descriptors.
//!
//! A snapshot is complete when its `manifest.json` exists: it is written last, by rename.
//! After that every file is read-only (mode 0444) and never changes: a MAP_PRIVATE mapping
//! would see later changes to the file.
//!
//! The build lock is in `lock.rs`, pins in `pins.rs`.

mod lock;
mod pins;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use vmm::artifacts::Artifact;
use vmm::Accel;

use crate::statefile;
use crate::template::{hex, TemplateConfig};

pub use lock::{BuildLock, Claim};

/// Version of the snapshot directory layout and manifest.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 3;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotManifest {
    pub format_version: u32,
    pub id: String,
    /// Seconds since the UNIX epoch.
    pub created_unix: u64,
    /// A human label (template name, task id, ...).
    pub label: String,
    /// The template this snapshot descends from.
    pub template: TemplateConfig,
    pub template_digest: String,
    /// The snapshot this one was forked from (None for a template).
    pub parent: Option<String>,
    pub kernel: Artifact,
    pub image: Artifact,
    pub agent_key: String,
    pub qemu_version: String,
    pub accel: Accel,
    pub cpu_model: String,
    pub memory_mib: u32,
    pub cpus: u32,
    /// Size and SHA-256 of each file, as written.
    pub files: BTreeMap<String, FileRecord>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRecord {
    pub bytes: u64,
    pub sha256: String,
}

/// The host facts a snapshot must match to be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostProfile {
    pub qemu_version: String,
    pub accel: Accel,
    pub cpu_model: String,
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot {id} not found in {root} (see `farm snapshot ls`)")]
    NotFound { id: String, root: String },
    #[error("snapshot {id} is incomplete or damaged: {detail}; remove it with `farm snapshot rm {id}` and rebuild")]
    Damaged { id: String, detail: String },
    #[error("snapshot {id} was made on another host setup: {detail}; rebuild it here with `farm template build`")]
    Mismatch { id: String, detail: String },
    #[error(transparent)]
    StateFile(#[from] statefile::StateFileError),
    #[error("{what} failed")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("snapshot {id} has children ({children}); remove them first")]
    HasChildren { id: String, children: String },
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SnapshotError {
    let what = what.into();
    move |source| SnapshotError::Io { what, source }
}

/// A complete snapshot on disk.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub dir: PathBuf,
    pub manifest: SnapshotManifest,
}

impl Snapshot {
    pub fn id(&self) -> &str {
        &self.manifest.id
    }
    pub fn state_path(&self) -> PathBuf {
        self.dir.join("state.bin")
    }
    pub fn memory_path(&self) -> PathBuf {
        self.dir.join("memory")
    }
    pub fn disk_path(&self) -> PathBuf {
        self.dir.join("disk.qcow2")
    }
    pub fn overlay_template_path(&self) -> PathBuf {
        self.dir.join("overlay.qcow2")
    }

    /// Refuses a snapshot made with another QEMU, accelerator or CPU model.
    pub fn check_host(&self, host: &HostProfile) -> Result<(), SnapshotError> {
        let m = &self.manifest;
        let mut diffs = Vec::new();
        if m.qemu_version != host.qemu_version {
            diffs.push(format!("QEMU {:?} (here {:?})", m.qemu_version, host.qemu_version));
        }
        if m.accel != host.accel {
            diffs.push(format!("accelerator {} (here {})", m.accel, host.accel));
        }
        if m.cpu_model != host.cpu_model {
            diffs.push(format!("CPU model {} (here {})", m.cpu_model, host.cpu_model));
        }
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(SnapshotError::Mismatch {
                id: m.id.clone(),
                detail: format!("made with {}", diffs.join(", ")),
            })
        }
    }

    /// Fast integrity check done before every fork: files present with their recorded
    /// sizes, the state file's header and checksum.
    pub fn check_files(&self) -> Result<(), SnapshotError> {
        for (name, record) in &self.manifest.files {
            let path = self.dir.join(name);
            let meta = std::fs::metadata(&path).map_err(|e| SnapshotError::Damaged {
                id: self.id().to_string(),
                detail: format!("{name}: {e}"),
            })?;
            if meta.len() != record.bytes {
                return Err(SnapshotError::Damaged {
                    id: self.id().to_string(),
                    detail: format!("{name} is {} bytes, the manifest says {}", meta.len(), record.bytes),
                });
            }
        }
        statefile::verify(&self.state_path()).map_err(|e| SnapshotError::Damaged {
            id: self.id().to_string(),
            detail: e.to_string(),
        })?;
        Ok(())
    }

    /// Full check: every file's SHA-256 against the manifest.
    pub fn verify_checksums(&self) -> Result<(), SnapshotError> {
        for (name, record) in &self.manifest.files {
            let digest = sha256_file(&self.dir.join(name))?;
            if digest != record.sha256 {
                return Err(SnapshotError::Damaged {
                    id: self.id().to_string(),
                    detail: format!("{name} checksum mismatch"),
                });
            }
        }
        Ok(())
    }
}

pub fn sha256_file(path: &Path) -> Result<String, SnapshotError> {
    let mut file = std::fs::File::open(path).map_err(io_err(format!("opening {}", path.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(io_err(format!("reading {}", path.display())))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

/// The folder of snapshots.
#[derive(Debug, Clone)]
pub struct SnapshotStore {
    root: PathBuf,
}

impl SnapshotStore {
    pub fn new(root: PathBuf) -> SnapshotStore {
        SnapshotStore { root }
    }

    /// `FARM_SNAPSHOT_DIR`, or `$FARM_CACHE_DIR/snapshots`.
    pub fn default_location() -> SnapshotStore {
        match std::env::var_os("FARM_SNAPSHOT_DIR") {
            Some(dir) => SnapshotStore::new(dir.into()),
            None => SnapshotStore::new(vmm::artifacts::cache_dir().join("snapshots")),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn path_of(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// Loads a complete snapshot's manifest (no host or file checks).
    pub fn get(&self, id: &str) -> Result<Snapshot, SnapshotError> {
        if id.is_empty() || id.contains('/') || id.starts_with('.') {
            return Err(SnapshotError::NotFound {
                id: id.to_string(),
                root: self.root.display().to_string(),
            });
        }
        let dir = self.path_of(id);
        let manifest_path = dir.join("manifest.json");
        let text = match std::fs::read_to_string(&manifest_path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(SnapshotError::NotFound {
                    id: id.to_string(),
                    root: self.root.display().to_string(),
                })
            }
            Err(e) => {
                return Err(SnapshotError::Damaged {
                    id: id.to_string(),
                    detail: format!("manifest.json: {e}"),
                })
            }
        };
        let manifest: SnapshotManifest = serde_json::from_str(&text).map_err(|e| SnapshotError::Damaged {
            id: id.to_string(),
            detail: format!("manifest.json: {e}"),
        })?;
        if manifest.format_version != SNAPSHOT_FORMAT_VERSION {
            return Err(SnapshotError::Damaged {
                id: id.to_string(),
                detail: format!(
                    "format version {} (this farm reads {SNAPSHOT_FORMAT_VERSION})",
                    manifest.format_version
                ),
            });
        }
        if manifest.id != id {
            return Err(SnapshotError::Damaged {
                id: id.to_string(),
                detail: format!("manifest names id {}", manifest.id),
            });
        }
        Ok(Snapshot { dir, manifest })
    }

    /// Loads a snapshot and checks it can be forked on this host.
    pub fn open(&self, id: &str, host: &HostProfile) -> Result<Snapshot, SnapshotError> {
        let snapshot = self.get(id)?;
        snapshot.check_host(host)?;
        snapshot.check_files()?;
        Ok(snapshot)
    }

    /// Every complete snapshot, oldest first; damaged ones are reported separately.
    pub fn list(&self) -> (Vec<Snapshot>, Vec<(String, SnapshotError)>) {
        let mut good = Vec::new();
        let mut bad = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return (good, bad);
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with('.') || !entry.path().is_dir() {
                continue;
            }
            match self.get(&name) {
                Ok(s) => good.push(s),
                Err(e) => bad.push((name, e)),
            }
        }
        good.sort_by_key(|s| (s.manifest.created_unix, s.manifest.id.clone()));
        (good, bad)
    }

    /// Removes a snapshot that no other snapshot descends from.
    pub fn remove(&self, id: &str) -> Result<(), SnapshotError> {
        let dir = self.path_of(id);
        if !dir.is_dir() || id.starts_with('.') || id.contains('/') {
            return Err(SnapshotError::NotFound {
                id: id.to_string(),
                root: self.root.display().to_string(),
            });
        }
        let (all, _) = self.list();
        let children: Vec<&str> = all
            .iter()
            .filter(|s| s.manifest.parent.as_deref() == Some(id))
            .map(|s| s.id())
            .collect();
        if !children.is_empty() {
            return Err(SnapshotError::HasChildren {
                id: id.to_string(),
                children: children.join(", "),
            });
        }
        remove_tree(&dir)
    }

    /// Removes staging leftovers, damaged snapshots, and complete snapshots that are neither
    /// in `keep` (the templates still referred to) or pinned ([`pin`](Self::pin)), nor an
    /// ancestor of one that is.
    /// Returns the removed ids (with `dry_run`, those that would be removed).
    pub fn gc(&self, keep: &BTreeSet<String>, dry_run: bool) -> Result<Vec<String>, SnapshotError> {
        let remove = |path: &Path| if dry_run { Ok(()) } else { remove_tree(path) };
        let mut keep = keep.clone();
        keep.extend(self.pinned(dry_run));
        let keep = &keep;
        let mut removed = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&self.root) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().to_string();
                if name.starts_with(".staging-") && staging_owner_is_dead(&name) {
                    remove(&entry.path())?;
                    removed.push(name);
                }
            }
        }
        let (all, damaged) = self.list();
        for (id, _) in damaged {
            remove(&self.path_of(&id))?;
            removed.push(id);
        }
        let parents: BTreeMap<String, Option<String>> = all
            .iter()
            .map(|s| (s.manifest.id.clone(), s.manifest.parent.clone()))
            .collect();
        let mut live = BTreeSet::new();
        for id in keep {
            let mut cursor = Some(id.clone());
            while let Some(current) = cursor {
                if !live.insert(current.clone()) {
                    break;
                }
                cursor = parents.get(&current).cloned().flatten();
            }
        }
        // Children before parents, so a removal never strands a child.
        let mut doomed: Vec<&Snapshot> = all.iter().filter(|s| !live.contains(s.id())).collect();
        doomed.sort_by_key(|s| std::cmp::Reverse(depth(&parents, s.id())));
        for s in doomed {
            remove(&s.dir)?;
            removed.push(s.id().to_string());
        }
        Ok(removed)
    }

    /// A fresh staging folder for a snapshot being built.
    pub fn staging_dir(&self, label: &str) -> Result<PathBuf, SnapshotError> {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let safe: String = label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(32)
            .collect();
        let dir = self.root.join(format!(".staging-{}-{n}-{safe}", std::process::id()));
        let _ = remove_tree(&dir);
        std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        Ok(dir)
    }

    /// Makes a staging folder the snapshot `manifest.id`: records file sizes and checksums,
    /// freezes every file read-only, writes the manifest last and renames into place. If a
    /// snapshot with that id appeared meanwhile, the staging folder is discarded and the
    /// existing snapshot returned.
    pub fn commit(&self, staging: &Path, mut manifest: SnapshotManifest) -> Result<Snapshot, SnapshotError> {
        for name in ["state.bin", "memory", "disk.qcow2", "overlay.qcow2"] {
            let path = staging.join(name);
            let bytes = std::fs::metadata(&path)
                .map_err(io_err(format!("reading {}", path.display())))?
                .len();
            manifest.files.insert(
                name.to_string(),
                FileRecord {
                    bytes,
                    sha256: sha256_file(&path)?,
                },
            );
        }
        let final_dir = self.path_of(&manifest.id);
        if let Ok(existing) = self.get(&manifest.id) {
            if existing.check_files().is_ok() {
                // Someone else finished the same snapshot first: theirs is as good.
                let _ = remove_tree(staging);
                return Ok(existing);
            }
        }
        let text = serde_json::to_string_pretty(&manifest).expect("manifest serializes");
        let tmp = staging.join("manifest.json.tmp");
        std::fs::write(&tmp, text).map_err(io_err("writing manifest.json"))?;
        std::fs::rename(&tmp, staging.join("manifest.json")).map_err(io_err("renaming manifest.json"))?;
        for entry in std::fs::read_dir(staging)
            .map_err(io_err("listing the staging folder"))?
            .flatten()
        {
            let file =
                std::fs::File::open(entry.path()).map_err(io_err(format!("opening {}", entry.path().display())))?;
            file.sync_all()
                .map_err(io_err(format!("syncing {}", entry.path().display())))?;
            // The QEMU that wrote the RAM file and the disk ran as a uid of its own: from now
            // on they are root's, read-only to everyone, so no fork's QEMU can write them.
            if vmm::jail::running_as_root() {
                std::os::unix::fs::chown(entry.path(), Some(0), Some(0))
                    .map_err(io_err(format!("giving {} to root", entry.path().display())))?;
            }
            set_mode(&entry.path(), 0o444)?;
        }
        // An incomplete leftover under the same id (callers hold the id's build lock, so
        // no one else is publishing it now).
        let _ = remove_tree(&final_dir);
        std::fs::rename(staging, &final_dir).map_err(io_err(format!("renaming into {}", final_dir.display())))?;
        Ok(Snapshot {
            dir: final_dir,
            manifest,
        })
    }
}

fn depth(parents: &BTreeMap<String, Option<String>>, id: &str) -> usize {
    let mut d = 0;
    let mut cursor = parents.get(id).cloned().flatten();
    while let Some(p) = cursor {
        d += 1;
        if d > 10_000 {
            break;
        }
        cursor = parents.get(&p).cloned().flatten();
    }
    d
}

fn staging_owner_is_dead(name: &str) -> bool {
    let pid = name.trim_start_matches(".staging-").split('-').next().unwrap_or("");
    pid.parse::<u32>()
        .map(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        .unwrap_or(true)
}

fn set_mode(path: &Path, mode: u32) -> Result<(), SnapshotError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io_err(format!("chmod {}", path.display())))
}

/// Removes a folder whose files are read-only.
pub(crate) fn remove_tree(dir: &Path) -> Result<(), SnapshotError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(SnapshotError::Io {
            what: format!("removing {}", dir.display()),
            source: e,
        }),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn manifest(id: &str, parent: Option<&str>, created: u64) -> SnapshotManifest {
        SnapshotManifest {
            format_version: SNAPSHOT_FORMAT_VERSION,
            id: id.to_string(),
            created_unix: created,
            label: "t".into(),
            template: TemplateConfig::of_image("minimal"),
            template_digest: "d".into(),
            parent: parent.map(str::to_string),
            kernel: Artifact {
                path: "/k".into(),
                key: "k".into(),
            },
            image: Artifact {
                path: "/i".into(),
                key: "i".into(),
            },
            agent_key: "a".into(),
            qemu_version: "QEMU 7.2".into(),
            accel: Accel::Tcg,
            cpu_model: "max".into(),
            memory_mib: 256,
            cpus: 1,
            files: BTreeMap::new(),
        }
    }

    fn fake_snapshot(store: &SnapshotStore, id: &str, parent: Option<&str>, created: u64) -> Snapshot {
        let staging = store.staging_dir(id).unwrap();
        let raw = staging.join("raw");
        std::fs::write(&raw, b"state").unwrap();
        statefile::write(&raw, &staging.join("state.bin")).unwrap();
        std::fs::remove_file(&raw).unwrap();
        for name in ["memory", "disk.qcow2", "overlay.qcow2"] {
            std::fs::write(staging.join(name), name).unwrap();
        }
        store.commit(&staging, manifest(id, parent, created)).unwrap()
    }

    fn host() -> HostProfile {
        HostProfile {
            qemu_version: "QEMU 7.2".into(),
            accel: Accel::Tcg,
            cpu_model: "max".into(),
        }
    }

    #[test]
    fn manifest_round_trips_through_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::new(dir.path().to_path_buf());
        let made = fake_snapshot(&store, "abc", None, 1);
        let loaded = store.open("abc", &host()).unwrap();
        assert_eq!(loaded.manifest, made.manifest);
        assert_eq!(loaded.manifest.files.len(), 4);
        loaded.verify_checksums().unwrap();
        // Frozen: every file is read-only.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(loaded.memory_path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o444);
    }

    #[test]
    fn host_mismatch_is_refused_with_the_difference() {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::new(dir.path().to_path_buf());
        fake_snapshot(&store, "abc", None, 1);
        let other = HostProfile {
            qemu_version: "QEMU 9.0".into(),
            accel: Accel::Kvm,
            cpu_model: "host".into(),
        };
        let err = store.open("abc", &other).unwrap_err().to_string();
        assert!(
            err.contains("QEMU 9.0") && err.contains("accelerator tcg") && err.contains("CPU model max"),
            "{err}"
        );
    }

    #[test]
    fn missing_or_resized_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::new(dir.path().to_path_buf());
        let s = fake_snapshot(&store, "abc", None, 1);
        std::fs::remove_file(s.memory_path()).unwrap();
        let err = store.open("abc", &host()).unwrap_err().to_string();
        assert!(err.contains("memory") && err.contains("farm snapshot rm abc"), "{err}");
        let s = fake_snapshot(&store, "def", None, 1);
        std::fs::remove_file(s.disk_path()).unwrap();
        std::fs::write(s.disk_path(), "longer than before").unwrap();
        assert!(matches!(store.open("def", &host()), Err(SnapshotError::Damaged { .. })));
        assert!(matches!(
            store.open("nope", &host()),
            Err(SnapshotError::NotFound { .. })
        ));
    }

    #[test]
    fn rm_refuses_parents_and_gc_keeps_ancestors_of_kept_snapshots() {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::new(dir.path().to_path_buf());
        fake_snapshot(&store, "root", None, 1);
        fake_snapshot(&store, "child", Some("root"), 2);
        fake_snapshot(&store, "grandchild", Some("child"), 3);
        fake_snapshot(&store, "orphan-template", None, 4);
        fake_snapshot(&store, "unused-child", Some("root"), 5);
        assert!(matches!(store.remove("root"), Err(SnapshotError::HasChildren { .. })));
        std::fs::create_dir_all(dir.path().join(".staging-999999999-0-x")).unwrap();
        let planned = store.gc(&BTreeSet::from(["grandchild".to_string()]), true).unwrap();
        assert_eq!(store.list().0.len(), 5, "a dry run removed something");
        let removed = store.gc(&BTreeSet::from(["grandchild".to_string()]), false).unwrap();
        assert_eq!(planned, removed);
        let removed: BTreeSet<_> = removed.into_iter().collect();
        assert!(
            removed.contains("orphan-template")
                && removed.contains("unused-child")
                && removed.contains(".staging-999999999-0-x")
        );
        let left: BTreeSet<_> = store.list().0.iter().map(|s| s.id().to_string()).collect();
        assert_eq!(
            left,
            BTreeSet::from(["root".into(), "child".into(), "grandchild".into()])
        );
        store.remove("grandchild").unwrap();
        assert!(matches!(store.get("grandchild"), Err(SnapshotError::NotFound { .. })));
    }

    #[test]
    fn gc_keeps_what_a_living_holder_pinned_and_forgets_pins_of_holders_gone() {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::new(dir.path().join("store"));
        fake_snapshot(&store, "task", None, 1);
        fake_snapshot(&store, "other", None, 2);
        let holder = dir.path().join("paused-session");
        std::fs::create_dir_all(&holder).unwrap();
        store.pin("task", &holder).unwrap();
        let removed = store.gc(&BTreeSet::new(), false).unwrap();
        assert_eq!(removed, vec!["other".to_string()]);
        assert!(store.get("task").is_ok());
        std::fs::remove_dir(&holder).unwrap();
        assert_eq!(store.gc(&BTreeSet::new(), false).unwrap(), vec!["task".to_string()]);
        assert_eq!(
            std::fs::read_dir(dir.path().join("store/.pins")).unwrap().count(),
            0,
            "the stale pin is gone"
        );
        store.pin("x", &holder).unwrap();
        store.unpin(&holder);
        assert_eq!(std::fs::read_dir(dir.path().join("store/.pins")).unwrap().count(), 0);
    }
}
