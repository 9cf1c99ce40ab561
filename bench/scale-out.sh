#!/usr/bin/env bash
# Scale-out figures (bench/RESULTS.md): shard overhead against one process, rollouts/s per
# core, and a merge of 100 shards holding 1,000,000 rows. Needs scripts/setup.sh first.
#
#   bench/scale-out.sh [ARGS for bench/scale_out.py: --tasks 40 --shards 3 --repeats 3
#                       --merge-shards 100 --merge-rows 1000000]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 bench/scale_out.py "$PWD/target/release/farm" "$work" "$@"
