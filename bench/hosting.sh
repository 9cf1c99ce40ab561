#!/usr/bin/env bash
# What a sandbox hosts (issue 43): an open port's cost against an exec round trip on the same
# sandbox; proxied HTTP requests per second against the same server reached from inside the
# guest; and 100 sandboxes each with a background server behind an open port, all answering,
# with the service's memory and descriptors per sandbox.
#
#   bench/hosting.sh [N_LATENCY] [N_REQUESTS] [N_SANDBOXES]   (defaults 50, 300, 100; after scripts/setup.sh)
#
# Prints p50/p99 and the ratios measured in this run; the numbers go into bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
FARM="$PWD/target/release/farm"
[ -x "$FARM" ] || { echo "build farm first: cargo build --release -p farm" >&2; exit 1; }
source bench/serve-lib.sh
serve_workdir hosting-bench
cat >"$work/serve.toml" <<TOML
[serve]
suites = []
out = "$work/out"
max_sessions = 220
[serve.sandboxes]
TOML
FARM_RUN_DIR="$work/run" start_serve "$FARM" "$work/serve.toml" "$work/serve.log"
python3 bench/hosting.py "$url" "$serve_pid" "${1:-50}" "${2:-300}" "${3:-100}"
