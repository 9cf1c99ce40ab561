#!/usr/bin/env bash
# Shared by bench/boot-under-load.sh and bench/boot-clock.sh: guest kernels booted straight
# under QEMU, without a disk, beside busy loops.
#
#   source bench/diskless-boots.sh LOAD      starts LOAD busy loops; sets KERNEL and work
#   boot_at_once DIR GUESTS CMDLINE          boots GUESTS kernels at once, each console in
#                                            DIR/N.log; returns when all have ended
#   compare_boots OPTION PATTERN WHAT        ROUNDS rounds of GUESTS boots of BASE without
#                                            OPTION, then with it: counts the boots whose
#                                            console shows PATTERN (they WHAT) per round
#                                            and in all
# A boot that gets through ends at "VFS: Unable to mount root fs" (there is no disk).
CACHE="${FARM_CACHE_DIR:-$HOME/.cache/farm}"
KERNEL="$CACHE/current/kernel/vmlinux"
[ -f "$KERNEL" ] || { echo "no guest kernel at $KERNEL: run scripts/setup.sh first" >&2; exit 1; }
work=$(mktemp -d)
loops=()
cleanup() { kill "${loops[@]}" 2>/dev/null || true; pkill -P $$ qemu-system 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
for _ in $(seq 1 "${1:?usage: source bench/diskless-boots.sh LOAD}"); do yes >/dev/null & loops+=($!); done

boot_at_once() {
  mkdir -p "$1"
  for i in $(seq 1 "$2"); do
    timeout 120 qemu-system-x86_64 -M microvm,x-option-roms=off,rtc=off,isa-serial=on,acpi=off \
      -accel tcg -cpu max -m 512 -nodefaults -no-user-config -display none -no-reboot \
      -serial "file:$1/$i.log" -kernel "$KERNEL" -append "$3" &
  done
  wait
}

count_boots() { # count_boots NAME ROUND CMDLINE PATTERN -> prints "matched booted"
  local dir="$work/$1.$2"
  boot_at_once "$dir" "$GUESTS" "$3" >/dev/null
  echo "$(grep -l "$4" "$dir"/*.log | wc -l) $(grep -l 'VFS' "$dir"/*.log | wc -l)"
}

compare_boots() {
  local option="$1" pattern="$2" what="$3" r n ok
  local without_n=0 with_n=0 without_ok=0 with_ok=0
  for r in $(seq 1 "$ROUNDS"); do
    # In a subshell, whose `wait` is for its guests, not for the busy loops.
    read -r n ok < <(count_boots without "$r" "$BASE" "$pattern")
    without_n=$((without_n + n)) without_ok=$((without_ok + ok))
    echo "round $r without $option: $n of $GUESTS $what, $ok booted"
    read -r n ok < <(count_boots with "$r" "$BASE $option" "$pattern")
    with_n=$((with_n + n)) with_ok=$((with_ok + ok))
    echo "round $r with it: $n of $GUESTS $what, $ok booted"
  done
  local total=$((ROUNDS * GUESTS))
  echo "beside $LOAD busy loops: without $option $without_n of $total $what ($without_ok booted); with it $with_n of $total ($with_ok booted)"
}
