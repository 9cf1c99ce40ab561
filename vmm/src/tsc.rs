//! The host's TSC frequency, told to TCG guests so they need not measure it.
//!
//! Under TCG the guest's TSC runs at the host's rate, but the guest kernel can only measure
//! that rate against the emulated PIT, and on microvm it has no other reference (no HPET, no
//! ACPI PM timer). Both of its PIT calibrations want evenly timed port reads, which an
//! emulated PIT on a busy host does not give: on this 2-core machine, four guests booting at
//! once all logged "tsc: Unable to calibrate against PIT" (16 of 16, `bench/boot-clock.sh`;
//! one at a time, 0 of 8; `farm vm run`, one at a time, 3 of 12), marked the TSC unstable and
//! ran on jiffies: a 4 ms clock, and 250 timer interrupts a second in every fork of such a
//! template. The kernel's `tsc_early_khz=` skips the measurement; farm measures the host's
//! TSC once per process instead, against a clock that is not emulated.

use std::sync::OnceLock;
use std::time::Duration;

use nix::time::{clock_gettime, ClockId};

/// How long the host's TSC is timed against `CLOCK_MONOTONIC_RAW`. The error is the width
/// of the narrowest of a few back-to-back reads (tens of nanoseconds), so a few parts per
/// million here: far below what a guest notices, and farm sets a fork's clock anyway.
const WINDOW: Duration = Duration::from_millis(20);

/// The host's TSC frequency in kHz, measured once per process; None when the host's TSC is
/// not invariant (`constant_tsc` and `nonstop_tsc` in /proc/cpuinfo) or this is not x86-64,
/// and the guest must calibrate as it can.
pub fn host_tsc_khz() -> Option<u32> {
    static KHZ: OnceLock<Option<u32>> = OnceLock::new();
    *KHZ.get_or_init(|| {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        if !invariant(&cpuinfo) {
            tracing::debug!("the host's TSC is not invariant: guests calibrate their own");
            return None;
        }
        let khz = measure();
        tracing::debug!("host TSC: {khz:?} kHz");
        khz
    })
}

/// Whether every CPU's flags name both `constant_tsc` and `nonstop_tsc`.
fn invariant(cpuinfo: &str) -> bool {
    let mut flags = cpuinfo.lines().filter(|l| l.starts_with("flags")).peekable();
    flags.peek().is_some()
        && flags.all(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.contains(&"constant_tsc") && words.contains(&"nonstop_tsc")
        })
}

#[cfg(target_arch = "x86_64")]
fn measure() -> Option<u32> {
    let (t0, c0) = bracketed()?;
    std::thread::sleep(WINDOW);
    let (t1, c1) = bracketed()?;
    khz(t1.saturating_sub(t0), c1.wrapping_sub(c0))
}

#[cfg(not(target_arch = "x86_64"))]
fn measure() -> Option<u32> {
    None
}

/// kHz from `cycles` counted over `ns` nanoseconds; None when the numbers make no sense.
fn khz(ns: u64, cycles: u64) -> Option<u32> {
    if ns == 0 {
        return None;
    }
    let khz = (u128::from(cycles) * 1_000_000 / u128::from(ns)) as u64;
    // 100 MHz to 10 GHz: anything else is a broken clock, not a CPU.
    (100_000..=10_000_000).contains(&khz).then_some(khz as u32)
}

/// One (nanoseconds, TSC) pair: of a few reads of the TSC between two reads of the clock,
/// the one with the narrowest bracket, timed at the bracket's middle.
#[cfg(target_arch = "x86_64")]
fn bracketed() -> Option<(u64, u64)> {
    let now = || -> Option<u64> {
        let t = clock_gettime(ClockId::CLOCK_MONOTONIC_RAW).ok()?;
        Some(t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
    };
    let mut best: Option<(u64, u64, u64)> = None;
    for _ in 0..32 {
        let before = now()?;
        let tsc = rdtsc();
        let after = now()?;
        let width = after.saturating_sub(before);
        if best.is_none_or(|(w, _, _)| width < w) {
            best = Some((width, before + width / 2, tsc));
        }
    }
    best.map(|(_, at, tsc)| (at, tsc))
}

/// The TSC, read on this CPU.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn rdtsc() -> u64 {
    // SAFETY: RDTSC reads a counter into registers; it touches no memory, and every x86-64
    // CPU has it.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_tsc_that_is_constant_and_never_stops_counts() {
        let both = "flags\t\t: fpu tsc constant_tsc nonstop_tsc sse2\n";
        assert!(invariant(both));
        assert!(invariant(&format!("processor : 0\n{both}processor : 1\n{both}")));
        assert!(!invariant("flags\t\t: fpu tsc constant_tsc sse2\n"));
        assert!(
            !invariant(&format!("{both}flags\t\t: fpu tsc\n")),
            "every CPU must have both"
        );
        assert!(!invariant("processor : 0\n"), "no flags at all");
    }

    #[test]
    fn frequencies_come_from_cycles_over_time_and_nonsense_is_refused() {
        assert_eq!(khz(20_000_000, 52_000_000), Some(2_600_000));
        assert_eq!(khz(1_000_000, 2_599_998), Some(2_599_998));
        assert_eq!(khz(0, 1), None);
        assert_eq!(khz(1_000_000_000, 10), None, "10 Hz is no CPU");
        assert_eq!(khz(1_000, u64::MAX), None);
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn this_hosts_tsc_measures_as_a_plausible_frequency_twice_alike() {
        let (Some(a), Some(b)) = (measure(), measure()) else {
            panic!("an x86-64 host's TSC could not be timed");
        };
        // Two measurements agree to a tenth of a percent however busy the host (only the
        // narrowest bracket of each end counts, not the time in between).
        assert!(a.abs_diff(b) * 1000 < a, "{a} kHz, then {b} kHz");
    }
}
