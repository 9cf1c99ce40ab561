#!/usr/bin/env bash
# `farm serve` holding many live sessions: opened one after another until N are live or the
# service refuses one (503 with its memory figures), one step answered in each, then the
# idle cost, then every session deleted.
#
#   bench/serve-density.sh [N_SESSIONS] [KSM]     (defaults 1000 and off; after scripts/setup.sh)
#
# KSM is the service's `ksm` setting (off, on, on-no-aslr); with it on, start ksmd first
# (docs/commands.md, "Density"). Prints one JSON object (bench/serve_density.py); the numbers go into
# bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
FARM="$PWD/target/release/farm"
N="${1:-1000}"
KSM="${2:-off}"
source bench/serve-lib.sh
serve_workdir serve-density
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
start_serve "$FARM" "$work/serve.toml" "$work/serve.log"
python3 bench/serve_density.py "$url" "$N" "$serve_pid" "$KSM"
