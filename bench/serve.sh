#!/usr/bin/env bash
# `farm serve` against `farm run` on the same rollouts, and session latencies, in one run.
#
#   bench/serve.sh [N_ROLLOUTS] [N_SESSIONS]     (defaults 40 and 10; after scripts/setup.sh)
#
# 1. `farm run`: N rollouts of configs/serve.toml's `double` task, each replaying the same
#    command (concurrency 2, no warm pool), rollouts/s from its summary (template prepared);
# 2. `farm serve` on the same suite and settings: the same N rollouts submitted as one group
#    and pulled from /v1/results, rollouts/s from submit to the last row;
# 3. sessions on that service: create, exec (3 per session), branch and submit latencies,
#    p50 and p99 (cold forks: no warm pool).
# Prints a JSON summary and the ratio; the numbers go into bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
FARM="$PWD/target/release/farm"
N="${1:-40}"
OPS="${2:-10}"
source bench/serve-lib.sh
serve_workdir serve-bench

ACTIONS='[{"kind": "exec", "command": "echo $(( $(cat n.txt) * 2 )) > out.txt"}]'
python3 - "$work/trajectories.jsonl" "$N" "$ACTIONS" <<'PY'
import json, sys
path, n, actions = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
with open(path, "w") as f:
    for i in range(n):
        f.write(json.dumps({"task_id": "double", "sample_index": i, "actions": actions}) + "\n")
PY
cat >"$work/run.toml" <<TOML
[suite]
name = "serve-sample"
[template]
image = "minimal"
[dataset]
path = "$PWD/configs/data/serve-tasks"
format = "task_dirs"
tasks = ["double"]
[policy]
kind = "replay"
source = "trajectories"
trajectories_file = "$work/trajectories.jsonl"
[rollouts]
concurrency = 2
warm_pool = 0
timeout_secs = 120
[scoring]
timeout_secs = 30
[output]
dir = "$work/run-out"
TOML
cat >"$work/serve.toml" <<TOML
[serve]
suites = ["$PWD/configs/serve.toml"]
out = "$work/serve-out"
concurrency = 2
warm_pool = 0
max_sessions = 4
max_samples_per_item = 10000
queue_limit = 10000
TOML

echo "1. farm run: $N rollouts" >&2
"$FARM" run "$work/run.toml" >/dev/null 2>"$work/run.log" || { cat "$work/run.log" >&2; exit 1; }
run_rate=$(python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["performance"]; print(round(p["rollouts_per_sec"], 2))' "$work/run-out/summary.json")
run_counts=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["counts"])' "$work/run-out/summary.json")

echo "2. farm serve: $N rollouts, then $OPS sessions" >&2
start_serve "$FARM" "$work/serve.toml" "$work/serve.log"
result=$(python3 bench/serve_client.py "$url" "$N" "$OPS" "$ACTIONS")
kill -TERM "$serve_pid"; wait "$serve_pid" 2>/dev/null || true; serve_pid=""

python3 - "$result" "$run_rate" "$run_counts" <<'PY'
import json, sys
r, run_rate, run_counts = json.loads(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
print(json.dumps(r, indent=1))
print(f"farm run:   {run_rate:.2f} rollouts/s ({run_counts})")
print(f"farm serve: {r['served']['per_sec']:.2f} rollouts/s ({r['served']['statuses']}) = {r['served']['per_sec'] / run_rate:.2f}x farm run")
for k in ("session_create", "exec", "branch", "submit"):
    print(f"{k:15} p50 {r[k]['p50_ms']:8.1f} ms   p99 {r[k]['p99_ms']:8.1f} ms   (n={r[k]['n']})")
PY
