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

boots() { # boots NAME ROUND CMDLINE -> prints "uncalibrated booted"
  local dir="$work/$1.$2"
  boot_at_once "$dir" "$GUESTS" "$3" >/dev/null
  echo "$(grep -l 'Unable to calibrate' "$dir"/*.log | wc -l) $(grep -l 'VFS' "$dir"/*.log | wc -l)"
}
without_u=0 with_u=0 without_ok=0 with_ok=0
for r in $(seq 1 "$ROUNDS"); do
  read -r u ok < <(boots without "$r" "$BASE"); without_u=$((without_u + u)) without_ok=$((without_ok + ok))
  echo "round $r without $KHZ: $u of $GUESTS uncalibrated, $ok booted"
  read -r u ok < <(boots with "$r" "$BASE $KHZ"); with_u=$((with_u + u)) with_ok=$((with_ok + ok))
  echo "round $r with it:    $u of $GUESTS uncalibrated, $ok booted"
done
total=$((ROUNDS * GUESTS))
echo "beside $LOAD busy loops: without $KHZ $without_u of $total ran on jiffies ($without_ok booted); with it $with_u of $total ($with_ok booted)"
