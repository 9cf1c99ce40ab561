//! Templates, snapshots and forks against real guests. One template snapshot per image is
//! built per test binary (in a private store) and shared by the tests.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use snapshotter::{
    build_template, snapshot_fork, ForkIdentity, Forker, Snapshot, SnapshotError, SnapshotStore, TemplateConfig,
    WarmPool,
};
use std::os::unix::process::CommandExt;

use vmm::{AccelSetting, ExecOptions, VmSettings};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    })
}

/// The tests' snapshot store. A static is never dropped, so a TempDir here was never removed
/// (191 MB in /tmp after every run): the store is named for this process under cargo's
/// tmp folder, and one a finished run left behind goes at the next run.
fn store() -> &'static SnapshotStore {
    static STORE: OnceLock<SnapshotStore> = OnceLock::new();
    STORE.get_or_init(|| {
        let base = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        for entry in std::fs::read_dir(base).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("fork-test-snapshots-") {
                if !std::path::Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        let dir = base.join(format!("fork-test-snapshots-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        SnapshotStore::new(dir)
    })
}

fn forker() -> Forker {
    let mut vm = VmSettings::detect(AccelSetting::Auto).expect("QEMU must be installed (scripts/setup.sh)");
    vm.boot_timeout = Duration::from_secs(300);
    Forker::new(vm).unwrap()
}

fn quiet(_: &str) {}

fn template(image: &str) -> TemplateConfig {
    let mut t = TemplateConfig::of_image(image);
    t.setup = vec![
        "echo made-in-template > /workspace/setup-marker".into(),
        "mkdir -p /workspace/data".into(),
    ];
    t
}

async fn shared_template(image: &'static str) -> &'static Snapshot {
    static MINIMAL: tokio::sync::OnceCell<Snapshot> = tokio::sync::OnceCell::const_new();
    static PYTHON: tokio::sync::OnceCell<Snapshot> = tokio::sync::OnceCell::const_new();
    let cell = if image == "python" { &PYTHON } else { &MINIMAL };
    cell.get_or_init(|| async {
        let built = build_template(store(), &forker(), &template(image), &PathBuf::from("."), image, &quiet)
            .await
            .unwrap();
        built.snapshot
    })
    .await
}

async fn run(fork: &snapshotter::Fork, script: &str) -> String {
    let out = fork.agent().exec(ExecOptions::shell(script)).await.unwrap();
    assert_eq!(
        out.result.exit_code,
        Some(0),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout_text()
}

#[test]
fn ten_forks_are_isolated_in_memory_and_on_disk_and_the_snapshot_never_changes() {
    runtime().block_on(async {
        let snapshot = shared_template("minimal").await;
        let before = snapshot_checksums(snapshot);
        let forker = forker();
        let mut forks = Vec::new();
        for i in 0..10 {
            forks.push(forker.fork(snapshot, ForkIdentity::new(i)).await.unwrap());
        }
        for (i, fork) in forks.iter().enumerate() {
            // Memory (tmpfs) and disk, each with a fork-specific name and content.
            run(
                fork,
                &format!("echo mem-{i} > /dev/shm/mark-{i}; echo disk-{i} > /workspace/data/mark-{i}; sync"),
            )
            .await;
        }
        for (i, fork) in forks.iter().enumerate() {
            let seen = run(
                fork,
                "cat /dev/shm/mark-* /workspace/data/mark-*; cat /workspace/setup-marker",
            )
            .await;
            assert_eq!(
                seen,
                format!("mem-{i}\ndisk-{i}\nmade-in-template\n"),
                "fork {i} saw another fork's data"
            );
        }
        drop(forks);
        assert_eq!(
            snapshot_checksums(snapshot),
            before,
            "a fork changed the snapshot's files"
        );
        snapshot.verify_checksums().unwrap();
    });
}

fn snapshot_checksums(snapshot: &Snapshot) -> Vec<(String, String)> {
    let mut names: Vec<String> = std::fs::read_dir(&snapshot.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|n| {
            (
                n.clone(),
                snapshotter::store::sha256_file(&snapshot.dir.join(&n)).unwrap(),
            )
        })
        .collect()
}

#[test]
fn forks_draw_different_randomness_unless_seeded_alike_and_clocks_are_current() {
    runtime().block_on(async {
        let snapshot = shared_template("python").await;
        let forker = forker();
        let mut urandom = BTreeSet::new();
        let mut unseeded = BTreeSet::new();
        let mut seeded = BTreeSet::new();
        for i in 0..10 {
            // Every fork gets the same FARM_SEED, so seeded Python agrees across forks.
            let fork = forker.fork(snapshot, ForkIdentity::new(1234)).await.unwrap();
            urandom.insert(run(&fork, "head -c 16 /dev/urandom | od -An -tx1").await);
            let py = run(
                &fork,
                "python3 -c 'import os, random; a = random.random(); random.seed(int(os.environ[\"FARM_SEED\"])); print(a, random.random())'",
            )
            .await;
            let (a, b) = py.trim().split_once(' ').unwrap();
            unseeded.insert(a.to_string());
            seeded.insert(b.to_string());
            if i == 0 {
                // Clock: the guest was frozen when the template was made; it must now agree with
                // the host.
                let host_now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
                let before = host_now();
                let guest: f64 = run(&fork, "date +%s.%N").await.trim().parse().unwrap();
                let after = host_now();
                // The guest read its clock somewhere between `before` and `after`.
                assert!(guest > before - 2.0 && guest < after + 2.0, "guest clock {guest} vs host {before}..{after}");
                assert!(run(&fork, "hostname").await.starts_with("fork-"));
            }
        }
        assert_eq!(urandom.len(), 10, "forks read the same /dev/urandom bytes");
        assert_eq!(unseeded.len(), 10, "unseeded Python random agreed across forks");
        assert_eq!(seeded.len(), 1, "the same seed gave different values");
    });
}

#[test]
fn a_fork_of_a_fork_keeps_memory_and_disk_and_records_its_parent() {
    runtime().block_on(async {
        let parent = shared_template("minimal").await;
        let forker = forker();
        let fork = forker.fork(parent, ForkIdentity::new(1)).await.unwrap();
        run(
            &fork,
            "echo in-ram > /dev/shm/branch; echo on-disk > /workspace/branch; sleep 1000 & echo $! > /dev/shm/pid",
        )
        .await;
        let child = snapshot_fork(store(), &forker, parent, &fork, "branch", None, true)
            .await
            .unwrap();
        assert_eq!(child.manifest.parent.as_deref(), Some(parent.id()));
        // The original fork carries on.
        run(&fork, "echo after > /workspace/branch").await;
        let grandchild = forker.fork(&child, ForkIdentity::new(2)).await.unwrap();
        let seen = run(
            &grandchild,
            "cat /dev/shm/branch /workspace/branch; kill -0 $(cat /dev/shm/pid) && echo alive",
        )
        .await;
        assert_eq!(seen, "in-ram\non-disk\nalive\n");
        // And a fork of the child's fork, two levels down.
        let child2 = snapshot_fork(store(), &forker, &child, &grandchild, "branch2", None, false)
            .await
            .unwrap();
        let great = forker.fork(&child2, ForkIdentity::new(3)).await.unwrap();
        assert_eq!(run(&great, "cat /workspace/branch").await, "on-disk\n");
        assert_eq!(child2.manifest.parent.as_deref(), Some(child.id()));
    });
}

#[test]
fn rebuilding_the_same_template_reuses_its_snapshot_and_a_change_makes_a_new_one() {
    runtime().block_on(async {
        let first = shared_template("minimal").await;
        let again = build_template(
            store(),
            &forker(),
            &template("minimal"),
            &PathBuf::from("."),
            "again",
            &quiet,
        )
        .await
        .unwrap();
        assert!(again.reused);
        assert_eq!(again.snapshot.id(), first.id());
        let mut changed = template("minimal");
        changed.setup.push("true".into());
        let id = snapshotter::build::template_snapshot_id(
            &changed.digest(&PathBuf::from(".")).unwrap(),
            &vmm::GuestArtifacts::locate(&vmm::artifacts::cache_dir(), "minimal").unwrap(),
            &forker(),
        );
        assert_ne!(id, first.id());
    });
}

#[test]
fn corrupted_and_mismatched_snapshots_are_refused() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let own = SnapshotStore::new(dir.path().to_path_buf());
        let forker = forker();
        let built = build_template(
            &own,
            &forker,
            &TemplateConfig::of_image("minimal"),
            &PathBuf::from("."),
            "doomed",
            &quiet,
        )
        .await
        .unwrap();
        let snapshot = built.snapshot;
        // Another host setup.
        let mut elsewhere = forker.clone();
        elsewhere.host.qemu_version = "QEMU emulator version 99.0".into();
        let err = elsewhere
            .fork(&snapshot, ForkIdentity::new(0))
            .await
            .err()
            .expect("mismatch must be refused");
        assert!(
            err.to_string().contains("another host setup") && err.to_string().contains("99.0"),
            "{err}"
        );
        // A flipped byte in the state file.
        let state = snapshot.state_path();
        let mut bytes = std::fs::read(&state).unwrap();
        let n = bytes.len() - 10;
        bytes[n] ^= 0xff;
        std::fs::write(&state, &bytes).unwrap();
        let err = forker
            .fork(&snapshot, ForkIdentity::new(0))
            .await
            .err()
            .expect("corruption must be refused");
        assert!(
            matches!(err, snapshotter::ForkError::Snapshot(SnapshotError::Damaged { .. })),
            "{err}"
        );
        assert!(err.to_string().contains("checksum"), "{err}");
        // A missing memory file.
        std::fs::remove_file(snapshot.memory_path()).unwrap();
        assert!(own.open(snapshot.id(), &forker.host).is_err());
    });
}

#[test]
fn an_over_budget_fork_ends_in_an_error_and_its_sibling_carries_on() {
    runtime().block_on(async {
        let snapshot = shared_template("minimal").await;
        let mut forker = forker();
        forker.max_disk_bytes = Some(24 << 20);
        let hog = forker.fork(snapshot, ForkIdentity::new(0)).await.unwrap();
        let sibling = forker.fork(snapshot, ForkIdentity::new(1)).await.unwrap();
        let err = hog
            .agent()
            .exec(ExecOptions::shell(
                "dd if=/dev/zero of=/workspace/big bs=1M count=200; sync; sleep 30",
            ))
            .await
            .unwrap_err();
        let explained = hog.explain(&err);
        assert!(
            explained.contains("disk overlay") && explained.contains("limit"),
            "{explained}"
        );
        assert_eq!(run(&sibling, "echo still-here").await, "still-here\n");
    });
}

#[test]
fn warm_pool_forks_refill_and_leave_no_processes() {
    runtime().block_on(async {
        let snapshot = shared_template("minimal").await;
        let pids;
        {
            let pool = WarmPool::start(forker(), snapshot.clone(), 2).unwrap();
            assert!(
                pool.wait_full(Duration::from_secs(300)).await,
                "pool never filled: {:?}",
                pool.last_error()
            );
            let a = pool.fork(ForkIdentity::new(1)).await.unwrap();
            let b = pool.fork(ForkIdentity::new(2)).await.unwrap();
            let c = pool.fork(ForkIdentity::new(3)).await.unwrap(); // pool may be empty: prepared on demand
            for f in [&a, &b, &c] {
                assert_eq!(run(f, "cat /workspace/setup-marker").await, "made-in-template\n");
            }
            assert!(pool.wait_full(Duration::from_secs(300)).await);
            let mut all = pool.ready_pids();
            all.extend([a.machine.pid(), b.machine.pid(), c.machine.pid()]);
            pids = all;
        }
        // Pool and forks dropped: every QEMU they started is gone (killed and reaped).
        assert_eq!(pids.len(), 5);
        // (The refill task lets go of the pool when the runtime drops it: allow a moment, a
        // long one on a loaded machine.)
        for pid in pids {
            let gone = || !std::path::Path::new(&format!("/proc/{pid}")).exists();
            for _ in 0..1200 {
                if gone() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(gone(), "QEMU {pid} outlived the pool");
        }
    });
}

/// A pool grows by the takes that found nothing ready, up to its max, and shrinks back to its
/// base once a window passes without such takes: the machines past the base are stopped.
#[test]
fn a_pool_grows_with_demand_and_shrinks_back_when_it_stops() {
    runtime().block_on(async {
        let snapshot = shared_template("minimal").await;
        let size = snapshotter::PoolSize {
            base: 1,
            max: 3,
            room: None,
            window: Duration::from_secs(4),
        };
        let pool = WarmPool::start_sized(
            forker(),
            snapshot.clone(),
            size,
            snapshotter::PoolMode::Resumed,
            snapshotter::WarmUp::shell("true"),
        )
        .unwrap();
        assert!(
            pool.wait_full(Duration::from_secs(300)).await,
            "{:?}",
            pool.last_error()
        );
        assert_eq!(pool.counts().target, 1);
        // A burst of six at once: most find nothing ready (the refill makes one at a time).
        let id = ForkIdentity::new;
        let (a, b, c, d, e, f) = tokio::join!(
            pool.fork(id(0)),
            pool.fork(id(1)),
            pool.fork(id(2)),
            pool.fork(id(3)),
            pool.fork(id(4)),
            pool.fork(id(5))
        );
        let burst = [a, b, c, d, e, f].map(Result::unwrap);
        let counts = pool.counts();
        assert!(counts.missed >= 2, "{counts:?}");
        assert_eq!(counts.target, 3, "grown to max, not past it: {counts:?}");
        assert!(
            pool.wait_full(Duration::from_secs(300)).await,
            "{:?}",
            pool.last_error()
        );
        let grown = pool.ready_pids();
        assert_eq!(grown.len(), 3);
        drop(burst);
        // No more takes: past the window the target is the base again and two are stopped.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while pool.ready() > 1 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(pool.counts().target, 1);
        assert_eq!(pool.ready(), 1, "the pool did not shrink back to its base");
        let kept = pool.ready_pids();
        for pid in grown.iter().filter(|p| !kept.contains(p)) {
            let gone = || !std::path::Path::new(&format!("/proc/{pid}")).exists();
            for _ in 0..600 {
                if gone() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(gone(), "QEMU {pid}, past the base, outlived the shrink");
        }
    });
}

/// A resumed pool warms each VM with an identity of its own before any take (so that the
/// take's runs on translated code): none of it may be left once a take's identity is applied.
#[test]
fn a_resumed_pool_fork_has_the_takes_identity_and_nothing_of_the_warm_up() {
    runtime().block_on(async {
        let snapshot = shared_template("minimal").await;
        let pool = WarmPool::start_with_mode(forker(), snapshot.clone(), 2, snapshotter::PoolMode::Resumed).unwrap();
        assert!(
            pool.wait_full(Duration::from_secs(300)).await,
            "{:?}",
            pool.last_error()
        );
        let mut urandom = BTreeSet::new();
        for seed in [11u64, 12] {
            let identity = ForkIdentity::new(seed);
            let fork_id = identity.fork_id.clone();
            let fork = pool.fork(identity).await.unwrap();
            let seen = run(
                &fork,
                "hostname; echo $FARM_FORK_ID $FARM_SEED; env | grep -c warm || true",
            )
            .await;
            assert_eq!(seen, format!("fork-{fork_id}\n{fork_id} {seed}\n0\n"));
            // The argv path too (the warm-up ran one): the take's variables, not the warm-up's.
            let out = fork
                .agent()
                .exec(ExecOptions::argv(&["sh", "-c", "echo $FARM_FORK_ID"]))
                .await
                .unwrap();
            assert_eq!(out.stdout_text(), format!("{fork_id}\n"));
            urandom.insert(run(&fork, "head -c 16 /dev/urandom | od -An -tx1").await);
            let host_now = || {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs_f64()
            };
            let before = host_now();
            let guest: f64 = run(&fork, "date +%s").await.trim().parse().unwrap();
            assert!(
                guest > before - 2.0 && guest < host_now() + 2.0,
                "guest clock {guest} vs host {before}"
            );
        }
        assert_eq!(
            urandom.len(),
            2,
            "two forks of one pool read the same /dev/urandom bytes"
        );
    });
}

#[test]
fn a_forks_qemu_holds_the_snapshot_ram_read_only_and_cannot_open_it_for_writing() {
    runtime().block_on(async {
        let snapshot = shared_template("minimal").await;
        let memory = snapshot.memory_path();
        let meta = std::fs::metadata(&memory).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(meta.mode() & 0o777, 0o444);
        let fork = forker().fork(snapshot, ForkIdentity::new(5)).await.unwrap();
        run(
            &fork,
            "dd if=/dev/urandom of=/dev/shm/fill bs=1M count=8 2>/dev/null; sync",
        )
        .await;
        assert_ram_file_read_only(fork.machine.pid(), &memory);
        if let Some(uid) = fork.machine.uid() {
            // As QEMU's user, the file cannot be opened for writing at all.
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("echo x >> '{}'", memory.display()))
                .uid(uid)
                .gid(uid)
                .output()
                .unwrap();
            assert!(!out.status.success(), "QEMU's user could write the snapshot's RAM file");
        }
        drop(fork);
        snapshot.verify_checksums().unwrap();
    });
}

/// A fork's disk booted afresh: its files, none of its processes; and a guest that already
/// ended itself (reset, as an agent's leftover process can make it) is booted from the disk
/// it left, not turned into a failure of the farm's.
#[test]
fn a_forks_disk_boots_afresh_even_after_its_guest_reset_itself() {
    runtime().block_on(async {
        let snapshot = shared_template("minimal").await;
        let forker = forker();
        let fork = forker.fork(snapshot, ForkIdentity::new(7)).await.unwrap();
        run(
            &fork,
            "echo left > /workspace/on-disk; sync; sleep 600 > /dev/null 2>&1 &",
        )
        .await;
        let machine = snapshotter::boot_from_disk(&forker, snapshot, fork).await.unwrap();
        let out = machine
            .agent()
            .exec(ExecOptions::shell(
                "cat /workspace/on-disk; pgrep -x sleep || echo no-sleep; date +%s",
            ))
            .await
            .unwrap();
        let text = out.stdout_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[..2], ["left", "no-sleep"], "{text}");
        // It took an identity: the host's clock, not the 1970 a booted guest starts at.
        let guest_time: u64 = lines[2].parse().unwrap();
        let host_time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(
            guest_time.abs_diff(host_time) < 86_400,
            "the guest's clock is {guest_time}, the host's {host_time}"
        );
        drop(machine);

        let mut fork = forker.fork(snapshot, ForkIdentity::new(8)).await.unwrap();
        run(&fork, "echo before-reset > /workspace/on-disk; sync").await;
        // The guest resets itself: with -no-reboot, QEMU ends.
        let _ = fork.agent().exec(ExecOptions::shell("reboot -f")).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while fork.machine.exited().is_none() {
            assert!(std::time::Instant::now() < deadline, "the guest did not end");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let machine = snapshotter::boot_from_disk(&forker, snapshot, fork)
            .await
            .expect("a guest that ended itself is booted from the disk it left");
        let out = machine
            .agent()
            .exec(ExecOptions::shell("cat /workspace/on-disk"))
            .await
            .unwrap();
        assert_eq!(out.stdout_text(), "before-reset\n");
    });
}

/// Every descriptor QEMU `pid` holds on the snapshot's RAM file `memory` is read-only (the
/// fork's writes go to private copies of the pages), and it holds one.
fn assert_ram_file_read_only(pid: u32, memory: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    let mut seen = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        let Ok(meta) = std::fs::metadata(entry.path()) else {
            continue;
        };
        if meta.ino() == std::fs::metadata(memory).unwrap().ino()
            && meta.dev() == std::fs::metadata(memory).unwrap().dev()
        {
            let info =
                std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", entry.file_name().to_string_lossy())).unwrap();
            let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).unwrap().trim();
            let flags = u32::from_str_radix(flags, 8).unwrap();
            assert_eq!(
                flags & libc::O_ACCMODE as u32,
                libc::O_RDONLY as u32,
                "QEMU holds the RAM file writable: {info}"
            );
            seen += 1;
        }
    }
    assert!(seen > 0, "QEMU maps the snapshot's RAM file");
}

/// SHA-256 of the guest RAM a QEMU maps from `memory` (read through `/proc/PID/mem`, so it is
/// what the guest sees), or None when it maps no such file.
fn guest_ram_sha256(pid: u32, memory: &std::path::Path) -> Option<String> {
    use sha2::Digest;
    use std::io::{Read, Seek};
    let memory = memory.canonicalize().unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let (start, end) = maps.lines().find_map(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        let path = words.get(5..)?.join(" ");
        if std::path::Path::new(&path) != memory || !words[1].starts_with("rw") {
            return None;
        }
        let (start, end) = words[0].split_once('-')?;
        Some((u64::from_str_radix(start, 16).ok()?, u64::from_str_radix(end, 16).ok()?))
    })?;
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    mem.seek(std::io::SeekFrom::Start(start)).unwrap();
    let mut hasher = sha2::Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut left = end - start;
    while left > 0 {
        let n = left.min(buffer.len() as u64) as usize;
        mem.read_exact(&mut buffer[..n]).unwrap();
        hasher.update(&buffer[..n]);
        left -= n as u64;
    }
    Some(format!("{:x}", hasher.finalize()))
}

/// Everything a rollout can leave in a guest, planted, and what each shows when it is there.
const PLANT: &str = "echo planted > /workspace/planted; \
    setsid sleep 1000 > /dev/null 2>&1 < /dev/null & \
    echo 4321 > /proc/sys/kernel/msgmax; \
    mkdir -p /mnt/planted && mount -t tmpfs planted /mnt/planted && echo x > /mnt/planted/f; \
    if [ \"$(cat /sys/module/printk/parameters/time)\" = Y ]; then echo N; else echo Y; fi > /sys/module/printk/parameters/time; \
    dd if=/dev/urandom of=/dev/vda bs=512 seek=$(( $(cat /sys/block/vda/size) - 8 )) count=1 conv=notrunc 2>/dev/null; \
    sync";
const LOOK: &str = "test -e /workspace/planted && echo file; \
    for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -q '^sleep 1000' && echo process; \
    cat /proc/sys/kernel/msgmax; \
    grep -q ' /mnt/planted ' /proc/mounts && echo mount; \
    cat /sys/module/printk/parameters/time; \
    dd if=/dev/vda bs=512 skip=$(( $(cat /sys/block/vda/size) - 8 )) count=1 2>/dev/null | md5sum; \
    true";

/// A reset puts a fork back to its snapshot in the same QEMU: guest RAM hashes as the
/// snapshot's file, and nothing planted survives (file, process, sysctl, mount, module
/// parameter, raw block write); the guest then takes a new identity (hostname, entropy,
/// clock), as a new fork does. With Debian's QEMU (`FARM_QEMU=qemu-system-x86_64`) the
/// translated code all goes at each reset.
#[test]
fn a_reset_fork_is_its_snapshot_again_with_a_new_identity() {
    runtime().block_on(async {
        let mut vm = VmSettings::detect(AccelSetting::Auto).unwrap();
        vm.qemu_binary = vmm::machine::system_qemu().expect("Debian's QEMU is installed by scripts/setup.sh");
        vm.selective_reset = false;
        let forker = Forker::new(vm).unwrap();
        assert!(
            !forker.host.qemu_version.contains("farm-reset"),
            "{}",
            forker.host.qemu_version
        );
        let built = build_template(
            store(),
            &forker,
            &template("minimal"),
            &PathBuf::from("."),
            "minimal",
            &quiet,
        )
        .await
        .unwrap();
        let kept = reset_is_exact(&forker, &built.snapshot).await;
        assert!(
            kept < 0.5,
            "Debian's QEMU kept {kept:.2} of the translated code over a reset"
        );
        built.snapshot.verify_checksums().unwrap();
    });
}

/// The same with the QEMU farm runs by default, built with farm's reset patch by the set-up
/// (`scripts/build-qemu.sh`): as exact, and the translated code of the pages the reset did
/// not change stays.
#[test]
fn a_reset_with_the_patched_qemu_is_as_exact_and_keeps_the_translated_code() {
    runtime().block_on(async {
        let forker = forker();
        assert!(
            forker.vm.selective_reset && forker.host.qemu_version.contains("farm-reset"),
            "farm's default QEMU is the patched one the set-up builds: {}",
            forker.host.qemu_version
        );
        let snapshot = shared_template("minimal").await;
        let kept = reset_is_exact(&forker, snapshot).await;
        assert!(
            kept > 0.5,
            "the patched QEMU kept only {kept:.2} of the translated code over a reset"
        );
        snapshot.verify_checksums().unwrap();
    });
}

/// A reset while the agent's channel is busy: replies in flight (an 8 MiB output on its way,
/// and small requests beside it) fail with the old channel and none of their bytes reaches
/// the host afterwards: each request after the reset gets its own answer, however the new
/// channel numbers its requests.
#[test]
fn a_reset_during_a_flood_of_the_agent_channel_leaves_no_stale_reply() {
    runtime().block_on(async {
        let snapshot = shared_template("minimal").await;
        let mut fork = forker().fork_resettable(snapshot, ForkIdentity::new(21)).await.unwrap();
        let mut in_flight = Vec::new();
        let answered = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        for i in 0..6 {
            let agent = fork.agent().clone();
            let answered = answered.clone();
            in_flight.push(tokio::spawn(async move {
                // Request after request until the channel is gone: one never ends (its
                // reply, 8 MiB, would come only then), the others answer at once, so replies
                // are on their way when the reset comes.
                let script = if i == 0 {
                    "while :; do head -c 8388608 /dev/zero | tr '\\0' s; done".to_string()
                } else {
                    format!("echo stale-{i}; head -c 262144 /dev/zero")
                };
                loop {
                    let mut options = ExecOptions::shell(script.clone());
                    options.stdout_cap = 16 << 20;
                    if agent.exec(options).await.is_err() {
                        return;
                    }
                    answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }));
        }
        // Until the flood runs at full tilt (a deadline, not a timing).
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while answered.load(std::sync::atomic::Ordering::SeqCst) < 20 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        fork.reset(ForkIdentity::new(22)).await.unwrap();
        for flood in in_flight {
            flood.await.unwrap();
        }
        assert!(
            answered.load(std::sync::atomic::Ordering::SeqCst) >= 20,
            "the flood never got going"
        );
        for i in 0..30 {
            let out = run(&fork, &format!("echo answer-{i}")).await;
            assert_eq!(out, format!("answer-{i}\n"));
        }
        // And the floods themselves are gone with the rest of the rollout's state.
        let look = run(&fork, "ps 2>/dev/null | grep -c '[s]tale-' || true").await;
        assert_eq!(look.trim(), "0", "{look}");
    });
}

/// The translation blocks QEMU holds (HMP `info jit`).
async fn translated_blocks(fork: &snapshotter::Fork) -> u64 {
    let info = fork
        .machine
        .qmp(
            "human-monitor-command",
            Some(serde_json::json!({ "command-line": "info jit" })),
        )
        .await
        .unwrap();
    let text = info.as_str().unwrap_or_default().to_string();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("TB count")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no TB count in {text}"))
}

/// Plants, resets three times and checks each reset; returns the share of translation blocks
/// the last reset kept (blocks after it, before the guest ran anything new, over before it).
async fn reset_is_exact(forker: &Forker, snapshot: &Snapshot) -> f64 {
    let mut fork = forker.fork_resettable(snapshot, ForkIdentity::new(11)).await.unwrap();
    let pid = fork.machine.pid();
    // QEMU takes the RAM for shared here, and still holds the file read-only.
    assert_ram_file_read_only(pid, &snapshot.memory_path());
    let clean = run(&fork, LOOK).await;
    assert!(!clean.contains("file") && !clean.contains("process"), "{clean}");
    run(&fork, PLANT).await;
    let planted = run(&fork, LOOK).await;
    assert_ne!(planted, clean, "planting changed nothing to look at");
    let memory = snapshot.memory_path();
    let mut urandom = BTreeSet::new();
    let mut kept = 0.0;
    for round in 0..3u64 {
        let written = vmm::memory::Breakdown::of(pid, &memory.canonicalize().unwrap())
            .unwrap()
            .guest_ram;
        assert!(written > 0, "the fork wrote no guest RAM before reset {round}");
        let expected = snapshotter::store::sha256_file(&memory).unwrap();
        // The check tells them apart: the running fork's RAM is not the file's.
        assert_ne!(guest_ram_sha256(pid, &memory).unwrap(), expected);
        let before = translated_blocks(&fork).await;
        let identity = ForkIdentity::new(100 + round);
        let fork_id = identity.fork_id.clone();
        let memory_at_reset = memory.clone();
        fork.reset_with(identity, |pid| async move {
            let seen = guest_ram_sha256(pid, &memory_at_reset).expect("QEMU maps the snapshot's RAM file");
            assert_eq!(seen, expected, "guest RAM after reset {round} is not the snapshot's");
        })
        .await
        .unwrap();
        kept = translated_blocks(&fork).await as f64 / before as f64;
        assert_eq!(fork.machine.pid(), pid, "a reset started another QEMU");
        assert_eq!(
            run(&fork, LOOK).await,
            clean,
            "something planted outlived reset {round}"
        );
        assert_eq!(run(&fork, "hostname").await.trim(), format!("fork-{fork_id}"));
        urandom.insert(run(&fork, "head -c 16 /dev/urandom | od -An -tx1").await);
        let host_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let guest: f64 = run(&fork, "date +%s").await.trim().parse().unwrap();
        assert!((guest - host_now).abs() < 5.0, "guest clock {guest}, host {host_now}");
        run(&fork, PLANT).await;
    }
    assert_eq!(urandom.len(), 3, "resets drew the same randomness");
    kept
}

/// A reset gives the disk budget back: the overlay's allocated bytes (what the disk limit
/// measures) are those of a new fork again, so a rollout on a reset VM is not held to what
/// the VM's last user wrote (nor killed for it). And the console log (which error messages
/// quote, and branches copy) starts again: it holds nothing of the last user's.
#[test]
fn a_reset_gives_back_the_disk_an_earlier_user_filled_and_a_new_console_log() {
    runtime().block_on(async {
        let snapshot = shared_template("minimal").await;
        let mut fork = forker().fork_resettable(snapshot, ForkIdentity::new(31)).await.unwrap();
        let disk = fork.machine.spec().disk.clone();
        let used_mib = || {
            use std::os::unix::fs::MetadataExt;
            (std::fs::metadata(&disk).unwrap().blocks() * 512) >> 20
        };
        let fresh = used_mib();
        run(
            &fork,
            "dd if=/dev/urandom of=/workspace/big bs=1M count=40 2>/dev/null; sync",
        )
        .await;
        assert!(
            used_mib() >= fresh + 40,
            "the write reached the overlay: {} MiB",
            used_mib()
        );
        run(&fork, "echo last-user-console-marker > /dev/console").await;
        wait_for_console(&fork, "last-user-console-marker").await;
        // Kept idle, its QEMU runs nothing (what the engine does to VMs it keeps for a reset).
        fork.machine.freeze();
        let state = || {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", fork.machine.pid())).unwrap();
            stat.rsplit(") ").next().unwrap().chars().next().unwrap()
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while state() != 'T' {
            assert!(
                std::time::Instant::now() < deadline,
                "a frozen QEMU is stopped: {}",
                state()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        fork.machine.thaw();
        fork.reset(ForkIdentity::new(32)).await.unwrap();
        assert!(used_mib() <= fresh + 1, "{} MiB left after the reset", used_mib());
        run(&fork, "echo next-user-console-marker > /dev/console").await;
        wait_for_console(&fork, "next-user-console-marker").await;
        let console = fork.machine.console_tail(1000);
        assert!(!console.contains("last-user-console-marker"), "{console}");
        run(
            &fork,
            "dd if=/dev/urandom of=/workspace/big2 bs=1M count=20 2>/dev/null; sync",
        )
        .await;
        fork.reset(ForkIdentity::new(33)).await.unwrap();
        assert!(
            used_mib() <= fresh + 1,
            "{} MiB left after the second reset",
            used_mib()
        );
    });
}

/// Waits (a deadline, not a timing) until the fork's console log shows `marker`.
async fn wait_for_console(fork: &snapshotter::Fork, marker: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !fork.machine.console_tail(50).contains(marker) {
        assert!(
            std::time::Instant::now() < deadline,
            "{marker} never reached the console log"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
