#!/usr/bin/env bash
# Converted images against the built-in `python` image, in one run.
#
#   bench/images.sh            (after scripts/setup.sh, which installs umoci and skopeo)
#
# 1. Makes a typical OCI archive: the Debian bookworm + python3 + git tree that the set-up
#    script debootstraps (~200 MB), as one gzip layer (umoci), copied by skopeo into an
#    oci-archive.
# 2. Times its conversion into a farm image (cold: a fresh artifact cache folder for
#    images), and a second use of it (cached: the archive is checked, nothing converted).
# 3. `farm bench fork` on the converted image and on the built-in `python` image:
#    fork-to-first-exec p50/p99 and cold boot, the same settings in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
FARM="$PWD/target/release/farm"
CACHE="${FARM_CACHE_DIR:-$HOME/.cache/farm}"
N="${1:-20}"
work=$(mktemp -d -t farm-images-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
rootfs=$(ls -d "$CACHE"/rootfs/python-* | grep -v '\.done$' | head -1)
[ -d "$rootfs" ] || { echo "no debootstrap tree in $CACHE/rootfs (run scripts/setup.sh)" >&2; exit 2; }
now() { python3 -c 'import time; print(time.monotonic())'; }

echo "1. building an OCI archive of $rootfs" >&2
(cd "$work" && umoci init --layout L && umoci new --image L:py && umoci unpack --image L:py B >/dev/null \
  && cp -a "$rootfs/." B/rootfs/ && umoci repack --image L:py B >/dev/null && rm -rf B \
  && skopeo copy -q oci:L:py oci-archive:py.tar && rm -rf L)
archive_mib=$(( $(stat -c %s "$work/py.tar") / 1048576 ))

echo "2. converting it" >&2
# A cache of its own for the cold conversion; kernel and agent linked from the real one.
mkdir -p "$work/cache/current" && for a in kernel agent shim; do ln -s "$(readlink -f "$CACHE/current/$a")" "$work/cache/current/$a"; done
t0=$(now); FARM_CACHE_DIR="$work/cache" "$FARM" vm run --image "oci-archive:$work/py.tar" -- python3 -c 'print(6*7)' >/dev/null; t1=$(now)
FARM_CACHE_DIR="$work/cache" "$FARM" vm run --image "oci-archive:$work/py.tar" -- true >/dev/null; t2=$(now)

echo "3. fork-to-first-exec, converted vs built-in python ($N forks each)" >&2
conv=$(FARM_CACHE_DIR="$work/cache" "$FARM" bench fork --image "oci-archive:$work/py.tar" -n "$N" --cold 2 --alive 2 --json)
builtin=$("$FARM" bench fork --image python -n "$N" --cold 2 --alive 2 --json)
python3 - "$archive_mib" "$t0" "$t1" "$t2" "$conv" "$builtin" <<'PY'
import json, sys
mib, t0, t1, t2 = int(sys.argv[1]), *map(float, sys.argv[2:5])
conv, builtin = json.loads(sys.argv[5]), json.loads(sys.argv[6])
print(f"archive: {mib} MiB (one gzip layer)")
print(f"first use (convert + boot + exec): {t1 - t0:.1f} s; second use (cached; boot + exec): {t2 - t1:.1f} s; conversion ~ {(t1 - t0) - (t2 - t1):.1f} s")
print(f"{'ms, p50 / p99':38} {'converted':>18} {'built-in python':>18} {'ratio p50':>10}")
for k in ("cold_boot_to_first_exec_ms", "fork_to_first_exec_no_pool_ms", "fork_to_first_exec_warm_pool_ms", "fork_to_first_exec_resumed_pool_ms", "second_exec_same_fork_ms", "private_dirty_per_idle_fork_mib"):
    c, b = conv[k], builtin[k]
    print(f"{k:38} {c['p50']:8.1f} / {c['p99']:7.1f} {b['p50']:8.1f} / {b['p99']:7.1f} {c['p50'] / b['p50']:10.2f}")
PY
