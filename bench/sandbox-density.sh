#!/usr/bin/env bash
# `farm serve` holding many idle sandboxes, each with a background process and an open port:
# sandboxes created one after another (a 503 retried after its Retry-After, for a minute)
# until N are live or the service keeps refusing; in each, busybox httpd started in the
# background on 127.0.0.1:8000 serving the sandbox's id, the port opened and fetched through
# the port listener; then an idle minute; then every sandbox fetched again through its port
# and asked for one command; then every sandbox deleted.
#
#   bench/sandbox-density.sh [N] [KSM]      (defaults 1000 and on-no-aslr; after scripts/setup.sh)
#
# KSM is the service's `ksm` setting (off, on, on-no-aslr); with it on, ksmd must run
# (docs/commands.md, "Density"). Prints one JSON object (bench/sandbox_density.py); the
# numbers go into bench/RESULTS.md. About 20 minutes for 1,000 on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
FARM="$PWD/target/release/farm"
N="${1:-1000}"
KSM="${2:-on-no-aslr}"
source bench/serve-lib.sh
serve_workdir sandbox-density
cat >"$work/serve.toml" <<TOML
[serve]
suites = []
out = "$work/serve-out"
max_sessions = "auto"
ksm = "$KSM"
[serve.sandboxes]
warm_pool = 2
idle_timeout_secs = 7200
max_lifetime_secs = 7200
TOML
FARM_RUN_DIR="$work/run" start_serve "$FARM" "$work/serve.toml" "$work/serve.log"
python3 bench/sandbox_density.py "$url" "$N" "$serve_pid" "$KSM" "$work/run"
