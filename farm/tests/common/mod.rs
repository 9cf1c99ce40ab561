//! Helpers shared by the integration tests (each test crate uses some of them).
#![allow(dead_code)]

pub mod serve;

use std::path::Path;

/// No live QEMU process uses `run_dir` (zombies waiting for a lazy reaper are dead already).
pub fn assert_no_qemu_of(run_dir: &Path) {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
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
            assert!(
                !fds.iter().any(|f| f.starts_with(run_dir)),
                "a QEMU of the run is still alive: {}",
                String::from_utf8_lossy(&cmdline)
            );
        }
    }
}
