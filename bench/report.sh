#!/usr/bin/env bash
# `farm report` on large runs: synthetic runs of 1,000, 10,000 and 100,000 rows (1,000 tasks,
# three steps of output each, written by `farm bench synthetic-run` through the run writer),
# each reported alone; then the 100,000-row run side by side with the 10,000-row one.
#
#   bench/report.sh            (after scripts/setup.sh)
#
# Prints wall time, microseconds per row (flat when the cost is linear) and the report's size.
set -euo pipefail
cd "$(dirname "$0")/.."
FARM="$PWD/target/release/farm"
work=$(mktemp -d -t farm-report-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
now() { python3 -c 'import time; print(time.monotonic())'; }
printf '%-28s %10s %12s %12s %10s\n' "report of" "seconds" "us per row" "report MiB" "pages"
for n in 1000 10000 100000; do
  "$FARM" bench synthetic-run --out "$work/run-$n" --rows "$n" --tasks 1000 2>/dev/null
done
report() { # report LABEL ROWS RUN...
  local label="$1" rows="$2"; shift 2
  local t0 t1
  t0=$(now)
  "$FARM" report "$@" --out "$work/report" >/dev/null 2>&1
  t1=$(now)
  python3 - "$label" "$rows" "$t0" "$t1" "$work/report" <<'PY'
import os, sys
label, rows, t0, t1, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
pages = len(os.listdir(os.path.join(out, "tasks")))
print(f"{label:28} {t1 - t0:10.2f} {(t1 - t0) / rows * 1e6:12.1f} {size / 2**20:12.1f} {pages:10}")
PY
}
report "1,000 rows" 1000 "$work/run-1000"
report "10,000 rows" 10000 "$work/run-10000"
report "100,000 rows" 100000 "$work/run-100000"
report "100,000 + 10,000 rows" 110000 "$work/run-100000" "$work/run-10000"
