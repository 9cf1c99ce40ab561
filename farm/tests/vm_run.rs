//! `farm vm run` end to end, and the guarantee that no QEMU outlives farm on any exit path.

use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn farm() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_farm"));
    c.env_remove("FARM_TEST_PANIC_AFTER_EXEC");
    c
}

fn vm_run(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = farm()
        .args(["vm", "run", "--boot-timeout", "300"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// QEMU processes started by the farm process `pid` (they carry `-name farm-PID-N`).
fn qemus_of(pid: u32) -> Vec<u32> {
    let marker = format!("farm-{pid}-");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{p}/cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains("qemu-system") && cmdline.contains(&marker) {
            found.push(p);
        }
    }
    found
}

/// Waits (bounded) for the QEMUs of `pid` to be gone; returns those still alive.
fn survivors_after_exit(pid: u32) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let alive = qemus_of(pid);
        if alive.is_empty() || Instant::now() > deadline {
            return alive;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_for_qemu(child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while qemus_of(child.id()).is_empty() {
        assert!(child.try_wait().unwrap().is_none(), "farm exited before starting QEMU");
        assert!(Instant::now() < deadline, "QEMU never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Let the guest boot and the command start; the guarantee holds at any moment anyway.
    std::thread::sleep(Duration::from_secs(3));
}

#[test]
fn python_prints_42() {
    let out = vm_run(&["--image", "python", "--", "python3", "-c", "print(6*7)"], b"");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n");
}

#[test]
fn stdin_stdout_stderr_and_exit_code_pass_through() {
    let out = vm_run(
        &[
            "--env",
            "X=1",
            "--workdir",
            "/tmp",
            "--",
            "sh",
            "-c",
            "cat; echo $X$(pwd) >&2; exit 5",
        ],
        b"piped in",
    );
    assert_eq!(out.status.code(), Some(5));
    assert_eq!(out.stdout, b"piped in");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "1/tmp\n");
}

#[test]
fn signal_and_timeout_exit_codes() {
    let killed = vm_run(&["--", "sh", "-c", "kill -KILL $$"], b"");
    assert_eq!(killed.status.code(), Some(137));
    let slow = vm_run(&["--timeout", "1", "--", "sleep", "60"], b"");
    assert_eq!(slow.status.code(), Some(124));
    assert!(String::from_utf8_lossy(&slow.stderr).contains("timed out"));
}

#[test]
fn missing_program_exits_127_with_a_message() {
    let out = vm_run(&["--", "no-such-program"], b"");
    assert_eq!(out.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-program"));
}

#[test]
fn bad_arguments_are_explained() {
    let out = farm()
        .args(["vm", "run", "--image", "ubuntu", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("minimal, python"));
    let out = farm()
        .args(["vm", "run", "--env", "NOEQUALS", "--", "true"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("KEY=VALUE"));
}

// --- no orphans, on every exit path -----------------------------------------------------

fn run_to_exit_then_check(args: &[&str], envs: &[(&str, &str)]) -> std::process::ExitStatus {
    let mut child = farm()
        .args(["vm", "run", "--boot-timeout", "300"])
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let status = child.wait().unwrap();
    assert_eq!(
        survivors_after_exit(pid),
        Vec::<u32>::new(),
        "QEMU outlived farm ({status})"
    );
    status
}

#[test]
fn no_orphans_after_normal_exit_error_timeout_and_panic() {
    assert!(run_to_exit_then_check(&["--", "true"], &[]).success());
    // An error after boot (bad working directory).
    assert!(!run_to_exit_then_check(&["--workdir", "/no/such/dir", "--", "true"], &[]).success());
    assert_eq!(
        run_to_exit_then_check(&["--timeout", "1", "--", "sleep", "60"], &[]).code(),
        Some(124)
    );
    let panicked = run_to_exit_then_check(&["--", "true"], &[("FARM_TEST_PANIC_AFTER_EXEC", "1")]);
    assert_eq!(panicked.code(), Some(101));
}

fn signal_mid_run(signal: i32) -> std::process::ExitStatus {
    let mut child = farm()
        .args(["vm", "run", "--boot-timeout", "300", "--", "sleep", "600"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_qemu(&mut child);
    let pid = child.id();
    let sent = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(sent.success());
    let status = child.wait().unwrap();
    assert_eq!(
        survivors_after_exit(pid),
        Vec::<u32>::new(),
        "QEMU outlived farm after signal {signal}"
    );
    status
}

#[test]
fn no_orphans_after_sigint() {
    assert_eq!(signal_mid_run(2).code(), Some(130));
}

#[test]
fn no_orphans_after_sigterm() {
    assert_eq!(signal_mid_run(15).code(), Some(143));
}

#[test]
fn no_orphans_after_sigkill() {
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(signal_mid_run(9).signal(), Some(9));
}
