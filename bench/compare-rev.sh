#!/usr/bin/env bash
# Measures this checkout against an earlier revision in the same run, so the ratio holds on a
# shared, noisy machine: builds REV in its own worktree and artifact cache (reusing this
# cache's guest kernel and debootstrap tree), then alternates the two on the same suites.
#
#   bench/compare-rev.sh REV [ROUNDS]
#
# Prints, per round and per build, rollouts/s and the mean fork / score / total times of
# `configs/humaneval-samples.toml` (10 rollouts) at concurrency 1 and 2, and fork latency
# from `farm bench fork --image minimal`; then the mean ratio new/old of rollouts/s.
# Needs scripts/setup.sh first. Takes about 10 minutes for 3 rounds on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
REV="${1:?usage: bench/compare-rev.sh REV [ROUNDS]}"
ROUNDS="${2:-3}"
CACHE="${FARM_CACHE_DIR:-$HOME/.cache/farm}"
source bench/build-rev.sh "$REV"

suite() { # suite NAME TREE CACHE CONCURRENCY
  local out; out=$(mktemp -d)
  (cd "$2" && FARM_CACHE_DIR="$3" ./target/release/farm run configs/humaneval-samples.toml --out "$out" --concurrency "$4" >/dev/null 2>&1)
  python3 - "$1" "$4" "$out/summary.json" <<'PY'
import json, sys
name, c, path = sys.argv[1], sys.argv[2], sys.argv[3]
s = json.load(open(path)); p = s["performance"]
print(f"{name:4} c={c} rollouts/s {p['rollouts_per_sec']:.2f}  fork {p['fork']['mean_ms']:.0f}  score {p['score']['mean_ms']:.0f}  total {p['total']['mean_ms']:.0f} ms  counts {s['counts']}")
PY
  rm -rf "$out"
}

forkbench() { # forkbench NAME TREE CACHE
  (cd "$2" && FARM_CACHE_DIR="$3" ./target/release/farm bench fork --image minimal -n 10 --cold 1 --alive 5 --json 2>/dev/null) \
    | python3 -c "
import json, sys
d = json.load(sys.stdin)
f = lambda k: '%s/%s' % (d[k]['p50'], d[k]['p99'])
print('$1  fork->first exec p50/p99 ms: no pool', f('fork_to_first_exec_no_pool_ms'), ' warm pool', f('fork_to_first_exec_warm_pool_ms'), ' resumed pool', f('fork_to_first_exec_resumed_pool_ms'), ' private dirty MiB', d['private_dirty_per_idle_fork_mib']['p50'])
"
}

log=$(mktemp)
for round in $(seq "$ROUNDS"); do
  echo "== round $round"
  forkbench old "$OLD_TREE" "$OLD_CACHE"
  forkbench new . "$CACHE"
  for c in 1 2; do
    suite old "$OLD_TREE" "$OLD_CACHE" "$c" | tee -a "$log"
    suite new . "$CACHE" "$c" | tee -a "$log"
  done
done
python3 - "$log" <<'PY'
import re, sys, collections
rates = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"(\w+)\s+c=(\d) rollouts/s ([\d.]+)", line)
    if m:
        rates[(m.group(1), m.group(2))].append(float(m.group(3)))
for c in ("1", "2"):
    old, new = rates[("old", c)], rates[("new", c)]
    if old and new:
        o, n = sum(old) / len(old), sum(new) / len(new)
        print(f"concurrency {c}: old {o:.2f}/s, new {n:.2f}/s, new/old {n / o:.2f}")
PY
rm -f "$log"
