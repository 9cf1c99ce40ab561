//! The jail every QEMU runs in: defense in depth under the guest boundary, so that a guest
//! that broke out of its VM into QEMU would still hold nothing.
//!
//! - **A user of its own.** When farm runs as root, each QEMU gets a uid nobody else has
//!   (allocated from [`UID_BASE`] with a lock file, so concurrent farm processes never share
//!   one) and no groups but, under KVM, `/dev/kvm`'s. QEMUs of one uid could read each
//!   other's memory through `/proc`; of different uids they cannot.
//! - **Nothing inherited.** A scrubbed environment and no descriptors but the ones it is
//!   given (see `process.rs`); every file it needs is passed as a descriptor and named
//!   `/proc/self/fd/N`, so it needs no access to the paths (root's cache is mode 0700).
//! - **seccomp.** `-sandbox on` with spawning, privilege elevation, obsolete calls and
//!   resource control denied ([`SANDBOX`]); migration goes through descriptors, not `exec:`.
//! - **rlimits.** No core dumps, a file size cap, an open-file limit.
//! - **A read-only snapshot.** A fork's RAM file belongs to root with mode 0444; QEMU 7.2
//!   asks for it read-write even for a private mapping, so a small preloaded shim turns that
//!   one open into a read-only one (the kernel, not the shim, is what refuses writes).
//! - **cgroups v2**, where the host has them with the memory and pids controllers: a group
//!   per VM with `memory.max` and `pids.max`. Where they are missing, the commands that start
//!   many VMs say so once ([`missing_cgroups_note`]).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The `-sandbox` option every QEMU gets.
pub const SANDBOX: &str = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

/// First uid handed to QEMU processes; [`UID_COUNT`] of them are used. Far above any real
/// user's and any subordinate-uid range's usual place.
pub const UID_BASE: u32 = 2_100_000_000;
pub const UID_COUNT: u32 = 65_536;

/// Open files a QEMU may hold.
pub const MAX_OPEN_FILES: u64 = 1024;
/// Threads and processes a QEMU may have (its cgroup's pids.max).
pub const MAX_PIDS: u64 = 256;

/// A uid held by one QEMU for its life: the lock is released when this is dropped (or when
/// farm dies, by the kernel).
#[derive(Debug)]
pub struct VmUser {
    pub uid: u32,
    _lock: nix::fcntl::Flock<File>,
}

impl VmUser {
    /// Takes the lowest free uid of the range, marking it in `lock_dir` (lock files are
    /// never removed, which would race with another process taking the same one; taking the
    /// lowest keeps their number at the most VMs ever alive at once).
    pub fn allocate(lock_dir: &Path) -> std::io::Result<VmUser> {
        std::fs::create_dir_all(lock_dir)?;
        for step in 0..UID_COUNT {
            let uid = UID_BASE + step;
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(lock_dir.join(format!("{uid}.lock")))?;
            match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(VmUser { uid, _lock: lock }),
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => continue,
                Err((_, e)) => return Err(e.into()),
            }
        }
        Err(std::io::Error::other("every uid of the QEMU range is in use"))
    }
}

/// Who QEMU runs as and the limits it runs under.
#[derive(Debug, Clone, Default)]
pub struct Confinement {
    /// uid and gid to switch to (None: stay as the caller, who is not root).
    pub uid: Option<u32>,
    /// Supplementary groups (the group of /dev/kvm under KVM).
    pub groups: Vec<u32>,
    /// RLIMIT_FSIZE.
    pub max_file_bytes: u64,
    /// A cgroup's `cgroup.procs` to join before dropping privileges.
    pub cgroup_procs: Option<PathBuf>,
    /// Same-page merging of the process's memory, and its address space layout.
    pub ksm: crate::Ksm,
}

/// Whether the current process may switch users.
pub fn running_as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// cgroup v2 support on this host, probed once.
#[derive(Debug, Clone)]
pub enum Cgroups {
    /// The folder farm's per-VM groups go in (memory and pids controllers enabled).
    Available(PathBuf),
    /// Why not, said once.
    Missing(String),
}

static CGROUPS: OnceLock<Cgroups> = OnceLock::new();

/// The host's cgroup v2 support, probed once per process.
pub fn cgroups() -> &'static Cgroups {
    CGROUPS.get_or_init(|| {
        match find_cgroup2_mount(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default()) {
            Some(mount) => prepare_parent(&mount),
            None => Cgroups::Missing("no cgroup v2 file system is mounted".into()),
        }
    })
}

/// What to tell the user, once, when VMs run without cgroup limits on this host.
pub fn missing_cgroups_note() -> Option<String> {
    match cgroups() {
        Cgroups::Missing(reason) => Some(format!(
            "note: QEMU processes run without per-VM cgroup limits (memory.max, pids.max): {reason}"
        )),
        Cgroups::Available(_) => None,
    }
}

/// The mount point of the cgroup v2 hierarchy, from /proc/self/mountinfo.
pub fn find_cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        if right.split_whitespace().next() == Some("cgroup2") {
            return left.split_whitespace().nth(4).map(PathBuf::from);
        }
    }
    None
}

/// Makes `<mount>/farm` with the memory and pids controllers enabled for its children.
pub fn prepare_parent(mount: &Path) -> Cgroups {
    let controllers = std::fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
    let have: Vec<&str> = controllers.split_whitespace().collect();
    for needed in ["memory", "pids"] {
        if !have.contains(&needed) {
            return Cgroups::Missing(format!(
                "the cgroup v2 hierarchy at {} has no {needed} controller (controllers: {:?}; this host uses cgroup v1 for it)",
                mount.display(),
                controllers.trim()
            ));
        }
    }
    let parent = mount.join("farm");
    let enable = |dir: &Path| std::fs::write(dir.join("cgroup.subtree_control"), "+memory +pids");
    let result = enable(mount)
        .and_then(|_| std::fs::create_dir_all(&parent))
        .and_then(|_| enable(&parent));
    match result {
        Ok(()) => Cgroups::Available(parent),
        Err(e) => Cgroups::Missing(format!("cannot set up {}: {e}", parent.display())),
    }
}

/// A per-VM cgroup, removed when dropped (after its QEMU is gone).
#[derive(Debug)]
pub struct VmCgroup {
    path: PathBuf,
}

impl VmCgroup {
    /// Creates `<parent>/<name>` with the given limits.
    pub fn create(parent: &Path, name: &str, memory_max: u64, pids_max: u64) -> std::io::Result<VmCgroup> {
        let path = parent.join(name);
        std::fs::create_dir_all(&path)?;
        let group = VmCgroup { path };
        std::fs::write(group.path.join("memory.max"), memory_max.to_string())?;
        std::fs::write(group.path.join("pids.max"), pids_max.to_string())?;
        Ok(group)
    }

    pub fn procs(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }
}

impl Drop for VmCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// The group that may open /dev/kvm, when it is not root's.
pub fn kvm_group() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata("/dev/kvm").ok()?;
    (meta.gid() != 0 && meta.mode() & 0o060 == 0o060).then_some(meta.gid())
}

/// Whether anyone may open /dev/kvm.
pub fn kvm_open_to_all() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/dev/kvm").is_ok_and(|m| m.mode() & 0o006 == 0o006)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_mount_is_found_in_mountinfo() {
        let v1 = "35 25 0:30 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n";
        assert_eq!(find_cgroup2_mount(v1), None);
        let hybrid = format!("{v1}40 25 0:35 / /sys/fs/cgroup/unified rw,relatime shared:14 - cgroup2 cgroup2 rw\n");
        assert_eq!(
            find_cgroup2_mount(&hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn a_hierarchy_without_the_controllers_is_reported_and_one_with_them_is_set_up() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.controllers"), "cpu io\n").unwrap();
        let Cgroups::Missing(reason) = prepare_parent(dir.path()) else {
            panic!("no memory controller")
        };
        assert!(reason.contains("memory"), "{reason}");
        std::fs::write(dir.path().join("cgroup.controllers"), "cpu io memory pids\n").unwrap();
        let Cgroups::Available(parent) = prepare_parent(dir.path()) else {
            panic!("controllers present")
        };
        assert_eq!(
            std::fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap(),
            "+memory +pids"
        );
        let group = VmCgroup::create(&parent, "vm-1", 300 << 20, MAX_PIDS).unwrap();
        assert_eq!(
            std::fs::read_to_string(parent.join("vm-1/memory.max")).unwrap(),
            (300u64 << 20).to_string()
        );
        assert_eq!(std::fs::read_to_string(parent.join("vm-1/pids.max")).unwrap(), "256");
        assert_eq!(group.procs(), parent.join("vm-1/cgroup.procs"));
    }

    #[test]
    fn uids_are_not_shared_while_held() {
        let dir = tempfile::tempdir().unwrap();
        let users: Vec<VmUser> = (0..20).map(|_| VmUser::allocate(dir.path()).unwrap()).collect();
        let mut uids: Vec<u32> = users.iter().map(|u| u.uid).collect();
        uids.sort();
        uids.dedup();
        assert_eq!(uids.len(), 20);
        assert!(uids.iter().all(|u| (UID_BASE..UID_BASE + UID_COUNT).contains(u)));
    }
}
