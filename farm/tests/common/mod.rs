//! Helpers shared by the integration tests (each test crate uses some of them).
#![allow(dead_code)]

pub mod python;
pub mod serve;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// What a command printed, standard output then standard error.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `farm run SUITE` by `farm` (a command of the farm binary, with what it needs set) with no
/// standard input, run to its end, which must be a success: what it printed.
pub fn farm_run(mut farm: Command, suite: &Path) -> Output {
    let o = farm.arg("run").arg(suite).stdin(Stdio::null()).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    o
}

/// The rows of a run's journal, `out/journal.jsonl`.
pub fn journal_rows(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("journal.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `farm ARGS` with no standard input, run to its end.
pub fn farm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_farm"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `command`, started through util-linux's `setpriv --pdeathsig TERM`: the child gets SIGTERM
/// when the thread that starts it ends, and so when the test binary is killed by a signal,
/// which runs no destructor. Build it, and spawn it, on the test's own thread. Its standard
/// streams are set afterwards (they are not carried over).
pub fn dies_with_test(command: Command) -> Command {
    let mut wrapped = Command::new("setpriv");
    wrapped
        .args(["--pdeathsig", "TERM", "--"])
        .arg(command.get_program())
        .args(command.get_args());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => wrapped.env(key, value),
            None => wrapped.env_remove(key),
        };
    }
    if let Some(dir) = command.get_current_dir() {
        wrapped.current_dir(dir);
    }
    wrapped
}

/// Within a minute, no live QEMU process uses `run_dir` (zombies waiting for a lazy reaper
/// are dead already).
pub fn assert_no_qemu_of(run_dir: &Path) {
    // A QEMU killed as its owner exits can still be in the middle of exiting (holding its
    // files) for a moment on a loaded host: what counts is that it goes, not that it is
    // already gone. One left behind stays, and fails this after a minute.
    let started = std::time::Instant::now();
    loop {
        let Some(left) = qemu_of(run_dir) else { return };
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "a QEMU of the run is still alive: {left}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// The command line of a live (not zombie) QEMU holding a file under `run_dir`, if any.
fn qemu_of(run_dir: &Path) -> Option<String> {
    qemus_of(run_dir).into_iter().next().map(|(_, cmdline)| cmdline)
}

/// Every live (not zombie) QEMU holding a file under `run_dir`: its pid and command line.
#[allow(dead_code)] // not every test binary looks for its VMs' processes
pub fn qemus_of(run_dir: &Path) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let state = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = state
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if !zombie && String::from_utf8_lossy(&cmdline).contains("qemu-system") {
            let fds = std::fs::read_dir(entry.path().join("fd"))
                .map(|d| {
                    d.flatten()
                        .filter_map(|f| std::fs::read_link(f.path()).ok())
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            if fds.iter().any(|f| f.starts_with(run_dir)) {
                found.push((pid, String::from_utf8_lossy(&cmdline).into_owned()));
            }
        }
    }
    found
}

/// The pids of the live QEMUs of `run_dir`.
#[allow(dead_code)] // not every test binary looks for its VMs' processes
pub fn qemu_pids(run_dir: &Path) -> Vec<u32> {
    qemus_of(run_dir).into_iter().map(|(pid, _)| pid).collect()
}

/// The live QEMUs of `run_dir` that were not among `before`.
#[allow(dead_code)]
pub fn new_qemus(run_dir: &Path, before: &[u32]) -> Vec<u32> {
    qemu_pids(run_dir).into_iter().filter(|p| !before.contains(p)).collect()
}

/// The QEMU a call made: the one live QEMU of `run_dir` that was not among `before`.
#[allow(dead_code)]
pub fn new_qemu(run_dir: &Path, before: &[u32]) -> u32 {
    let new = new_qemus(run_dir, before);
    assert_eq!(new.len(), 1, "one new QEMU: {new:?}");
    new[0]
}

/// Sends `signal` (`-KILL`, `-STOP`, `-CONT`) to process `pid`.
#[allow(dead_code)]
pub fn signal(pid: u32, signal: &str) {
    let sent = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// Arguments of `python -m pytest`, quiet, reporting skips, with no cache: then `args`.
pub fn pytest_args<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"];
    all.extend_from_slice(args);
    all
}

/// `N` temporary folders, each removed when dropped.
pub fn temp_dirs<const N: usize>() -> [tempfile::TempDir; N] {
    std::array::from_fn(|_| tempfile::tempdir().unwrap())
}

/// A tar archive of `(path, contents)` files.
#[allow(dead_code)] // not every test binary uploads archives
pub fn tar_of(files: &[(&str, &str)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, text) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, path, text.as_bytes()).unwrap();
    }
    builder.into_inner().unwrap()
}
