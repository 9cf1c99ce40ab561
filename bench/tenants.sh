#!/usr/bin/env bash
# Fair admission between tenants of one `farm serve`, in one run: tenant A submits one rollout
# every half second while tenant B floods the queue, and A's admission wait (from its submit to
# its rollout's start, `started_at_ms` of the row) is measured three ways:
#
#   bench/tenants.sh [FLOOD] [A_ROLLOUTS]     (defaults 200 and 20; after scripts/setup.sh)
#
# 1. quiet:        A alone (the floor: a slot's turnover);
# 2. flood, fair:  B submits FLOOD rollouts at once, then A submits (two tenants, weight 1 each);
# 3. flood, FIFO:  the same flood submitted with A's own key (one tenant, as before tenants:
#                  the flood and A's work share one lane, first come first served).
# Prints p50/p99 of A's waits for each and the ratios; the numbers go into bench/RESULTS.md.
# FARM picks the binary (default target/release/farm).
set -euo pipefail
cd "$(dirname "$0")/.."
FARM="${FARM:-$PWD/target/release/farm}"
FLOOD="${1:-200}"
A_N="${2:-20}"
source bench/serve-lib.sh
serve_workdir tenants-bench

cat >"$work/serve.toml" <<TOML
[serve]
suites = ["$PWD/configs/serve.toml"]
out = "$work/serve-out"
concurrency = 2
max_samples_per_item = 10000
queue_limit = 10000
TOML
db="$work/serve-out/tenants.db"
"$FARM" tenant --db "$db" add a >/dev/null
"$FARM" tenant --db "$db" add b >/dev/null
key_a=$("$FARM" tenant --db "$db" key add a 2>/dev/null)
key_b=$("$FARM" tenant --db "$db" key add b 2>/dev/null)

start_serve "$FARM" "$work/serve.toml" "$work/serve.log"
python3 bench/tenants.py "$url" "$key_a" "$key_b" "$FLOOD" "$A_N"
kill -TERM "$serve_pid"; wait "$serve_pid" 2>/dev/null || true; serve_pid=""
