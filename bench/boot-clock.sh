#!/usr/bin/env bash
# Boots guest kernels with and without `tsc_early_khz=` (the host's TSC frequency, as farm
# passes it to TCG guests) and counts the boots whose kernel could not calibrate its TSC
# ("tsc: Unable to calibrate against PIT") and so ran on jiffies. Why farm passes it: see
# vmm/src/tsc.rs.
#
#   bench/boot-clock.sh [ROUNDS] [GUESTS] [LOAD]      (defaults 4, 4, 0)
#
# Each round boots GUESTS kernels at once without the option, then GUESTS with it, beside
# LOAD busy loops. The guests have no disk; each boot ends at "VFS: Unable to mount root
# fs". Needs scripts/setup.sh first (the guest kernel and farm, whose command line gives
# the host's frequency). Takes about 2 minutes for 4 rounds on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-4}" GUESTS="${2:-4}" LOAD="${3:-0}"
KHZ=$(target/release/farm vm run --image minimal -- cat /proc/cmdline | grep -o 'tsc_early_khz=[0-9]*' || true)
[ -n "$KHZ" ] || { echo "farm gave its guest no tsc_early_khz= (not TCG, or the host's TSC is not invariant)" >&2; exit 1; }
echo "farm's guests get $KHZ"
BASE="console=ttyS0 reboot=t panic=-1 root=/dev/vda rw 8250.nr_uarts=1 tsc=reliable no_timer_check"
source bench/diskless-boots.sh "$LOAD"

compare_boots "$KHZ" 'Unable to calibrate' "ran on jiffies"
