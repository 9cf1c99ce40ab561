#!/usr/bin/env bash
# Runs the benchmarks recorded in bench/RESULTS.md. Needs scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
FARM=target/release/farm
for image in minimal python; do
  echo "== farm bench boot --image $image -n 5 --execs 50 --json"
  "$FARM" bench boot --image "$image" -n 5 --execs 50 --json
done
echo "== farm bench fork --image minimal -n 30 --cold 5 --alive 200 --json"
"$FARM" bench fork --image minimal -n 30 --cold 5 --alive 200 --json
echo "== farm bench fork --image python -n 20 --cold 3 --alive 20 --json"
"$FARM" bench fork --image python -n 20 --cold 3 --alive 20 --json
echo "== farm run configs/quickstart.toml (5 rollouts, concurrency 2): summary.json performance"
out=$(mktemp -d)
"$FARM" run configs/quickstart.toml --out "$out" >/dev/null 2>&1
python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['performance']))" "$out/summary.json"
echo "== farm run configs/humaneval-samples.toml (10 rollouts, concurrency 2)"
out2=$(mktemp -d)
"$FARM" run configs/humaneval-samples.toml --out "$out2" >/dev/null 2>&1
python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['performance']))" "$out2/summary.json"
rm -rf "$out" "$out2"
