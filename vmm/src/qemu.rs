//! The QEMU command line of one microVM, built from a plain [`MachineSpec`].
//!
//! The layout is fixed by what forks need: guest RAM in a `memory-backend-file` (shared for
//! a template that will be snapshotted, private for a fork), the root disk as virtio-blk
//! over a qcow2 overlay, the agent on a virtio-serial port, QMP, the agent channel and the
//! console (ttyS0) on sockets the host passes in as file descriptors.
//!
//! QEMU runs jailed ([`crate::jail`]) and opens no file by its path: every file (kernel,
//! each layer of the disk, the RAM file, the RAM shim) is passed as a descriptor and named
//! `/proc/self/fd/N`. Descriptor numbers:
//!
//! ```text
//! 3 QMP   4 agent   5 console   6.. kernel (when booting), disk overlay, its backing
//! layers nearest first, RAM file, RAM shim (forks only)
//! ```

use std::path::PathBuf;

use crate::accel::Accel;
use crate::qcow2::Layer;

/// File descriptor numbers the QEMU child finds its sockets on.
pub const QMP_FD: i32 = 3;
pub const AGENT_FD: i32 = 4;
pub const CONSOLE_FD: i32 = 5;
/// The first descriptor number of the files QEMU is given.
pub const NET_FD: i32 = 6;
pub const FIRST_FILE_FD: i32 = 7;

/// What the version line of a QEMU built with farm's reset patch carries
/// (`scripts/build-qemu.sh` configures it as the package version).
pub const RESET_PATCH_MARK: &str = "farm-reset";

/// The block node name of the root disk's overlay (QMP: internal snapshots for reset).
pub const DISK_NODE: &str = "disk0";

/// Kernel command line shared by every VM. `acpi=off` is on the QEMU side (machine option);
/// QEMU then appends the `virtio_mmio.device=` entries the kernel needs to find the devices.
///
/// `tsc=reliable`: under TCG the boot is slow and uneven enough that the clocksource
/// watchdog (whose only reference on microvm is the jiffies counter) declares the TSC
/// unstable and falls back to jiffies. With jiffies as its clock the kernel cannot run
/// tickless, so every idle VM, and every fork of its snapshot, took 250 timer interrupts a
/// second (about 2.4 % of a host core each, measured by `farm bench density`).
///
/// `no_timer_check`: early in boot the kernel checks that the timer interrupt reaches it
/// through the IO-APIC by counting ticks over a short, TSC-timed wait. On a loaded host a
/// TCG guest can miss those ticks, and the kernel then panics with "IO-APIC + timer doesn't
/// work!" (it did in CI, beside the Harbor tests). `bench/boot-under-load.sh` boots guests
/// under 24 busy loops: without the option 8 of 18 panicked, with it none of 18. QEMU's
/// timer works; only the check is skipped.
///
/// Part of every template snapshot's id, as [`kernel_cmdline`] adds to it.
pub const KERNEL_CMDLINE: &str = "console=ttyS0 reboot=t panic=-1 root=/dev/vda rw rootfstype=ext4 \
init=/sbin/farm-agent quiet 8250.nr_uarts=1 tsc=reliable no_timer_check";

/// What a booting VM's `-append` gets: [`KERNEL_CMDLINE`] and, under TCG, the host's TSC
/// frequency as `tsc_early_khz=` (see [`crate::tsc`]: a TCG guest's own measurement fails
/// now and then, and it then runs on jiffies). Under KVM the guest learns the frequency from
/// kvmclock.
pub fn kernel_cmdline(accel: Accel, tsc_khz: Option<u32>) -> String {
    match (accel, tsc_khz) {
        (Accel::Tcg, Some(khz)) => format!("{KERNEL_CMDLINE} tsc_early_khz={khz}"),
        _ => KERNEL_CMDLINE.to_string(),
    }
}

/// [`kernel_cmdline`] on this host.
pub fn host_kernel_cmdline(accel: Accel) -> String {
    let khz = match accel {
        Accel::Tcg => crate::tsc::host_tsc_khz(),
        Accel::Kvm => None,
    };
    kernel_cmdline(accel, khz)
}

/// The kernel command line's part of a template snapshot's id: [`host_kernel_cmdline`] with
/// the measured frequency left out (two measurements differ by a few kHz, and a snapshot's
/// guest, already calibrated, runs the same on this host either way); whether it is given
/// stays in.
pub fn kernel_cmdline_key(accel: Accel) -> String {
    let khz = match accel {
        Accel::Tcg => crate::tsc::host_tsc_khz().map(|_| 0),
        Accel::Kvm => None,
    };
    kernel_cmdline(accel, khz)
}

/// How guest RAM is backed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RamBacking {
    /// The file QEMU maps as guest RAM.
    pub path: PathBuf,
    /// `share=on` (MAP_SHARED: the guest writes into the file, as a template must) or
    /// `share=off` (MAP_PRIVATE: copy-on-write over the file, as a fork does).
    pub shared: bool,
    /// A private mapping that can be reset in place (forks only, `shared` false): QEMU is
    /// told `share=on`, so its state streams leave RAM out, while the RAM shim maps the file
    /// privately and drops the private pages on request (see `scripts/qemu-ram-shim.c` and
    /// `machine/reset.rs`).
    pub resettable: bool,
}

impl RamBacking {
    /// The guest writes into the file (a template, a build step).
    pub fn shared(path: PathBuf) -> RamBacking {
        RamBacking {
            path,
            shared: true,
            resettable: false,
        }
    }

    /// Copy-on-write over the file (a fork); `resettable` as the field says.
    pub fn private(path: PathBuf, resettable: bool) -> RamBacking {
        RamBacking {
            path,
            shared: false,
            resettable,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineSpec {
    pub qemu_binary: PathBuf,
    /// A name for `ps` and for finding stray processes (`-name`).
    pub name: String,
    pub accel: Accel,
    /// CPU model (`max` under TCG, `host` under KVM by default).
    pub cpu_model: String,
    pub cpus: u32,
    pub memory_mib: u32,
    /// The kernel to boot. None for a machine that only ever receives migration state: the
    /// kernel image would otherwise sit in QEMU's memory (fw_cfg) of every fork for nothing.
    pub kernel: Option<PathBuf>,
    /// Its command line ([`kernel_cmdline`]), used when `kernel` is given.
    pub kernel_cmdline: String,
    /// The root disk: a qcow2 overlay the VM may write.
    pub disk: PathBuf,
    /// The layers under the overlay, nearest first (from the qcow2 headers).
    pub disk_backing: Vec<Layer>,
    pub ram: RamBacking,
    /// The preloaded library that lets QEMU 7.2 map a private RAM file it may only read
    /// (forks only; see `scripts/qemu-ram-shim.c`).
    pub ram_shim: Option<PathBuf>,
    /// Where the console is copied (by farm, from the console socket).
    pub console_log: PathBuf,
    /// TCG translation buffer size; smaller buffers keep forks' private memory down.
    pub tcg_tb_size_mib: Option<u32>,
    /// Same-page merging: `mem-merge` on the command line; the rest is set by the jail.
    pub ksm: crate::Ksm,
    /// Start paused, waiting for migration state (`-incoming defer`).
    pub incoming: bool,
    /// QEMU has farm's reset patch: with resettable RAM, `snapshot-load` puts guest RAM back
    /// itself and keeps the translated code of unchanged pages (`FARM_SELECTIVE_RESET`).
    pub selective_reset: bool,
}

impl MachineSpec {
    pub fn default_cpu_model(accel: Accel) -> &'static str {
        match accel {
            Accel::Tcg => "max",
            Accel::Kvm => "host",
        }
    }

    /// The files QEMU is given and the descriptor number of each, in order.
    pub fn files(&self) -> Vec<(PathBuf, i32)> {
        let mut files = Vec::new();
        let mut next = FIRST_FILE_FD;
        let mut add = |path: &PathBuf| {
            files.push((path.clone(), next));
            next += 1;
        };
        if let Some(kernel) = &self.kernel {
            add(kernel);
        }
        add(&self.disk);
        for layer in &self.disk_backing {
            add(&layer.path);
        }
        add(&self.ram.path);
        if let Some(shim) = self.shim() {
            add(shim);
        }
        files
    }

    fn shim(&self) -> Option<&PathBuf> {
        self.ram_shim.as_ref().filter(|_| !self.ram.shared)
    }

    /// The descriptor number of the reset channel the RAM shim serves (resettable RAM only):
    /// the one after the files.
    pub fn reset_fd(&self) -> Option<i32> {
        (self.ram.resettable && self.shim().is_some()).then(|| FIRST_FILE_FD + self.files().len() as i32)
    }

    fn fd_of(&self, path: &PathBuf) -> String {
        let fd = self
            .files()
            .into_iter()
            .find(|(p, _)| p == path)
            .map(|(_, fd)| fd)
            .expect("every file has a descriptor");
        format!("/proc/self/fd/{fd}")
    }

    /// The environment QEMU gets: nothing but what the RAM shim needs.
    pub fn env(&self) -> Vec<(String, String)> {
        match self.shim() {
            Some(shim) => {
                let mut env = vec![
                    ("LD_PRELOAD".into(), self.fd_of(shim)),
                    ("FARM_RO_PATH".into(), self.fd_of(&self.ram.path)),
                ];
                if let Some(fd) = self.reset_fd() {
                    env.push(("FARM_RAM_PRIVATE".into(), "1".into()));
                    env.push(("FARM_RESET_FD".into(), fd.to_string()));
                    if self.selective_reset {
                        env.push(("FARM_SELECTIVE_RESET".into(), "1".into()));
                    }
                }
                env
            }
            None => Vec::new(),
        }
    }

    /// The argument vector after the program name.
    pub fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = Vec::new();
        let mut push = |items: &[&str]| args.extend(items.iter().map(|s| s.to_string()));
        push(&["-name", &self.name]);
        push(&["-sandbox", crate::jail::SANDBOX]);
        // mem-merge: QEMU marks guest RAM mergeable unless told not to.
        let merge = if self.ksm == crate::Ksm::Off { "off" } else { "on" };
        push(&[
            "-M",
            &format!("microvm,x-option-roms=off,rtc=off,isa-serial=on,acpi=off,memory-backend=mem,mem-merge={merge}"),
        ]);
        let accel = match (self.accel, self.tcg_tb_size_mib) {
            (Accel::Tcg, Some(mib)) => format!("tcg,tb-size={mib}"),
            (Accel::Tcg, None) => "tcg".to_string(),
            (Accel::Kvm, _) => "kvm".to_string(),
        };
        push(&["-accel", &accel, "-cpu", &self.cpu_model]);
        push(&["-smp", &self.cpus.to_string(), "-m", &format!("{}M", self.memory_mib)]);
        push(&[
            "-object",
            &format!(
                "memory-backend-file,id=mem,size={}M,mem-path={},share={}",
                self.memory_mib,
                self.fd_of(&self.ram.path),
                if self.ram.shared || self.reset_fd().is_some() {
                    "on"
                } else {
                    "off"
                }
            ),
        ]);
        push(&["-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"]);
        push(&[
            "-chardev",
            &format!("socket,id=console,fd={CONSOLE_FD},server=off"),
            "-serial",
            "chardev:console",
        ]);
        if let Some(kernel) = &self.kernel {
            push(&["-kernel", &self.fd_of(kernel), "-append", &self.kernel_cmdline]);
        }
        let mut drive = format!(
            "id=root,node-name={DISK_NODE},file={},format=qcow2,if=none,cache=unsafe",
            self.fd_of(&self.disk)
        );
        for (depth, layer) in self.disk_backing.iter().enumerate() {
            drive.push_str(&format!(
                ",{}file.filename={}",
                "backing.".repeat(depth + 1),
                self.fd_of(&layer.path)
            ));
        }
        push(&["-drive", &drive, "-device", "virtio-blk-device,drive=root"]);
        push(&[
            "-device",
            "virtio-serial-device,max_ports=4",
            "-chardev",
            &format!("socket,id=agent,fd={AGENT_FD},server=off"),
            "-device",
            &format!("virtserialport,chardev=agent,name={}", farm_protocol::PORT_NAME),
            "-chardev",
            &format!("socket,id=net,fd={NET_FD},server=off"),
            "-device",
            &format!("virtserialport,chardev=net,name={}", farm_protocol::net::PORT_NAME),
        ]);
        push(&[
            "-chardev",
            &format!("socket,id=qmp,fd={QMP_FD},server=off"),
            "-mon",
            "chardev=qmp,mode=control",
        ]);
        if self.incoming {
            push(&["-incoming", "defer"]);
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> MachineSpec {
        MachineSpec {
            qemu_binary: "qemu-system-x86_64".into(),
            name: "farm-1-0".into(),
            accel: Accel::Tcg,
            cpu_model: "max".into(),
            cpus: 2,
            memory_mib: 256,
            kernel: Some("/k/vmlinux".into()),
            kernel_cmdline: kernel_cmdline(Accel::Tcg, Some(2_600_000)),
            disk: "/run/a,b/overlay.qcow2".into(),
            disk_backing: vec![
                Layer {
                    path: "/snap/disk.qcow2".into(),
                    format: "qcow2".into(),
                },
                Layer {
                    path: "/img/rootfs.ext4".into(),
                    format: "raw".into(),
                },
            ],
            ram: RamBacking::private("/snap/memory".into(), false),
            ram_shim: Some("/cache/shim.so".into()),
            console_log: "/run/console.log".into(),
            tcg_tb_size_mib: Some(32),
            ksm: crate::Ksm::Off,
            incoming: true,
            selective_reset: false,
        }
    }

    fn value_after<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
        args.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].as_str())
            .collect()
    }

    #[test]
    fn microvm_without_acpi_and_defaults() {
        let args = spec().args();
        let machine = value_after(&args, "-M");
        assert_eq!(machine.len(), 1);
        assert!(
            machine[0].starts_with("microvm,")
                && machine[0].contains("acpi=off")
                && machine[0].contains("memory-backend=mem")
        );
        assert!(args.iter().any(|a| a == "-nodefaults"));
        assert!(args.iter().any(|a| a == "-no-reboot"));
        assert!(
            !args.iter().any(|a| a.contains("netdev") || a.contains("-net")),
            "no network device: {args:?}"
        );
    }

    #[test]
    fn ram_is_a_memory_backend_file_with_the_requested_sharing() {
        let mut s = spec();
        let object = value_after(&s.args(), "-object")[0].to_string();
        assert_eq!(
            object,
            "memory-backend-file,id=mem,size=256M,mem-path=/proc/self/fd/11,share=off"
        );
        // A fork's RAM file is opened read-only through the shim, named in the environment.
        assert_eq!(
            s.env(),
            [
                ("LD_PRELOAD".to_string(), "/proc/self/fd/12".to_string()),
                ("FARM_RO_PATH".to_string(), "/proc/self/fd/11".to_string())
            ]
        );
        s.ram.shared = true;
        assert!(value_after(&s.args(), "-object")[0].ends_with("share=on"));
        assert!(s.env().is_empty(), "a template writes its RAM file: no shim");
    }

    #[test]
    fn resettable_ram_is_shared_to_qemu_mapped_privately_by_the_shim_with_a_reset_channel() {
        let mut s = spec();
        assert_eq!(s.reset_fd(), None);
        assert!(value_after(&s.args(), "-object")[0].ends_with("share=off"));
        s.ram.resettable = true;
        // After the six files (7-12).
        assert_eq!(s.reset_fd(), Some(13));
        assert!(value_after(&s.args(), "-object")[0].ends_with("share=on"));
        let env = s.env();
        assert!(env.contains(&("FARM_RAM_PRIVATE".into(), "1".into())), "{env:?}");
        assert!(env.contains(&("FARM_RESET_FD".into(), "13".into())), "{env:?}");
        assert!(!env.iter().any(|(k, _)| k == "FARM_SELECTIVE_RESET"), "{env:?}");
        s.selective_reset = true;
        assert!(s.env().contains(&("FARM_SELECTIVE_RESET".into(), "1".into())));
        // Without the shim nothing maps the file privately: no reset, and QEMU maps it private.
        s.ram_shim = None;
        assert_eq!(s.reset_fd(), None);
        assert!(value_after(&s.args(), "-object")[0].ends_with("share=off"));
    }

    #[test]
    fn every_file_is_passed_by_descriptor_and_every_disk_layer_named() {
        let s = spec();
        let numbers: Vec<i32> = s.files().iter().map(|(_, fd)| *fd).collect();
        assert_eq!(numbers, [7, 8, 9, 10, 11, 12]);
        let args = s.args();
        let drive = value_after(&args, "-drive")[0];
        assert_eq!(
            drive,
            "id=root,node-name=disk0,file=/proc/self/fd/8,format=qcow2,if=none,cache=unsafe,backing.file.filename=/proc/self/fd/9,backing.backing.file.filename=/proc/self/fd/10"
        );
        assert_eq!(value_after(&args, "-kernel"), ["/proc/self/fd/7"]);
        assert!(value_after(&args, "-device").contains(&"virtio-blk-device,drive=root"));
        assert!(
            !args
                .iter()
                .any(|a| a.contains("/snap/") || a.contains("/run/") || a.contains("/k/")),
            "no path on the command line: {args:?}"
        );
    }

    #[test]
    fn qemu_is_sandboxed() {
        let args = spec().args();
        let sandbox = value_after(&args, "-sandbox");
        assert_eq!(sandbox, [crate::jail::SANDBOX]);
        for denied in [
            "spawn=deny",
            "elevateprivileges=deny",
            "obsolete=deny",
            "resourcecontrol=deny",
        ] {
            assert!(sandbox[0].contains(denied), "{denied}");
        }
    }

    #[test]
    fn agent_on_virtio_serial_and_qmp_on_passed_fds() {
        let args = spec().args();
        let devices = value_after(&args, "-device");
        assert!(devices.iter().any(|d| d.starts_with("virtio-serial-device")));
        assert!(devices.contains(&format!("virtserialport,chardev=agent,name={}", farm_protocol::PORT_NAME).as_str()));
        let chardevs = value_after(&args, "-chardev");
        assert!(chardevs.contains(&"socket,id=agent,fd=4,server=off"));
        assert!(chardevs.contains(&"socket,id=qmp,fd=3,server=off"));
        assert_eq!(value_after(&args, "-mon"), ["chardev=qmp,mode=control"]);
    }

    #[test]
    fn accelerator_and_incoming_follow_the_spec() {
        let mut s = spec();
        assert_eq!(value_after(&s.args(), "-accel"), ["tcg,tb-size=32"]);
        assert_eq!(value_after(&s.args(), "-incoming"), ["defer"]);
        s.accel = Accel::Kvm;
        s.incoming = false;
        assert_eq!(value_after(&s.args(), "-accel"), ["kvm"]);
        assert!(value_after(&s.args(), "-incoming").is_empty());
    }

    #[test]
    fn console_goes_to_a_socket_and_kernel_boots_the_agent() {
        let args = spec().args();
        assert_eq!(value_after(&args, "-serial"), ["chardev:console"]);
        assert!(value_after(&args, "-chardev").contains(&"socket,id=console,fd=5,server=off"));
        let append = value_after(&args, "-append")[0];
        assert!(
            append.contains("console=ttyS0") && append.contains("init=/sbin/farm-agent") && append.contains("panic=-1")
        );
        // A loaded host must not make the guest's early timer check panic the boot.
        assert!(append.split(' ').any(|word| word == "no_timer_check"), "{append}");
        // A TCG guest is told the host's TSC frequency rather than measuring it.
        assert!(
            append.split(' ').any(|word| word == "tsc_early_khz=2600000"),
            "{append}"
        );
    }

    #[test]
    fn only_tcg_guests_are_told_the_tsc_frequency_and_template_ids_leave_out_its_value() {
        assert_eq!(kernel_cmdline(Accel::Kvm, Some(2_600_000)), KERNEL_CMDLINE);
        assert_eq!(kernel_cmdline(Accel::Tcg, None), KERNEL_CMDLINE);
        assert!(kernel_cmdline(Accel::Tcg, Some(1)).ends_with(" tsc_early_khz=1"));
        assert_eq!(kernel_cmdline_key(Accel::Kvm), KERNEL_CMDLINE);
        let key = kernel_cmdline_key(Accel::Tcg);
        assert!(key == KERNEL_CMDLINE || key.ends_with(" tsc_early_khz=0"), "{key}");
    }

    #[test]
    fn a_machine_waiting_for_state_needs_no_kernel() {
        let mut s = spec();
        s.kernel = None;
        let args = s.args();
        assert!(value_after(&args, "-kernel").is_empty() && value_after(&args, "-append").is_empty());
        assert_eq!(s.files()[0], (PathBuf::from("/run/a,b/overlay.qcow2"), 7));
    }
}
