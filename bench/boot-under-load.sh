#!/usr/bin/env bash
# Boots guest kernels on a host kept busy by LOAD busy loops, with and without the kernel's
# `no_timer_check`, and counts the boots that panic in the kernel's early timer check
# ("IO-APIC + timer doesn't work!"). Why farm's command line carries the option: see
# KERNEL_CMDLINE in vmm/src/qemu.rs.
#
#   bench/boot-under-load.sh [ROUNDS] [GUESTS] [LOAD]      (defaults 3, 6, 24)
#
# Each round boots GUESTS kernels at once without the option, then GUESTS with it. The
# guests have no disk: a boot that passes the check ends at "VFS: Unable to mount root fs",
# which counts as a boot that got through. Needs scripts/setup.sh first (the guest kernel).
# Takes about 2 minutes for 3 rounds on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-3}" GUESTS="${2:-6}" LOAD="${3:-24}"
BASE="console=ttyS0 reboot=t panic=-1 root=/dev/vda rw 8250.nr_uarts=1 tsc=reliable"
source bench/diskless-boots.sh "$LOAD"

compare_boots no_timer_check 'IO-APIC + timer' "panicked"
