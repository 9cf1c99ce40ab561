#!/usr/bin/env bash
# The serve and HumanEval benchmarks on an earlier revision and on this checkout, alternately,
# in one run, so the ratio holds on a shared, noisy machine.
#
#   bench/before-after.sh REV [ROUNDS]      (after scripts/setup.sh; default 2 serve rounds)
#
# Builds REV once (bench/build-rev.sh), then runs `bench/serve.sh 60 10` ROUNDS times on each
# (old, new, old, new...) and `bench/humaneval.sh` once on each, each revision with its own
# scripts and artifact cache. Prints each script's summary lines under a heading.
set -euo pipefail
cd "$(dirname "$0")/.."
REV="${1:?usage: bench/before-after.sh REV [ROUNDS]}"
ROUNDS="${2:-2}"
source bench/build-rev.sh "$REV"
on() { # on old|new SCRIPT ARGS...: runs a benchmark script of that revision
  local which="$1"; shift
  echo "=== $* ($which)"
  if [ "$which" = old ]; then
    (cd "$OLD_TREE" && FARM_CACHE_DIR="$OLD_CACHE" bash "$@" 2>&1 | grep -v '^[ {}]')
  else
    bash "$@" 2>&1 | grep -v '^[ {}]'
  fi
}
for round in $(seq "$ROUNDS"); do
  on old bench/serve.sh 60 10
  on new bench/serve.sh 60 10
done
on old bench/humaneval.sh
on new bench/humaneval.sh
