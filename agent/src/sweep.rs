//! Killing processes and waiting until they are gone, natively: no shell and no binary from
//! the guest's disk takes part, so a rollout that replaced `/bin/sh` or `kill` cannot keep a
//! process alive into the verdict.

use std::time::{Duration, Instant};

use crate::sys;

/// Which processes a sweep kills.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    /// Processes with one of these uids (real, effective, saved or file system).
    pub uids: Vec<u32>,
    /// Processes in this process group or session.
    pub group: Option<i32>,
    /// Every process except PID 1 and the agent.
    pub everything: bool,
}

/// What a sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    pub killed: u32,
    /// No target was left alive (zombies count as gone: they run no code).
    pub complete: bool,
}

/// How long a sweep keeps killing before it reports that something survived.
const SWEEP_LIMIT: Duration = Duration::from_secs(10);

/// One process as `/proc` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    pub state: char,
    pub pgrp: i32,
    pub session: i32,
    pub kernel_thread: bool,
    pub uids: [u32; 4],
}

const PF_KTHREAD: u64 = 0x0020_0000;

/// Parses `/proc/PID/stat` and the `Uid:` line of `/proc/PID/status`.
pub fn parse_proc(pid: i32, stat: &str, status: &str) -> Option<ProcInfo> {
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let pgrp = fields.get(2)?.parse().ok()?;
    let session = fields.get(3)?.parse().ok()?;
    let flags: u64 = fields.get(6)?.parse().ok()?;
    Some(ProcInfo {
        pid,
        state,
        pgrp,
        session,
        kernel_thread: flags & PF_KTHREAD != 0,
        uids: parse_uids(status)?,
    })
}

/// The real, effective, saved and file-system uids from the `Uid:` line of
/// `/proc/PID/status`.
fn parse_uids(status: &str) -> Option<[u32; 4]> {
    let uid_line = status.lines().find(|l| l.starts_with("Uid:"))?;
    let ids: Vec<u32> = uid_line[4..]
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    Some([*ids.first()?, *ids.get(1)?, *ids.get(2)?, *ids.get(3)?])
}

/// Whether a sweep must kill this process.
pub fn is_target(info: &ProcInfo, targets: &Targets, own_pid: i32) -> bool {
    if info.pid <= 1 || info.pid == own_pid || info.kernel_thread || info.state == 'Z' || info.state == 'X' {
        return false;
    }
    targets.everything
        || info.uids.iter().any(|u| targets.uids.contains(u))
        || targets.group.is_some_and(|g| info.pgrp == g || info.session == g)
}

fn processes() -> Vec<ProcInfo> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // Kernel threads and the dead are never targets: their uids need not be read
            // (every read of /proc costs in a fresh fork under TCG).
            let mut info = parse_proc(pid, &stat, "Uid:\t0\t0\t0\t0\n")?;
            if !info.kernel_thread && !matches!(info.state, 'Z' | 'X') {
                info.uids = parse_uids(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)?;
            }
            Some(info)
        })
        .collect()
}

/// Kills the targets until none is left (or the limit passes). For each uid, a process of
/// that uid first sends SIGKILL to -1, which reaches every process of the user at once, a
/// fork bomb included; then every remaining target found in `/proc` is killed one by one.
pub fn sweep(targets: &Targets) -> Swept {
    let own = std::process::id() as i32;
    let started = Instant::now();
    // What is there before the first kill, so the count includes what kill(-1) takes.
    let mut seen: std::collections::HashSet<i32> = processes()
        .into_iter()
        .filter(|p| is_target(p, targets, own))
        .map(|p| p.pid)
        .collect();
    loop {
        for &uid in &targets.uids {
            if uid != 0 {
                sys::kill_all_of_user(uid);
            }
        }
        let alive: Vec<ProcInfo> = processes().into_iter().filter(|p| is_target(p, targets, own)).collect();
        if alive.is_empty() {
            return Swept {
                killed: seen.len() as u32,
                complete: true,
            };
        }
        for p in &alive {
            seen.insert(p.pid);
            sys::kill_pid(p.pid);
        }
        if started.elapsed() > SWEEP_LIMIT {
            return Swept {
                killed: seen.len() as u32,
                complete: false,
            };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str =
        "Name:\tpython3\nState:\tS (sleeping)\nTgid:\t77\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\n";

    #[test]
    fn stat_with_spaces_and_parens_in_the_name() {
        let stat = "77 (evil) S 1 2 3 (x) R 1 76 76 0 -1 4194560 0 0";
        let info = parse_proc(77, stat, STATUS).unwrap();
        assert_eq!(
            (info.state, info.pgrp, info.session, info.kernel_thread),
            ('R', 76, 76, false)
        );
        assert_eq!(info.uids, [1000; 4]);
        let kthread = parse_proc(2, "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0", "Uid:\t0\t0\t0\t0\n").unwrap();
        assert!(kthread.kernel_thread);
        assert!(parse_proc(5, "garbage", STATUS).is_none());
    }

    #[test]
    fn targets_by_uid_group_or_everything_but_never_init_self_or_kernel() {
        let p = |pid, uids: [u32; 4], pgrp| ProcInfo {
            pid,
            state: 'S',
            pgrp,
            session: pgrp,
            kernel_thread: false,
            uids,
        };
        let by_uid = Targets {
            uids: vec![1000],
            ..Default::default()
        };
        assert!(is_target(&p(50, [0, 0, 1000, 0], 50), &by_uid, 9), "a saved uid counts");
        assert!(!is_target(&p(50, [0; 4], 50), &by_uid, 9));
        let by_group = Targets {
            group: Some(40),
            ..Default::default()
        };
        assert!(is_target(&p(41, [0; 4], 40), &by_group, 9));
        let all = Targets {
            everything: true,
            ..Default::default()
        };
        assert!(is_target(&p(41, [0; 4], 40), &all, 9));
        assert!(!is_target(&p(1, [0; 4], 1), &all, 9));
        assert!(!is_target(&p(9, [0; 4], 9), &all, 9));
        let mut zombie = p(60, [1000; 4], 60);
        zombie.state = 'Z';
        assert!(!is_target(&zombie, &all, 9));
        let mut kernel = p(3, [0; 4], 0);
        kernel.kernel_thread = true;
        assert!(!is_target(&kernel, &all, 9));
    }

    /// Real processes of a throwaway uid, forking and hiding in sessions of their own: the
    /// sweep leaves none, and the caller survives. Needs root (as CI and the guest agent).
    #[test]
    fn a_sweep_kills_every_process_of_a_user_however_they_hide() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        use std::os::unix::process::CommandExt;
        const UID: u32 = 54_321;
        let script = "for i in 1 2 3 4; do (setsid sh -c 'while :; do sleep 0.05 & wait; done' &); done; \
                      (while :; do (sleep 30 &); sleep 0.02; done) & sleep 30";
        let mut children = Vec::new();
        for _ in 0..3 {
            children.push(
                std::process::Command::new("sh")
                    .arg("-c")
                    .arg(script)
                    .uid(UID)
                    .gid(UID)
                    .spawn()
                    .unwrap(),
            );
        }
        let count = || {
            processes()
                .into_iter()
                .filter(|p| p.uids.contains(&UID) && p.state != 'Z')
                .count()
        };
        // Wait (generously: a loaded machine) until the shells have started their children.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while count() < 6 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(count() >= 6, "the user's processes are running");
        let swept = sweep(&Targets {
            uids: vec![UID],
            ..Default::default()
        });
        assert!(swept.complete && swept.killed as usize >= 6, "{swept:?}");
        for mut child in children {
            let _ = child.wait();
        }
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(count(), 0, "a process of the user survived");
    }
}
