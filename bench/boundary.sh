#!/usr/bin/env bash
# The cost of one check through farm's boundary: unit tests (pytest in the checker, the
# candidate's module a proxy) against the function-call harness (HumanEval's check()), in one
# run on this machine.
#
#   bench/boundary.sh [ROUNDS]      (after scripts/setup.sh; default 2 rounds)
#
# Each round runs configs/humaneval-proxy.toml (72 function-call checks) and
# configs/unittest-proxy.toml (48 unit-test checks: 12 tasks, each a test file of 4 to 8
# tests), alternately, at concurrency 1 with the snapshot store warm. Both replay files only,
# so no rollout VM runs: a row's score_ms is the whole check (a fresh fork of the template,
# the artifacts placed, the harness's check through its zygote, the verdict read). Prints
# p50/p99 of score_ms per harness over all rounds, and their ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
FARM="$PWD/target/release/farm"
ROUNDS="${1:-2}"
work=$(mktemp -d -t farm-boundary-XXXXXX)
trap 'rm -rf "$work"' EXIT
# Templates first (not timed): both suites use the python template.
"$FARM" run configs/unittest-proxy.toml --out "$work/warm" --limit 1 --concurrency 1 >/dev/null 2>&1
for round in $(seq "$ROUNDS"); do
  "$FARM" run configs/humaneval-proxy.toml --out "$work/call-$round" --concurrency 1 >/dev/null 2>&1
  "$FARM" run configs/unittest-proxy.toml --out "$work/unit-$round" --concurrency 1 >/dev/null 2>&1
done
python3 - "$work" "$ROUNDS" <<'PY'
import glob, json, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def times(prefix):
    out = []
    for path in glob.glob(f"{work}/{prefix}-*/journal.jsonl"):
        out += [json.loads(l)["timings"]["score_ms"] for l in open(path)]
    return sorted(out)
def pct(v, q):
    return v[min(len(v) - 1, max(0, int(round(q * len(v) + 0.5)) - 1))]
call, unit = times("call"), times("unit")
for name, v in (("function-call harness", call), ("unit tests through the boundary", unit)):
    print(f"{name}: {len(v)} checks, score_ms p50 {pct(v, 0.5):.0f}, p99 {pct(v, 0.99):.0f}, mean {sum(v) / len(v):.0f}")
print(f"ratio unit/function-call: p50 {pct(unit, 0.5) / pct(call, 0.5):.2f}, p99 {pct(unit, 0.99) / pct(call, 0.99):.2f} ({rounds} rounds, concurrency 1)")
PY
