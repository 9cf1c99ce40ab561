#!/usr/bin/env bash
# Sandbox creates at the rates RL loops ask for, through farm's Python SDK, this checkout
# against an earlier revision (default: the one before environments' pools reset VMs given
# back) in the same run, on the minimal image:
#   - sequential: 50 creates one after another (create, exec `true`, kill), warm_pool = 2;
#   - a fixed rate: 10 creates a second for 20 s, warm_pool = 2;
#   - a burst of 100 at once from a pool filled first, three times (an RL loop's steps:
#     warm_pool = 100 here; the earlier revision takes at most 64);
#   - a burst of 20 from a cold pool (warm_pool = 0; here with warm_pool_max = 0 too, so
#     that every create is a new QEMU process): creates/s per core.
#
#   bench/creates.sh [REV]      (after scripts/setup.sh; about 15 minutes on 2 cores)
#
# Prints one table per build; the numbers go into bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
REV="${1:-fadb538}"
source bench/build-rev.sh "$REV"
source bench/serve-lib.sh
serve_workdir creates-bench
export PYTHONPATH="$PWD/clients/python${PYTHONPATH:+:$PYTHONPATH}"

run_build() { # run_build NAME TREE CACHE NEW(0|1)
  local name="$1" tree="$2" cache="$3" new="$4" results="$work/$1.jsonl"
  : >"$results"
  serve_with() { # serve_with TAG BODY: starts farm serve of this build with [serve.sandboxes] BODY
    printf '[serve]\nsuites = []\nout = "%s"\nmax_sessions = 250\n[serve.sandboxes]\n%s\n' "$work/out-$name-$1" "$2" >"$work/$name-$1.toml"
    FARM_CACHE_DIR="$cache" FARM_RUN_DIR="$work/run-$name-$1" start_serve "$tree/target/release/farm" "$work/$name-$1.toml" "$work/$name-$1.log"
  }
  stop_serve() { kill "$serve_pid"; wait "$serve_pid" 2>/dev/null || true; serve_pid=""; }

  serve_with pool2 "warm_pool = 2"
  python3 bench/creates.py "$url" sequential 50 "$name warm_pool=2" >>"$results"
  python3 bench/creates.py "$url" rate 10 20 "$name warm_pool=2" >>"$results"
  stop_serve
  if [ "$new" = 1 ]; then
    serve_with pool100 "warm_pool = 100"
    python3 bench/creates.py "$url" burst 100 "$name warm_pool=100" 100 3 >>"$results"
  else
    serve_with pool64 "warm_pool = 64"
    python3 bench/creates.py "$url" burst 100 "$name warm_pool=64" 63 3 >>"$results"
  fi
  stop_serve
  if [ "$new" = 1 ]; then serve_with cold "warm_pool = 0
warm_pool_max = 0"; else serve_with cold "warm_pool = 0"; fi
  python3 bench/creates.py "$url" burst 20 "$name cold" >>"$results"
  stop_serve
  echo "== $name ($tree)"
  python3 bench/creates.py - report "$results"
}

# An earlier revision that has environments' pools (warm_pool_max) runs the same settings.
old_has_pools=0
if grep -q warm_pool_max "$OLD_TREE/service/src/sandbox/mod.rs" 2>/dev/null; then old_has_pools=1; fi
run_build old "$OLD_TREE" "$OLD_CACHE" "$old_has_pools"
run_build new "$PWD" "${FARM_CACHE_DIR:-$HOME/.cache/farm}" 1
echo "cores: $(nproc); creates/s per core = creates/s / $(nproc)"
