//! The machine layer against real guests: commands, files, limits, concurrency, failures.

mod common;

use std::time::Duration;

use common::{runtime, shared_minimal, shared_python};
use vmm::{AgentError, ExecOptions};

fn sh(script: &str) -> ExecOptions {
    ExecOptions::shell(script)
}

#[test]
fn exit_codes_and_output_streams() {
    runtime().block_on(async {
        let agent = shared_minimal().await.agent();
        let out = agent.exec(sh("echo out; echo err >&2; exit 7")).await.unwrap();
        assert_eq!(out.result.exit_code, Some(7));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
        assert_eq!(out.shell_exit_code(), 7);
        let ok = agent.exec(ExecOptions::argv(&["true"])).await.unwrap();
        assert_eq!(ok.result.exit_code, Some(0));
    });
}

#[test]
fn signals_are_reported_as_signals() {
    runtime().block_on(async {
        let out = shared_minimal().await.agent().exec(sh("kill -TERM $$")).await.unwrap();
        assert_eq!(out.result.exit_code, None);
        assert_eq!(out.result.signal, Some(15));
        assert_eq!(out.shell_exit_code(), 143);
    });
}

#[test]
fn stdin_env_and_working_directory_reach_the_command() {
    runtime().block_on(async {
        let options = ExecOptions {
            stdin: b"line one\nline two\n".to_vec(),
            env: vec![("GREETING".into(), "hello farm".into())],
            cwd: Some("/etc".into()),
            ..sh("wc -l; echo \"$GREETING\"; pwd")
        };
        let out = shared_minimal().await.agent().exec(options).await.unwrap();
        let text = out.stdout_text();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        assert_eq!(lines, ["2", "hello farm", "/etc"]);
    });
}

#[test]
fn large_stdin_is_delivered_whole() {
    runtime().block_on(async {
        let input: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let options = ExecOptions {
            stdin: input.clone(),
            ..sh("md5sum")
        };
        let out = shared_minimal().await.agent().exec(options).await.unwrap();
        let digest = format!("{:x}", md5_of(&input));
        assert!(
            out.stdout_text().starts_with(&digest),
            "{} vs {digest}",
            out.stdout_text()
        );
    });
}

#[test]
fn timeout_kills_the_whole_process_group() {
    runtime().block_on(async {
        let agent = shared_minimal().await.agent();
        let options = ExecOptions {
            timeout: Some(Duration::from_millis(1500)),
            ..sh("sleep 300 & echo $! > /tmp/bg.pid; sleep 300")
        };
        let out = agent.exec(options).await.unwrap();
        assert!(out.result.timed_out);
        assert_eq!(out.result.signal, Some(9));
        // The background child died with the group (once PID 1 has reaped it: until then a
        // zombie still answers kill -0, so wait for that, generously).
        let check = agent
            .exec(sh(
                "for i in $(seq 600); do kill -0 $(cat /tmp/bg.pid) 2>/dev/null || { echo gone; exit; }; \
                      sleep 0.1; done; echo alive",
            ))
            .await
            .unwrap();
        assert_eq!(check.stdout_text().trim(), "gone");
    });
}

#[test]
fn output_beyond_the_cap_is_dropped_and_flagged() {
    runtime().block_on(async {
        let options = ExecOptions {
            stdout_cap: 1000,
            stderr_cap: 10,
            ..sh("yes | head -c 100000; yes e | head -c 5000 >&2")
        };
        let out = shared_minimal().await.agent().exec(options).await.unwrap();
        assert_eq!(out.stdout.len(), 1000);
        assert!(out.result.stdout_truncated);
        assert_eq!(out.stderr.len(), 10);
        assert!(out.result.stderr_truncated);
        assert_eq!(out.result.exit_code, Some(0));
    });
}

#[test]
fn binary_files_round_trip() {
    runtime().block_on(async {
        let agent = shared_minimal().await.agent();
        let data: Vec<u8> = (0..(1u32 << 20))
            .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
            .collect();
        agent
            .write_file("/tmp/deep/dir/blob.bin", data.clone(), 0o640)
            .await
            .unwrap();
        let (back, size) = agent.read_file("/tmp/deep/dir/blob.bin", 2 << 20).await.unwrap();
        assert_eq!(size, data.len() as u64);
        assert_eq!(back, data);
        let stat = agent.exec(sh("stat -c %a /tmp/deep/dir/blob.bin")).await.unwrap();
        assert_eq!(stat.stdout_text().trim(), "640");
        // A read cap returns the head and the true size.
        let (head, size) = agent.read_file("/tmp/deep/dir/blob.bin", 10).await.unwrap();
        assert_eq!(head, &data[..10]);
        assert_eq!(size, data.len() as u64);
        let missing = agent.read_file("/no/such/file", 10).await.unwrap_err();
        assert!(matches!(missing, AgentError::Refused { .. }), "{missing}");
    });
}

#[test]
fn concurrent_requests_overlap() {
    runtime().block_on(async {
        let agent = shared_minimal().await.agent();
        // Each command announces itself, then waits until all six have: this only finishes
        // if the six requests are in flight at the same time.
        let script = |i: usize| {
            format!(
                "mkdir -p /tmp/barrier; touch /tmp/barrier/{i}; \
                 for t in $(seq 600); do [ $(ls /tmp/barrier | wc -l) -ge 6 ] && echo {i} && exit 0; sleep 0.1; done; exit 1"
            )
        };
        let calls: Vec<_> = (0..6)
            .map(|i| {
                let agent = agent.clone();
                let options = sh(&script(i));
                tokio::spawn(async move { agent.exec(options).await })
            })
            .collect();
        let results: Vec<_> = futures_join(calls).await;
        for (i, out) in results.into_iter().enumerate() {
            assert_eq!(out.result.exit_code, Some(0), "request {i} never saw the others");
            assert_eq!(out.stdout_text().trim(), i.to_string());
        }
    });
}

#[test]
fn unknown_program_is_a_spawn_error() {
    runtime().block_on(async {
        let err = shared_minimal()
            .await
            .agent()
            .exec(ExecOptions::argv(&["/no/such/program"]))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                AgentError::Refused {
                    kind: farm_protocol::ErrorKind::Spawn,
                    ..
                }
            ),
            "{err}"
        );
    });
}

#[test]
fn python_image_runs_python() {
    runtime().block_on(async {
        let out = shared_python()
            .await
            .agent()
            .exec(ExecOptions::argv(&["python3", "-c", "print(6*7)"]))
            .await
            .unwrap();
        assert_eq!(out.stdout_text(), "42\n");
        let git = shared_python()
            .await
            .agent()
            .exec(ExecOptions::argv(&["git", "--version"]))
            .await
            .unwrap();
        assert!(git.stdout_text().starts_with("git version"));
    });
}

#[test]
fn guest_killed_mid_request_fails_the_request_promptly() {
    runtime().block_on(async {
        let mut machine = common::boot("minimal").await;
        let agent = machine.agent().clone();
        let call = tokio::spawn(async move { agent.exec(sh("sleep 600")).await });
        tokio::time::sleep(Duration::from_millis(500)).await;
        machine.kill();
        let err = tokio::time::timeout(Duration::from_secs(120), call)
            .await
            .expect("request must not hang")
            .unwrap()
            .unwrap_err();
        assert!(matches!(err, AgentError::ChannelClosed(_)), "{err}");
        assert!(matches!(
            machine.agent().ping().await,
            Err(AgentError::ChannelClosed(_))
        ));
    });
}

#[test]
fn killing_the_agent_fails_in_flight_requests_and_it_comes_back() {
    runtime().block_on(async {
        let machine = common::boot("minimal").await;
        let agent = machine.agent();
        // The server is PID 1's child; the command kills it (not itself: it runs in its
        // own session, so it survives and its answer is lost with the server).
        let err = agent.exec(sh("kill -9 $PPID; sleep 5")).await.unwrap_err();
        assert!(matches!(err, AgentError::AgentRestarted { .. }), "{err}");
        let pong = agent.ping().await.unwrap();
        assert_eq!(pong.protocol_version, farm_protocol::PROTOCOL_VERSION);
        machine.shutdown().await;
    });
}

async fn futures_join<T>(handles: Vec<tokio::task::JoinHandle<Result<T, AgentError>>>) -> Vec<T> {
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap().unwrap());
    }
    out
}

/// MD5, to compare with busybox md5sum without adding a dependency.
fn md5_of(data: &[u8]) -> u128 {
    let s: [u32; 64] = [
        7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 5, 9, 14, 20, 5, 9, 14, 20, 5, 9, 14, 20, 5, 9, 14,
        20, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6,
        10, 15, 21,
    ];
    let k: Vec<u32> = (0..64)
        .map(|i| ((i as f64 + 1.0).sin().abs() * 4294967296.0) as u32)
        .collect();
    let (mut a0, mut b0, mut c0, mut d0) = (0x67452301u32, 0xefcdab89u32, 0x98badcfeu32, 0x10325476u32);
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_le_bytes());
    for chunk in msg.chunks(64) {
        let m: Vec<u32> = chunk
            .chunks(4)
            .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
            .collect();
        let (mut a, mut b, mut c, mut d) = (a0, b0, c0, d0);
        for i in 0..64 {
            let (f, g) = match i / 16 {
                0 => ((b & c) | (!b & d), i),
                1 => ((d & b) | (!d & c), (5 * i + 1) % 16),
                2 => (b ^ c ^ d, (3 * i + 5) % 16),
                _ => (c ^ (b | !d), (7 * i) % 16),
            };
            let f = f.wrapping_add(a).wrapping_add(k[i]).wrapping_add(m[g]);
            a = d;
            d = c;
            c = b;
            b = b.wrapping_add(f.rotate_left(s[i]));
        }
        a0 = a0.wrapping_add(a);
        b0 = b0.wrapping_add(b);
        c0 = c0.wrapping_add(c);
        d0 = d0.wrapping_add(d);
    }
    let mut out = [0u8; 16];
    for (i, v) in [a0, b0, c0, d0].iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
    u128::from_be_bytes(out)
}

#[test]
fn a_guest_that_dies_while_booting_is_reported_not_waited_for() {
    runtime().block_on(async {
        let settings = common::settings();
        let a = common::artifacts("minimal");
        let run_dir = vmm::machine::RunDir::create(&settings.run_root).unwrap();
        let disk = run_dir.path().join("disk.qcow2");
        vmm::machine::create_overlay(&a.image.path, "raw", &disk).await.unwrap();
        let plan = vmm::machine::LaunchPlan {
            kernel: Some(a.kernel.path.clone()),
            disk,
            ram: vmm::qemu::RamBacking::private(run_dir.path().join("memory"), false),
            incoming: false,
            max_disk_bytes: None,
        };
        let mut machine = vmm::Machine::launch(&settings, plan, run_dir).await.unwrap();
        machine.kill();
        // The boot timeout is minutes; a dead guest must be reported long before that.
        let waited = tokio::time::timeout(
            Duration::from_secs(120),
            machine.wait_for_agent(Duration::from_secs(600)),
        )
        .await;
        let err = waited.expect("a dead guest must not be waited for").unwrap_err();
        assert!(matches!(err, vmm::MachineError::GuestDied { .. }), "{err}");
    });
}

/// Guests booting side by side keep the TSC as their clock: under TCG their own measurement
/// of its frequency against the emulated PIT failed when several booted at once (16 of 16
/// boots, four at a time, `bench/boot-clock.sh`), and each then ran on jiffies, ticking 250
/// times a second in every fork of its snapshot. farm tells them the host's frequency.
#[test]
fn guests_booting_side_by_side_keep_the_tsc_as_their_clock() {
    runtime().block_on(async {
        let boot = || common::boot("minimal");
        let (a, b, c, d) = tokio::join!(boot(), boot(), boot(), boot());
        for machine in [&a, &b, &c, &d] {
            let out = machine
                .agent()
                .exec(sh(
                    "cat /sys/devices/system/clocksource/clocksource0/current_clocksource; dmesg | grep -i 'tsc'",
                ))
                .await
                .unwrap();
            let text = out.stdout_text();
            let clock = text.lines().next().unwrap_or_default().trim().to_string();
            assert!(
                clock == "tsc" || clock == "tsc-early",
                "the guest's clock is {clock:?}:\n{text}"
            );
            assert!(!text.contains("Marking TSC unstable"), "{text}");
        }
    });
}

/// The guest's users: the candidate (farm, uid 1000) sees only its own processes, cannot
/// signal or read PID 1, and cannot use farm-sandbox; the checker (uid 999) runs commands as
/// the candidate through it, without its verdict variables.
#[test]
fn the_candidate_is_walled_off_and_farm_sandbox_drops_to_it() {
    runtime().block_on(async {
        let machine = common::shared_minimal().await;
        let as_user = |user: &str, script: &str| vmm::ExecOptions {
            user: Some(user.to_string()),
            env: vec![("FARM_REWARD_FILE".into(), "/opt/farm-tests/.reward-x".into())],
            timeout: Some(Duration::from_secs(60)),
            ..vmm::ExecOptions::shell(script)
        };
        let candidate = machine
            .agent()
            .exec(as_user(
                "1000",
                "id -u; ls /proc | grep -c '^[0-9]'; cat /proc/1/environ >/dev/null 2>&1 && echo read-init; \
                 kill -STOP 1 2>/dev/null && echo stopped-init; farm-sandbox true 2>/dev/null && echo used-sandbox; echo end",
            ))
            .await
            .unwrap();
        let lines: Vec<String> = candidate.stdout_text().lines().map(String::from).collect();
        assert_eq!(lines[0], "1000");
        let visible: u32 = lines[1].parse().unwrap();
        assert!(visible <= 4, "the candidate sees {visible} processes: only its own should show (hidepid)");
        assert_eq!(&lines[2..], ["end"], "{}", candidate.stdout_text());
        let checker = machine
            .agent()
            .exec(as_user("999", "farm-sandbox sh -c 'id -u; id -G; echo \"reward=[$FARM_REWARD_FILE]\"; cat /proc/self/status | grep NoNewPrivs'"))
            .await
            .unwrap();
        assert_eq!(checker.stdout_text(), "1000\n1000\nreward=[]\nNoNewPrivs:\t1\n", "{}", String::from_utf8_lossy(&checker.stderr));
    });
}

/// A checker never follows a path the agent could have planted. Everything the candidate
/// could leave for it is laid out by root first: symbolic links to a file and to a folder the
/// checker can read, a device node, a bind mount of that folder under the workspace, and a
/// regular file and a FIFO of the candidate's in /tmp where a careless checker would write.
/// The checker (uid 999, in its own view of the workspace) must open none of them; the
/// candidate, through farm-sandbox, keeps the ordinary view (its own links work), cannot hard
/// link a file it does not own, and sees no FARM_* variable.
#[test]
fn a_checker_follows_no_link_device_fifo_or_mount_the_agent_planted() {
    runtime().block_on(async {
        let machine = common::boot("python").await;
        let agent = machine.agent();
        let root = |script: &str| vmm::ExecOptions { timeout: Some(Duration::from_secs(60)), ..vmm::ExecOptions::shell(script) };
        let laid = agent
            .exec(root(
                "set -e; mkdir -p /opt/probe && echo target > /opt/probe/target.txt && chmod 755 /opt/probe && chmod 644 /opt/probe/target.txt; \
                 mkdir -p /workspace/probe && cd /workspace/probe; ln -s /opt/probe/target.txt link-file; ln -s /opt/probe link-dir; \
                 mknod dev-null c 1 3 && chmod 666 dev-null; mkdir bound && mount --bind /opt/probe bound; chown -R 1000:1000 /workspace; \
                 farm-sandbox sh -c 'umask 0; : > /tmp/planted-file; mkfifo -m 666 /tmp/planted-fifo'; echo laid",
            ))
            .await
            .unwrap();
        assert_eq!(laid.stdout_text().trim(), "laid", "{}", String::from_utf8_lossy(&laid.stderr));
        let probe = r#"
import errno, json, os, subprocess
def opened(path, flags=os.O_RDONLY):
    try:
        os.close(os.open(path, flags))
        return "opened"
    except OSError as e:
        return errno.errorcode[e.errno]
def sandbox(*argv):
    return subprocess.run(["farm-sandbox", *argv], stdin=subprocess.DEVNULL, capture_output=True, text=True)
env = sandbox("sh", "-c", "env").stdout.splitlines()
print(json.dumps({
    "link-file": opened("/workspace/probe/link-file"),
    "link-dir": opened("/workspace/probe/link-dir/target.txt"),
    "dev-null": opened("/workspace/probe/dev-null"),
    "bound": opened("/workspace/probe/bound/target.txt"),
    "planted-file": opened("/tmp/planted-file", os.O_WRONLY | os.O_CREAT),
    "planted-fifo": opened("/tmp/planted-fifo", os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK),
    "candidate-link-file": sandbox("cat", "/workspace/probe/link-file").stdout.strip(),
    "candidate-hard-link": sandbox("ln", "/etc/shadow", "/workspace/probe/hard-link").returncode,
    "candidate-farm-variables": sorted(line.split("=")[0] for line in env if line.startswith("FARM_")),
}))
"#;
        let request = farm_protocol::RunTestsRequest {
            program: farm_protocol::Program::Argv(vec!["/usr/bin/python3".into(), "-I".into(), "-c".into(), probe.into()]),
            cwd: "/opt/farm-tests".into(),
            env: [("FARM_SEED".to_string(), "7".to_string()), ("FARM_TESTS_DIR".to_string(), "/opt/farm-tests".to_string())].into(),
            user: "999:999".into(),
            timeout_ms: 60_000,
            stdout_cap: 1 << 16,
            stderr_cap: 1 << 16,
            tests_dir: "/opt/farm-tests".into(),
            private_tests: true,
            reward_file: "/opt/farm-tests/.reward-probe".into(),
            junit_file: "/opt/farm-tests/junit.xml".into(),
            sweep_uids: vec![farm_protocol::CANDIDATE_UID, farm_protocol::CHECKER_UID],
            checker_view: true,
            shared: None,
        };
        let out = agent.run_tests(request, Vec::new()).await.unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let seen: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}{}", String::from_utf8_lossy(&out.stderr)));
        let expected = serde_json::json!({
            "link-file": "ELOOP",
            "link-dir": "ELOOP",
            "dev-null": "EACCES",
            "bound": "ENOENT",
            "planted-file": "EACCES",
            "planted-fifo": "EACCES",
            "candidate-link-file": "target",
            "candidate-hard-link": 1,
            "candidate-farm-variables": [],
        });
        assert_eq!(seen, expected);
        // The checker's view was its own: the VM's workspace still has its mount.
        let still = agent.exec(root("cat /workspace/probe/bound/target.txt")).await.unwrap();
        assert_eq!(still.stdout_text().trim(), "target");
    });
}
