#!/usr/bin/env bash
# Pause and resume of `farm serve` sessions against branch, in one run (bench/pause.py).
#
#   bench/pause.sh [N]      (N sessions per image, default 8; after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
work=$(mktemp -d -t farm-pause-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
python3 bench/pause.py "$PWD/target/release/farm" "$work" "${1:-8}"
