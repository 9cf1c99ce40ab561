#!/usr/bin/env bash
# Shared by bench/boot-under-load.sh and bench/boot-clock.sh: guest kernels booted straight
# under QEMU, without a disk, beside busy loops.
#
#   source bench/diskless-boots.sh LOAD      starts LOAD busy loops; sets KERNEL and work
#   boot_at_once DIR GUESTS CMDLINE          boots GUESTS kernels at once, each console in
#                                            DIR/N.log; returns when all have ended
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
