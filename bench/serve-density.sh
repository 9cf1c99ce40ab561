#!/usr/bin/env bash
# `farm serve` holding many live sessions: opened one after another until N are live or the
# service refuses one (503 with its memory figures), one step answered in each, then the
# idle cost, then every session deleted.
#
#   bench/serve-density.sh [N_SESSIONS] [KSM]     (defaults 1000 and off; after scripts/setup.sh)
#
# KSM is the service's `ksm` setting (off, on, on-no-aslr); with it on, start ksmd first
# (README, "Density"). Prints one JSON object (bench/serve_density.py); the numbers go into
# bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
FARM="$PWD/target/release/farm"
N="${1:-1000}"
KSM="${2:-off}"
work=$(mktemp -d -t farm-serve-density-XXXXXX)
serve_pid=""
cleanup() { [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
cat >"$work/serve.toml" <<TOML
[serve]
suites = ["$PWD/configs/serve.toml"]
out = "$work/serve-out"
concurrency = 1
warm_pool = 2
max_sessions = "auto"
session_lease_secs = 7200
ksm = "$KSM"
TOML
"$FARM" serve "$work/serve.toml" --listen 127.0.0.1:0 >"$work/serve.log" 2>&1 &
serve_pid=$!
url=""
for _ in $(seq 1 600); do
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$work/serve.log" | head -1 || true)
    [ -n "$url" ] && break
    kill -0 "$serve_pid" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
    sleep 0.5
done
[ -n "$url" ] || { echo "farm serve did not start" >&2; exit 1; }
python3 bench/serve_density.py "$url" "$N" "$serve_pid" "$KSM"
