#!/usr/bin/env bash
# The sandbox API of `farm serve`: sandbox create to first exec, from a cached environment
# (the minimal image), with a warm pool and without one (the baseline, in the same run); then
# 100 sandboxes created, used and deleted in one go, checked for leaks (QEMU processes,
# files, memory).
#
#   bench/sandboxes.sh [N_LATENCY] [N_LEAK]     (defaults 50 and 100; after scripts/setup.sh)
#
# Prints p50/p99 per mode and their ratio, and the leak check; the numbers go into
# bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
FARM="$PWD/target/release/farm"
N="${1:-50}"
LEAK="${2:-100}"
source bench/serve-lib.sh
serve_workdir sandboxes-bench
for pool in 0 2; do
  cat >"$work/serve-$pool.toml" <<TOML
[serve]
suites = []
out = "$work/out-$pool"
max_sessions = 200
[serve.sandboxes]
warm_pool = $pool
TOML
  FARM_RUN_DIR="$work/run-$pool" start_serve "$FARM" "$work/serve-$pool.toml" "$work/serve-$pool.log"
  python3 bench/sandboxes.py "$url" latency "$N" "pool-$pool" >>"$work/latency.jsonl"
  if [ "$pool" = 2 ]; then
    python3 bench/sandboxes.py "$url" leak "$LEAK" "$work/run-$pool" "$serve_pid" >"$work/leak.json"
  fi
  kill "$serve_pid"; wait "$serve_pid" 2>/dev/null || true; serve_pid=""
done
python3 bench/sandboxes.py - report "$work/latency.jsonl" "$work/leak.json"
