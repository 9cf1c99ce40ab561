#!/usr/bin/env bash
# Several builds of farm on the same HumanEval-format suite at the same time, so the machine's
# drift and the other users' load hit them all alike: the ratios hold even when the absolute
# numbers move by a third from one hour to the next (bench/compare-rev.sh alternates builds
# instead, which a change of load between two runs can skew).
#
#   bench/side-by-side.sh [--rounds N] [--source samples|reference] [--isolation vm|sandbox] REV|. ...
#
# Each REV is built once in its own worktree and artifact cache (bench/build-rev.sh); `.` is
# this checkout's target/release/farm (scripts/setup.sh builds it). Every build runs the suite
# at concurrency 1, all of them at once, ROUNDS times (default 2), each with its own snapshot
# store (warmed by one rollout first). Suites: `samples` (default) replays
# bench/humaneval_gen.py's 200 samples (20 tasks, 10 each, a mix of passing and failing);
# `reference` the 164 canonical completions. Prints each round's rollouts/s, mean scoring
# time and counts per build, then each build's mean rollouts/s as a ratio of the first's.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=2 source=samples isolation=vm
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --source) source="$2"; shift 2 ;;
    --isolation) isolation="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "side-by-side.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { echo "usage: bench/side-by-side.sh [--rounds N] [--source samples|reference] [--isolation vm|sandbox] REV|. ..." >&2; exit 2; }
case "$source" in samples|reference) ;; *) echo "side-by-side.sh: --source is samples or reference, not $source" >&2; exit 2 ;; esac
case "$isolation" in vm|sandbox) ;; *) echo "side-by-side.sh: --isolation is vm or sandbox, not $isolation" >&2; exit 2 ;; esac
work=$(mktemp -d -t farm-side-by-side-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
python3 bench/humaneval_gen.py "$work/data" 2>/dev/null

names=() bins=() caches=()
for rev in "$@"; do
  if [ "$rev" = . ]; then
    [ -x target/release/farm ] || { echo "no target/release/farm: run scripts/setup.sh" >&2; exit 2; }
    names+=("this") bins+=("$PWD/target/release/farm") caches+=("${FARM_CACHE_DIR:-$HOME/.cache/farm}")
  else
    (source bench/build-rev.sh "$rev" >&2)
    names+=("$rev") bins+=("${TMPDIR:-/tmp}/farm-rev-$rev/target/release/farm") caches+=("${TMPDIR:-/tmp}/farm-rev-cache-$rev")
  fi
done

data="$work/data/tasks.jsonl" extra=""
if [ "$source" = samples ]; then
  data="$work/data/samples-tasks.jsonl" extra="samples_file = \"$work/data/samples-10.jsonl\""
fi
for i in "${!names[@]}"; do
  cat >"$work/suite-$i.toml" <<TOML
[suite]
name = "side-by-side"
[template]
image = "python"
[dataset]
path = "$data"
format = "humaneval"
[policy]
kind = "replay"
source = "$source"
$extra
[rollouts]
concurrency = 1
[scoring]
isolation = "$isolation"
[output]
dir = "$work/out-$i"
TOML
  # An older build may not know [scoring] isolation: it keeps its default (vm) only when asked for.
  [ "$isolation" = vm ] && sed -i '/^\[scoring\]/,/^isolation/d' "$work/suite-$i.toml"
  FARM_SNAPSHOT_DIR="$work/snap-$i" FARM_CACHE_DIR="${caches[$i]}" "${bins[$i]}" run "$work/suite-$i.toml" \
    --limit 1 --out "$work/warm-$i" >/dev/null 2>&1 || { echo "${names[$i]}: the warm-up run failed" >&2; exit 1; }
done

for round in $(seq "$rounds"); do
  pids=()
  for i in "${!names[@]}"; do
    rm -rf "$work/out-$i"
    (FARM_SNAPSHOT_DIR="$work/snap-$i" FARM_CACHE_DIR="${caches[$i]}" "${bins[$i]}" run "$work/suite-$i.toml" >"$work/log-$i" 2>&1) &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  for i in "${!names[@]}"; do
    python3 - "${names[$i]}" "$round" "$work/out-$i/summary.json" "$work/rates-$i" <<'PY'
import json, sys
name, round_, path, rates = sys.argv[1:]
s = json.load(open(path)); p = s["performance"]
open(rates, "a").write(f"{p['rollouts_per_sec']}\n")
print(f"round {round_}  {name:10} {p['rollouts_per_sec']:.3f} rollouts/s  score mean {p['score']['mean_ms']:.0f} ms  {s['counts']}")
PY
  done
done
python3 - "$work" "${names[@]}" <<'PY'
import statistics, sys
work, names = sys.argv[1], sys.argv[2:]
means = [statistics.mean(float(x) for x in open(f"{work}/rates-{i}")) for i in range(len(names))]
for name, mean in zip(names, means):
    print(f"{name:10} mean {mean:.3f} rollouts/s  = {mean / means[0]:.3f}x {names[0]}")
PY
