#!/usr/bin/env bash
# The whole test suite: sets up whatever is missing (scripts/setup.sh; seconds when
# everything is in place), then `cargo test --workspace`, which boots real guests. CI runs
# exactly this (.ci/run).
#
#   scripts/test.sh [CARGO TEST ARGS...]        (on Debian 12, as root)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec cargo test --workspace "$@"
