//! What a VM costs the host, read from `/proc`: a process's memory (PSS, USS, private dirty)
//! and where it goes (guest RAM, TCG's translation buffer, heap, stacks, libraries), its CPU
//! time, and the host's memory and CPU counters. Used by `farm bench density` and by
//! `farm serve`'s admission (the measured cost of a live session).

use std::path::Path;

/// One process's memory, in bytes (`/proc/PID/smaps_rollup`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessMemory {
    pub rss: u64,
    /// Proportional set size: private pages plus each shared page divided by its sharers.
    pub pss: u64,
    /// Unique set size: pages no other process maps (private clean + private dirty).
    pub uss: u64,
    pub private_dirty: u64,
}

impl ProcessMemory {
    pub fn of(pid: u32) -> Option<ProcessMemory> {
        std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
            .ok()
            .map(|t| ProcessMemory::parse(&t))
    }

    pub fn parse(smaps_rollup: &str) -> ProcessMemory {
        let mut m = ProcessMemory::default();
        for line in smaps_rollup.lines() {
            let Some((key, bytes)) = field(line) else { continue };
            match key {
                "Rss" => m.rss = bytes,
                "Pss" => m.pss = bytes,
                "Private_Clean" => m.uss += bytes,
                "Private_Dirty" => {
                    m.uss += bytes;
                    m.private_dirty = bytes;
                }
                _ => {}
            }
        }
        m
    }
}

/// `Key:   123 kB` -> (key, bytes).
fn field(line: &str) -> Option<(&str, u64)> {
    let (key, rest) = line.split_once(':')?;
    let mut words = rest.split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => Some((key, n * 1024)),
        _ => None,
    }
}

/// Where a QEMU process's private memory goes (USS by kind of mapping, bytes).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Breakdown {
    /// Guest RAM pages the fork wrote (its copy-on-write copies of the snapshot's RAM file).
    pub guest_ram: u64,
    /// TCG's buffer of translated code (an anonymous executable mapping).
    pub translation_buffer: u64,
    /// The main heap (`[heap]`).
    pub heap: u64,
    /// Other anonymous memory: malloc's thread arenas, thread and coroutine stacks, QEMU's
    /// own allocations made with mmap.
    pub anonymous: u64,
    /// Data of the QEMU binary and its libraries written at load time (relocations) or later.
    pub binaries: u64,
    pub other: u64,
}

impl Breakdown {
    /// `ram_file`: the guest RAM file's path, as `/proc/PID/maps` names it.
    pub fn of(pid: u32, ram_file: &Path) -> Option<Breakdown> {
        std::fs::read_to_string(format!("/proc/{pid}/smaps"))
            .ok()
            .map(|t| Breakdown::parse(&t, ram_file))
    }

    pub fn parse(smaps: &str, ram_file: &Path) -> Breakdown {
        let ram = ram_file.to_string_lossy();
        let mut b = Breakdown::default();
        let mut kind: Option<fn(&mut Breakdown) -> &mut u64> = None;
        for line in smaps.lines() {
            if let Some((key, bytes)) = field(line) {
                if matches!(key, "Private_Clean" | "Private_Dirty") {
                    if let Some(slot) = kind {
                        *slot(&mut b) += bytes;
                    }
                }
                continue;
            }
            // A mapping's header: `start-end perms offset dev inode [path]`.
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.len() < 5 || !words[0].contains('-') {
                continue;
            }
            let perms = words[1];
            let path = words.get(5..).map(|w| w.join(" ")).unwrap_or_default();
            kind = Some(if !path.is_empty() && path.trim_end_matches(" (deleted)") == ram {
                |b| &mut b.guest_ram
            } else if path == "[heap]" {
                |b| &mut b.heap
            } else if path.is_empty() && perms.contains('x') {
                |b| &mut b.translation_buffer
            } else if path.is_empty() || path == "[stack]" {
                |b| &mut b.anonymous
            } else if path.starts_with('/') {
                |b| &mut b.binaries
            } else {
                |b| &mut b.other
            });
        }
        b
    }
}

/// CPU time a process has used (user + system), in clock ticks (`/proc/PID/stat`).
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line; `rest` starts at field 3.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
pub fn ticks_per_second() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100, |t| t as u64)
}

/// Ticks the whole host spent busy and in total, over all cores (`/proc/stat`).
pub fn host_cpu_ticks() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|w| w.parse().ok()).collect();
    let total: u64 = v.iter().take(8).sum();
    // idle and iowait are the 4th and 5th.
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// The host's memory (`/proc/meminfo`), in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostMemory {
    pub total: u64,
    pub available: u64,
}

impl HostMemory {
    pub fn probe() -> Option<HostMemory> {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .map(|t| HostMemory::parse(&t))
    }

    pub fn parse(meminfo: &str) -> HostMemory {
        let mut m = HostMemory::default();
        for line in meminfo.lines() {
            match field(line) {
                Some(("MemTotal", b)) => m.total = b,
                Some(("MemAvailable", b)) => m.available = b,
                _ => {}
            }
        }
        m
    }

    pub fn used(&self) -> u64 {
        self.total.saturating_sub(self.available)
    }
}

/// Processes the OOM killer has killed since boot (`/proc/vmstat` `oom_kill`).
pub fn oom_kills() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/vmstat").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0c0000000-55d0c0100000 r--p 00000000 fe:01 123 /usr/bin/qemu-system-x86_64
Rss:                1024 kB
Private_Clean:        12 kB
Private_Dirty:         8 kB
55d0c1000000-55d0c2000000 rw-p 00000000 00:00 0 [heap]
Private_Dirty:      4096 kB
7f0000000000-7f0004000000 rwxp 00000000 00:00 0 
Private_Dirty:     11776 kB
7f1000000000-7f1010000000 rw-p 00000000 fe:01 77 /cache/snapshots/t-1/memory (deleted)
Private_Clean:         0 kB
Private_Dirty:      2900 kB
7f2000000000-7f2000800000 rw-p 00000000 00:00 0 
Private_Dirty:       400 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
Private_Dirty:        64 kB
7ffd10000000-7ffd10002000 r--p 00000000 00:00 0 [vvar]
Private_Clean:         8 kB
";

    #[test]
    fn a_breakdown_sorts_each_mapping() {
        let b = Breakdown::parse(SMAPS, Path::new("/cache/snapshots/t-1/memory"));
        assert_eq!(b.binaries, 20 * 1024);
        assert_eq!(b.heap, 4096 * 1024);
        assert_eq!(b.translation_buffer, 11776 * 1024);
        assert_eq!(b.guest_ram, 2900 * 1024);
        assert_eq!(b.anonymous, 464 * 1024);
        assert_eq!(b.other, 8 * 1024);
    }

    #[test]
    fn rollup_and_meminfo_are_read_in_bytes() {
        let m = ProcessMemory::parse(
            "Rss: 30000 kB\nPss: 20000 kB\nPrivate_Clean: 100 kB\nPrivate_Dirty: 19000 kB\nSwap: 0 kB\n",
        );
        assert_eq!(
            (m.rss, m.pss, m.uss, m.private_dirty),
            (30000 << 10, 20000 << 10, 19100 << 10, 19000 << 10)
        );
        let h = HostMemory::parse("MemTotal: 24000000 kB\nMemFree: 1 kB\nMemAvailable: 20000000 kB\n");
        assert_eq!(h.used(), 4_000_000 << 10);
    }

    #[test]
    fn this_process_can_be_read() {
        let me = std::process::id();
        assert!(ProcessMemory::of(me).is_some_and(|m| m.pss > 0 && m.uss > 0));
        assert!(cpu_ticks(me).is_some());
        assert!(host_cpu_ticks().is_some_and(|(busy, total)| total >= busy && total > 0));
        assert!(HostMemory::probe().is_some_and(|h| h.total > 0 && h.available > 0));
        assert!(oom_kills().is_some());
    }
}
