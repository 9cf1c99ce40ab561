//! Kernel same-page merging (KSM) for QEMU's memory: an explicit choice, off by default.
//!
//! Forks of one snapshot write many pages to the same content: guest pages the kernel and
//! the agent touch after resume, QEMU's heap, and (when every QEMU loads its libraries at
//! the same addresses) the relocated data of the QEMU binary and its libraries. With KSM,
//! the kernel's `ksmd` merges such pages into one copy-on-write page.
//!
//! - [`Ksm::Off`]: no merging. QEMU's own default marks guest RAM mergeable; farm turns that
//!   off too (`mem-merge=off`), so a host that runs `ksmd` for other reasons does not merge
//!   farm's guests either.
//! - [`Ksm::On`]: every page of each QEMU may be merged (`PR_SET_MEMORY_MERGE`, set before
//!   QEMU starts, Linux 6.4 or later).
//! - [`Ksm::OnNoAslr`]: as `On`, and each QEMU starts without address space layout
//!   randomisation (`ADDR_NO_RANDOMIZE`), so that its libraries' relocated pointers, and
//!   much of its heap, are the same in every QEMU and merge too.
//!
//! Both merging modes open a side channel between VMs: a guest can time a write to learn
//! whether another VM holds a page of the same content (see docs/security.md). Without
//! ASLR, a guest that found a bug in QEMU's device emulation also knows where QEMU's code
//! and data are. farm's other layers (own uid, seccomp, no network) still hold.

use std::fmt;
use std::str::FromStr;

/// Where the kernel's KSM controls live.
pub const SYSFS: &str = "/sys/kernel/mm/ksm";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ksm {
    #[default]
    Off,
    On,
    OnNoAslr,
}

impl FromStr for Ksm {
    type Err = String;
    fn from_str(s: &str) -> Result<Ksm, String> {
        match s {
            "off" => Ok(Ksm::Off),
            "on" => Ok(Ksm::On),
            "on-no-aslr" => Ok(Ksm::OnNoAslr),
            other => Err(format!("unknown KSM mode {other:?}: expected off, on or on-no-aslr")),
        }
    }
}

impl fmt::Display for Ksm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Ksm::Off => "off",
            Ksm::On => "on",
            Ksm::OnNoAslr => "on-no-aslr",
        })
    }
}

/// What this host's kernel offers.
/// Why a KSM mode cannot work on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KsmUnavailable {
    #[error("KSM {0} needs a kernel with KSM (CONFIG_KSM): {SYSFS} is missing")]
    NoKsm(Ksm),
    #[error("KSM {0} needs prctl(PR_SET_MEMORY_MERGE), Linux 6.4 or later")]
    NoProcessMerge(Ksm),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KsmHost {
    /// `/sys/kernel/mm/ksm` exists (CONFIG_KSM).
    pub present: bool,
    /// `prctl(PR_GET_MEMORY_MERGE)` is known (Linux 6.4 or later).
    pub process_merge: bool,
    /// `ksmd` is running (`run` is 1).
    pub running: bool,
}

impl KsmHost {
    pub fn probe() -> KsmHost {
        let present = std::path::Path::new(SYSFS).join("run").exists();
        let running = std::fs::read_to_string(format!("{SYSFS}/run")).is_ok_and(|s| s.trim() == "1");
        // SAFETY: PR_GET_MEMORY_MERGE reads a flag of this process and takes no pointers.
        #[allow(unsafe_code)]
        let process_merge = unsafe { libc::prctl(libc::PR_GET_MEMORY_MERGE, 0, 0, 0, 0) } >= 0;
        KsmHost {
            present,
            process_merge,
            running,
        }
    }

    /// Why `mode` cannot work here, or a note when it would do nothing yet; `Ok(None)` when
    /// all is well.
    pub fn check(&self, mode: Ksm) -> Result<Option<String>, KsmUnavailable> {
        if mode == Ksm::Off {
            return Ok(None);
        }
        if !self.present {
            return Err(KsmUnavailable::NoKsm(mode));
        }
        if !self.process_merge {
            return Err(KsmUnavailable::NoProcessMerge(mode));
        }
        if !self.running {
            return Ok(Some(format!(
                "KSM {mode}: ksmd is not running on this host, so nothing is merged yet; start it with `echo 1 > {SYSFS}/run` (and size {SYSFS}/pages_to_scan, see docs/commands.md, Density)"
            )));
        }
        Ok(None)
    }
}

/// The kernel's merge counters (pages of 4 KiB).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct KsmStats {
    /// Merged pages in use (one physical page each).
    pub pages_shared: u64,
    /// Mappings that share them: the pages saved.
    pub pages_sharing: u64,
    pub full_scans: u64,
}

impl KsmStats {
    pub fn read() -> Option<KsmStats> {
        let read = |name: &str| {
            std::fs::read_to_string(format!("{SYSFS}/{name}"))
                .ok()?
                .trim()
                .parse::<u64>()
                .ok()
        };
        Some(KsmStats {
            pages_shared: read("pages_shared")?,
            pages_sharing: read("pages_sharing")?,
            full_scans: read("full_scans")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for mode in [Ksm::Off, Ksm::On, Ksm::OnNoAslr] {
            assert_eq!(mode.to_string().parse::<Ksm>(), Ok(mode));
        }
        let e = "yes".parse::<Ksm>().unwrap_err();
        assert!(e.contains("off, on or on-no-aslr"), "{e}");
        assert_eq!(serde_json::to_string(&Ksm::OnNoAslr).unwrap(), "\"on-no-aslr\"");
    }

    #[test]
    fn a_host_without_ksm_is_named() {
        let none = KsmHost {
            present: false,
            process_merge: false,
            running: false,
        };
        assert_eq!(none.check(Ksm::Off), Ok(None));
        assert!(none.check(Ksm::On).unwrap_err().to_string().contains("CONFIG_KSM"));
        let old = KsmHost {
            present: true,
            process_merge: false,
            running: true,
        };
        assert!(old.check(Ksm::OnNoAslr).unwrap_err().to_string().contains("6.4"));
        let idle = KsmHost {
            present: true,
            process_merge: true,
            running: false,
        };
        assert!(idle.check(Ksm::On).unwrap().unwrap().contains("echo 1 >"));
        let ready = KsmHost {
            present: true,
            process_merge: true,
            running: true,
        };
        assert_eq!(ready.check(Ksm::On), Ok(None));
    }
}
