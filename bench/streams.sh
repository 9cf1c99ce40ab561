#!/usr/bin/env bash
# What unread output streams hold of `farm serve`: N output streams of a chatty process and N
# streamed execs, opened and never read, against the service's RSS before them; this build
# and an earlier revision (the baseline, default 19ac392, before streams read nothing ahead
# of their client), in the same run.
#
#   bench/streams.sh [N] [BASELINE_REV]     (defaults 20 and 19ac392; after scripts/setup.sh)
#
# Prints one JSON line per build; the numbers go into bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-20}"
REV="${2:-19ac392}"
source bench/build-rev.sh "$REV"
source bench/serve-lib.sh
serve_workdir streams-bench
for build in "$REV" HEAD; do
  if [ "$build" = HEAD ]; then farm="$PWD/target/release/farm"; cache="${FARM_CACHE_DIR:-$HOME/.cache/farm}";
  else farm="$OLD_TREE/target/release/farm"; cache="$OLD_CACHE"; fi
  cat >"$work/serve-$build.toml" <<TOML
[serve]
suites = []
out = "$work/out-$build"
max_sessions = 8
TOML
  FARM_CACHE_DIR="$cache" FARM_RUN_DIR="$work/run-$build" start_serve "$farm" "$work/serve-$build.toml" "$work/serve-$build.log"
  python3 bench/streams.py "$url" "$serve_pid" "$N" "$build"
  kill "$serve_pid"; wait "$serve_pid" 2>/dev/null || true; serve_pid=""
done
