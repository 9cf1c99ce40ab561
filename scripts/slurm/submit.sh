#!/usr/bin/env bash
# Runs a farm suite on a Slurm cluster: an array of N shards (one node each, requeued if a
# node fails), then a merge job that starts when every shard succeeded.
#
#   scripts/slurm/submit.sh SUITE.toml OUT N [--only I,J,...] [SBATCH ARGS...]
#
# Prints the two job ids (`shards=J merge=M`). The merged run is OUT/merged; the shards'
# folders stay in OUT/shards/I, and the jobs' logs in OUT/logs. SBATCH ARGS go to both jobs
# (--partition, --account, --time, ...). FARM_BIN, FARM_RUN_ARGS and FARM_CACHE_DIR pass
# through to the jobs (see farm-shards.sbatch).
#
# If a shard fails, the merge job is cancelled (its dependency can no longer be met). Rerun
# the failed shards alone with --only: they resume from their folders (nothing is recorded
# twice), and a new merge job waits for them:
#   scripts/slurm/submit.sh SUITE.toml OUT N --only 1,4
set -euo pipefail
die() { echo "submit: $*" >&2; exit 2; }
[ $# -ge 3 ] || die "usage: $0 SUITE.toml OUT N [SBATCH ARGS...]"
suite=$1 out=$2 n=$3
shift 3
indices="0-$((n - 1))"
if [ "${1:-}" = --only ]; then
  [[ "${2:-}" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--only takes shard indices such as 1,4"
  for i in ${2//,/ }; do [ "$i" -lt "$n" ] || die "--only: shard $i is not below N = $n"; done
  indices=$2
  shift 2
fi
[ -f "$suite" ] || die "$suite: no such suite file"
[[ "$n" =~ ^[1-9][0-9]*$ ]] || die "N must be a positive number of shards, not $n"
here=$(cd "$(dirname "$0")" && pwd)
suite=$(cd "$(dirname "$suite")" && pwd)/$(basename "$suite")
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
[ ! -e "$out/merged" ] || die "$out/merged exists: the run is merged already"
export FARM_SUITE=$suite FARM_OUT=$out FARM_SHARDS=$n
shards=$(sbatch --parsable --array="$indices" --export=ALL --output="$out/logs/shard-%A_%a.log" "$@" "$here/farm-shards.sbatch")
shards=${shards%%;*}
merge=$(sbatch --parsable --dependency="afterok:$shards" --kill-on-invalid-dep=yes --export=ALL --output="$out/logs/merge-%j.log" "$@" "$here/farm-merge.sbatch")
merge=${merge%%;*}
echo "shards=$shards merge=$merge"
