#!/usr/bin/env bash
# Reset in place against forks, on Debian's QEMU and on the one with farm's reset patch, in
# one run (docs/snapshots.md, "Reset in place"):
#
#   bench/reset.sh [RESETS]       (after scripts/setup.sh; default 50 resets, 20 forks a mode)
#
# Runs `farm bench fork` once per QEMU and prints, for each, the reset and its parts, reset to
# first exec, and forks to first exec (no pool, incoming pool, resumed pool).
set -euo pipefail
cd "$(dirname "$0")/.."
RESETS="${1:-50}"
FARM="$PWD/target/release/farm"
[ -x "$FARM" ] || { echo "build farm first: cargo build --release -p farm" >&2; exit 1; }
PATCHED="$(readlink -f "${FARM_CACHE_DIR:-$HOME/.cache/farm}/current/qemu-farm-reset/bin/qemu-system-x86_64" || true)"
[ -x "$PATCHED" ] || { echo "QEMU with the reset patch is missing: run scripts/setup.sh" >&2; exit 1; }
summary() { # summary JSON_FILE
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
def line(name, v):
    print(f"  {name:<36} p50 {v['p50']:8.1f} ms   p99 {v['p99']:8.1f} ms   (n={v['n']})")
line("reset (stop to loaded)", r["reset_ms"])
for part, v in r["reset_parts_ms"].items():
    line("  " + part, v)
line("reset to first exec", r["reset_to_first_exec_ms"])
line("fork to first exec, resumed pool", r["fork_to_first_exec_resumed_pool_ms"])
line("fork to first exec, incoming pool", r["fork_to_first_exec_warm_pool_ms"])
line("fork to first exec, no pool", r["fork_to_first_exec_no_pool_ms"])
rf = r["reset_to_first_exec_ms"]["p50"]
print(f"  ratio no-pool fork / reset to first exec (p50): {r['fork_to_first_exec_no_pool_ms']['p50'] / rf:.2f}")
PY
}
OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
for qemu in debian patched; do
  if [ "$qemu" = debian ]; then export FARM_QEMU=qemu-system-x86_64; else export FARM_QEMU="$PATCHED"; fi
  echo "=== $qemu QEMU: $("${FARM_QEMU:-qemu-system-x86_64}" --version | head -1)"
  "$FARM" bench fork -n 20 --cold 1 --alive 2 --resets "$RESETS" --json 2>/dev/null >"$OUT"
  summary "$OUT"
done
