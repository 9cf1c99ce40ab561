#!/usr/bin/env bash
# E2B's SDKs (PyPI, unmodified) against farm's own SDK on one `farm serve`: create-to-first-
# command, create-to-first-run_code and a run_code round trip, the clients alternating in one
# run (bench/e2b_sdks.py). The cost of E2B's protocol as a front door is the ratio.
#
#   bench/e2b.sh [N]        (default 20 rounds; after scripts/setup.sh, which makes the venv)
#
# Prints one JSON object; the numbers go into bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
FARM="$PWD/target/release/farm"
[ -x "$FARM" ] || { echo "build farm first: cargo build --release -p farm" >&2; exit 1; }
CACHE="${FARM_CACHE_DIR:-$HOME/.cache/farm}"
PYTHON="$CACHE/e2b-venv/bin/python"
[ -x "$PYTHON" ] || { echo "no $PYTHON: run scripts/setup.sh" >&2; exit 1; }
source bench/serve-lib.sh
serve_workdir e2b-bench
mkdir -p "$work/out"
"$FARM" tenant --db "$work/out/tenants.db" add bench >/dev/null
key=$("$FARM" tenant --db "$work/out/tenants.db" key add bench 2>/dev/null | grep -o 'farm_[0-9a-f]*' | head -1)
cat >"$work/serve.toml" <<TOML
[serve]
suites = []
out = "$work/out"
[serve.sandboxes]
TOML
FARM_RUN_DIR="$work/run" start_serve "$FARM" "$work/serve.toml" "$work/serve.log"
PYTHONPATH="$PWD/clients/python" "$PYTHON" bench/e2b_sdks.py "$url" "$key" "${1:-20}"
