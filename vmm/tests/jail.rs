//! QEMU's jail, checked from outside on real guests: its own uid, seccomp, no_new_privs, no
//! inherited environment or descriptors, a bounded console under a flood.

mod common;

use std::time::Duration;

use common::runtime;
use vmm::Machine;

fn status_field(pid: u32, name: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("{name} in status"))
        .trim()
        .to_string()
}

#[test]
fn qemu_runs_as_its_own_user_under_seccomp_with_nothing_inherited() {
    runtime().block_on(async {
        // A descriptor this process holds without close-on-exec: QEMU must not get it.
        let (leaked_read, leaked_write) = nix::unistd::pipe().unwrap();
        for fd in [&leaked_read, &leaked_write] {
            nix::fcntl::fcntl(
                std::os::fd::AsRawFd::as_raw_fd(fd),
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
            )
            .unwrap();
        }
        let leaked_inode = std::fs::metadata(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&leaked_read)
        ))
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .unwrap();
        let a = common::boot("minimal").await;
        let b = common::boot("minimal").await;
        for machine in [&a, &b] {
            let pid = machine.pid();
            if vmm::jail::running_as_root() {
                let uid = machine.uid().expect("root gives every QEMU a uid of its own");
                assert!(uid >= vmm::jail::UID_BASE, "{uid}");
                let uids: Vec<String> = status_field(pid, "Uid").split_whitespace().map(String::from).collect();
                assert_eq!(
                    uids,
                    vec![uid.to_string(); 4],
                    "real, effective, saved and file-system uid"
                );
                assert_eq!(status_field(pid, "Groups"), "", "no supplementary groups under TCG");
                assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
            }
            assert_eq!(
                status_field(pid, "Seccomp"),
                "2",
                "-sandbox on installs a seccomp filter"
            );
            assert_eq!(status_field(pid, "NoNewPrivs"), "1");
            // A booted machine's QEMU has an empty environment (only forks get the RAM shim's
            // two variables): none of this test process's variables reached it.
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
            assert!(environ.is_empty(), "{}", String::from_utf8_lossy(&environ));
            for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
                if let Ok(meta) = std::fs::metadata(entry.path()) {
                    assert_ne!(
                        std::os::unix::fs::MetadataExt::ino(&meta),
                        leaked_inode,
                        "QEMU inherited a descriptor it was not given"
                    );
                }
            }
            // Core dumps off, a file size cap.
            let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
            let line = |name: &str| {
                limits
                    .lines()
                    .find(|l| l.starts_with(name))
                    .unwrap()
                    .split_whitespace()
                    .map(String::from)
                    .collect::<Vec<_>>()
            };
            assert_eq!(line("Max core file size")[4], "0");
            assert_ne!(line("Max file size")[3], "unlimited");
            assert_eq!(line("Max open files")[3], vmm::jail::MAX_OPEN_FILES.to_string());
            if machine.uid().is_some() {
                assert_eq!(
                    line("Max processes")[2],
                    vmm::jail::MAX_PIDS.to_string(),
                    "threads of its own uid are bounded"
                );
            }
            machine.agent().ping().await.unwrap();
        }
        assert_ne!(a.uid(), b.uid(), "two VMs never share a uid");
    });
}

/// farm holds a few descriptors per VM (QMP, agent, console, network, disk), so with a
/// hundred-odd VMs it holds more than QEMU's own limit of 1,024. Starting one more must work:
/// the limit applies to QEMU, never to the numbers farm's descriptors happen to have.
#[test]
fn qemu_starts_while_farm_holds_more_than_1024_descriptors() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    assert!(
        hard >= 2048,
        "this test needs a hard open-file limit of at least 2048 (ulimit -Hn is {hard})"
    );
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    let null = std::fs::File::open("/dev/null").unwrap();
    // Every number up to past 1,100 taken (by this test or the harness), as in a busy farm.
    let held: Vec<std::os::fd::OwnedFd> = (0..1100)
        .map(|_| std::os::fd::AsFd::as_fd(&null).try_clone_to_owned().unwrap())
        .collect();
    let highest = held.iter().map(std::os::fd::AsRawFd::as_raw_fd).max().unwrap();
    assert!(
        highest > vmm::jail::MAX_OPEN_FILES as i32,
        "descriptors reach {highest}"
    );
    runtime().block_on(async {
        let machine = common::boot("minimal").await;
        machine.agent().ping().await.unwrap();
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", machine.pid())).unwrap();
        let open_files = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
        assert_eq!(
            open_files.split_whitespace().nth(3),
            Some(vmm::jail::MAX_OPEN_FILES.to_string().as_str()),
            "QEMU still gets its own limit"
        );
    });
    drop(held);
}

#[test]
fn a_console_flood_leaves_a_bounded_log_and_a_working_guest() {
    runtime().block_on(async {
        let machine = common::boot("minimal").await;
        // Root in the guest writes 6 MiB to the serial console (six times the log's cap).
        let flood = vmm::ExecOptions {
            timeout: Some(Duration::from_secs(600)),
            ..vmm::ExecOptions::shell("head -c 6291456 /dev/zero | tr '\\0' x > /dev/ttyS0; echo done")
        };
        let out = machine.agent().exec(flood).await.unwrap();
        assert_eq!(out.stdout_text().trim(), "done");
        let log = machine.run_dir().join("console.log");
        // The reader may still be draining: give it a moment, then check the size.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let size = std::fs::metadata(&log).unwrap().len();
        assert!(
            size <= vmm::console::LOG_CAP + vmm::console::TAIL as u64 + 200,
            "console.log grew to {size} bytes"
        );
        assert!(std::fs::read_to_string(&log)
            .unwrap()
            .contains("earlier bytes of console output dropped"));
        machine.agent().ping().await.unwrap();
    });
}

fn ksm_and_layout(pid: u32) -> (String, bool, String, String) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/ksm_stat")).unwrap_or_default();
    let merge_any = stat
        .lines()
        .find_map(|l| l.strip_prefix("ksm_merge_any:"))
        .unwrap_or("absent")
        .trim()
        .to_string();
    let persona = u32::from_str_radix(
        std::fs::read_to_string(format!("/proc/{pid}/personality"))
            .unwrap()
            .trim(),
        16,
    )
    .unwrap();
    let cmdline = String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap()).replace('\0', " ");
    let merge = cmdline
        .split_whitespace()
        .find(|a| a.starts_with("microvm,"))
        .unwrap()
        .split(',')
        .find(|o| o.starts_with("mem-merge="))
        .unwrap_or("none")
        .to_string();
    // Where QEMU's own binary is mapped.
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let base = maps
        .lines()
        .find(|l| l.contains("qemu-system"))
        .unwrap()
        .split('-')
        .next()
        .unwrap()
        .to_string();
    (merge_any, persona & libc::ADDR_NO_RANDOMIZE as u32 != 0, merge, base)
}

/// KSM is off unless asked for, and then so is QEMU's own merging of guest RAM; with
/// `on-no-aslr` every QEMU may be merged and loads at the same addresses (what lets their
/// relocated data merge), while the default keeps each QEMU's layout random.
#[test]
fn ksm_is_off_by_default_and_on_no_aslr_gives_every_qemu_one_layout() {
    let host = vmm::ksm::KsmHost::probe();
    runtime().block_on(async {
        let a = common::artifacts("minimal");
        let boot = |ksm: vmm::Ksm| {
            let (kernel, image) = (a.kernel.path.clone(), a.image.path.clone());
            async move {
                let mut settings = common::settings();
                settings.ksm = ksm;
                Machine::boot(&settings, &kernel, &image).await.unwrap()
            }
        };
        let (plain1, plain2) = (boot(vmm::Ksm::Off).await, boot(vmm::Ksm::Off).await);
        let (p1, p2) = (ksm_and_layout(plain1.pid()), ksm_and_layout(plain2.pid()));
        for p in [&p1, &p2] {
            assert_eq!((p.1, p.2.as_str()), (false, "mem-merge=off"), "{p:?}");
            if host.process_merge {
                assert_eq!(p.0, "no", "{p:?}");
            }
        }
        assert_ne!(p1.3, p2.3, "two default QEMUs load at random addresses");
        if !host.process_merge {
            eprintln!("this kernel has no PR_SET_MEMORY_MERGE: the KSM modes are refused here, not tested");
            return;
        }
        let (merged1, merged2) = (boot(vmm::Ksm::OnNoAslr).await, boot(vmm::Ksm::OnNoAslr).await);
        merged1.agent().ping().await.unwrap();
        merged2.agent().ping().await.unwrap();
        let (m1, m2) = (ksm_and_layout(merged1.pid()), ksm_and_layout(merged2.pid()));
        for m in [&m1, &m2] {
            assert_eq!(
                (m.0.as_str(), m.1, m.2.as_str()),
                ("yes", true, "mem-merge=on"),
                "{m:?}"
            );
        }
        assert_eq!(m1.3, m2.3, "without ASLR every QEMU loads at the same address");
        let on = boot(vmm::Ksm::On).await;
        let o = ksm_and_layout(on.pid());
        assert_eq!(
            (o.0.as_str(), o.1, o.2.as_str()),
            ("yes", false, "mem-merge=on"),
            "{o:?}"
        );
    });
}
