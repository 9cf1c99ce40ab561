#!/usr/bin/env bash
# An inspect_ai eval of N samples on farm's sandbox type against the same eval on inspect's
# `local` sandbox (the host itself, no isolation), alternating in one run
# (bench/inspect_eval.py): the cost of an isolated, forked sandbox per sample is the ratio.
#
#   bench/inspect.sh [N] [ROUNDS]   (default 20 samples, 3 rounds; after scripts/setup.sh,
#                                    which makes the inspect venv)
#
# Prints one JSON object; the numbers go into bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
FARM="$PWD/target/release/farm"
[ -x "$FARM" ] || { echo "build farm first: cargo build --release -p farm" >&2; exit 1; }
CACHE="${FARM_CACHE_DIR:-$HOME/.cache/farm}"
PYTHON="$CACHE/inspect-venv/bin/python"
[ -x "$PYTHON" ] || { echo "no $PYTHON: run scripts/setup.sh" >&2; exit 1; }
source bench/serve-lib.sh
serve_workdir inspect-bench
mkdir -p "$work/out"
# The SDK as pip installs it (its entry point names farm's sandbox type), from a copy.
cp -r clients/python "$work/sdk"
python3 -m pip install --quiet --no-deps --no-index --no-build-isolation --target "$work/site" "$work/sdk" 2>/dev/null
cat >"$work/serve.toml" <<TOML
[serve]
suites = []
out = "$work/out"
[serve.sandboxes]
TOML
export FARM_SERVE_TOKEN=inspect-bench
FARM_RUN_DIR="$work/run" start_serve "$FARM" "$work/serve.toml" "$work/serve.log"
FARM_URL="$url" PYTHONPATH="$work/site" "$PYTHON" bench/inspect_eval.py "$work/evals" "${1:-20}" "${2:-3}"
