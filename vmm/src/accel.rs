//! Choosing the accelerator: KVM where it runs stock guests, TCG everywhere else.
//!
//! A `/dev/kvm` is not enough: on PVM hosts (`/sys/module/kvm_pvm`) KVM runs only guest
//! kernels patched for PVM, and a stock kernel stops with an emulation failure. Detection is
//! a pure function over [`HostFacts`] so it is testable on any machine.

use std::fmt;
use std::str::FromStr;

/// What the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccelSetting {
    #[default]
    Auto,
    Kvm,
    Tcg,
}

/// What a VM runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    Kvm,
    Tcg,
}

impl fmt::Display for Accel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        })
    }
}

/// Why an accelerator setting (`--accel`) was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown accelerator {name:?}: expected auto, kvm or tcg")]
pub struct UnknownAccel {
    pub name: String,
}

impl FromStr for AccelSetting {
    type Err = UnknownAccel;
    fn from_str(s: &str) -> Result<Self, UnknownAccel> {
        match s {
            "auto" => Ok(AccelSetting::Auto),
            "kvm" => Ok(AccelSetting::Kvm),
            "tcg" => Ok(AccelSetting::Tcg),
            other => Err(UnknownAccel {
                name: other.to_string(),
            }),
        }
    }
}

/// The facts about this host that decide whether KVM can run a stock guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// `/dev/kvm` exists and opens read-write.
    pub kvm_device_usable: bool,
    /// The PVM flavour of KVM is loaded (`/sys/module/kvm_pvm`).
    pub kvm_is_pvm: bool,
    /// The CPU advertises hardware virtualization (`vmx` or `svm` in /proc/cpuinfo).
    pub cpu_has_virtualization: bool,
}

impl HostFacts {
    pub fn probe() -> HostFacts {
        let kvm_device_usable = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok();
        let kvm_is_pvm = std::path::Path::new("/sys/module/kvm_pvm").exists();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_has_virtualization = cpuinfo
            .lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
        HostFacts {
            kvm_device_usable,
            kvm_is_pvm,
            cpu_has_virtualization,
        }
    }

    /// Why KVM cannot run a stock guest here, or None when it can.
    pub fn kvm_unusable_reason(&self) -> Option<String> {
        if !self.kvm_device_usable {
            return Some("/dev/kvm is missing or cannot be opened read-write".into());
        }
        if self.kvm_is_pvm {
            return Some(
                "/dev/kvm is PVM (/sys/module/kvm_pvm is loaded), which runs only PVM-patched guest kernels, \
                 not farm's stock guest kernel"
                    .into(),
            );
        }
        if !self.cpu_has_virtualization {
            return Some("the CPU has neither vmx nor svm, so this KVM cannot run stock guests".into());
        }
        None
    }
}

#[derive(Debug, thiserror::Error)]
#[error("accelerator kvm was requested but cannot be used: {reason}; use --accel tcg, or auto to pick TCG here")]
pub struct KvmUnusable {
    pub reason: String,
}

/// Resolves a setting against host facts.
pub fn resolve(setting: AccelSetting, facts: &HostFacts) -> Result<Accel, KvmUnusable> {
    match (setting, facts.kvm_unusable_reason()) {
        (AccelSetting::Tcg, _) => Ok(Accel::Tcg),
        (AccelSetting::Kvm, Some(reason)) => Err(KvmUnusable { reason }),
        (AccelSetting::Kvm, None) => Ok(Accel::Kvm),
        (AccelSetting::Auto, Some(_)) => Ok(Accel::Tcg),
        (AccelSetting::Auto, None) => Ok(Accel::Kvm),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REAL_KVM: HostFacts = HostFacts {
        kvm_device_usable: true,
        kvm_is_pvm: false,
        cpu_has_virtualization: true,
    };
    const PVM: HostFacts = HostFacts {
        kvm_device_usable: true,
        kvm_is_pvm: true,
        cpu_has_virtualization: false,
    };
    const NO_KVM: HostFacts = HostFacts {
        kvm_device_usable: false,
        kvm_is_pvm: false,
        cpu_has_virtualization: true,
    };

    #[test]
    fn auto_picks_kvm_only_where_stock_guests_run() {
        assert_eq!(resolve(AccelSetting::Auto, &REAL_KVM).unwrap(), Accel::Kvm);
        assert_eq!(resolve(AccelSetting::Auto, &PVM).unwrap(), Accel::Tcg);
        assert_eq!(resolve(AccelSetting::Auto, &NO_KVM).unwrap(), Accel::Tcg);
        let pvm_with_flags = HostFacts {
            cpu_has_virtualization: true,
            ..PVM
        };
        assert_eq!(resolve(AccelSetting::Auto, &pvm_with_flags).unwrap(), Accel::Tcg);
    }

    #[test]
    fn explicit_kvm_on_pvm_fails_with_the_reason() {
        let err = resolve(AccelSetting::Kvm, &PVM).unwrap_err().to_string();
        assert!(err.contains("PVM") && err.contains("--accel tcg"), "{err}");
        let err = resolve(AccelSetting::Kvm, &NO_KVM).unwrap_err().to_string();
        assert!(err.contains("/dev/kvm"), "{err}");
    }

    #[test]
    fn explicit_tcg_is_always_honoured() {
        for facts in [REAL_KVM, PVM, NO_KVM] {
            assert_eq!(resolve(AccelSetting::Tcg, &facts).unwrap(), Accel::Tcg);
        }
    }

    #[test]
    fn settings_parse_and_reject_unknown_names() {
        assert_eq!("auto".parse::<AccelSetting>().unwrap(), AccelSetting::Auto);
        assert_eq!("kvm".parse::<AccelSetting>().unwrap(), AccelSetting::Kvm);
        assert!("hvf"
            .parse::<AccelSetting>()
            .unwrap_err()
            .to_string()
            .contains("auto, kvm or tcg"));
    }
}
