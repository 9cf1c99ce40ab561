#!/usr/bin/env bash
# The Dockerfile step cache: a cold build, an unchanged rebuild and a rebuild after changing
# the 5th of 9 filesystem steps, in one run, on the minimal image (TCG, 2 cores).
#
#   bench/dockerfile.sh [ROUNDS]      (after scripts/setup.sh; default 3 rounds)
#
# Each round uses a fresh snapshot store (FARM_SNAPSHOT_DIR), so the cold build includes
# booting the base image into its template snapshot. Prints per-round seconds, p50 over the
# rounds, how many steps ran and came from the store, and the ratios against the cold build.
set -euo pipefail
cd "$(dirname "$0")/.."
FARM="$PWD/target/release/farm"
ROUNDS="${1:-3}"
work=$(mktemp -d -t farm-dockerfile-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT

dockerfile() { # dockerfile MARK: nine filesystem steps, the 5th carries MARK
  cat <<DOCKERFILE
FROM farm:minimal
WORKDIR /srv/app
RUN mkdir -p /srv/app/data && echo one > data/1
COPY app/ ./
RUN echo three > data/3 && ls -l /srv/app > /dev/null
COPY run.sh /usr/local/bin/run-app
RUN echo "$1" > data/5
RUN seq 1 1000 > data/6
COPY <<MOTD /etc/motd
hello
MOTD
RUN cat data/* > all.txt
RUN wc -l all.txt > count.txt
DOCKERFILE
}
mkdir -p "$work/ctx/app"
echo 'print("app")' > "$work/ctx/app/main.py"
printf '#!/bin/sh\necho run\n' > "$work/ctx/run.sh"
printf '[template]\ndockerfile = "ctx/Dockerfile"\n' > "$work/template.toml"

build() { # build LOG: seconds of one `farm template build`
  local start end
  start=$(date +%s.%N)
  "$FARM" template build "$work/template.toml" >"$1" 2>&1
  end=$(date +%s.%N)
  python3 -c "print(round($end - $start, 2))"
}
steps() { echo "ran $(grep -c '  done in' "$1" || true), cached $(grep -c '  cached' "$1" || true)"; }

: > "$work/times"
for round in $(seq "$ROUNDS"); do
  export FARM_SNAPSHOT_DIR="$work/store-$round"
  dockerfile five > "$work/ctx/Dockerfile"
  cold=$(build "$work/cold.log")
  warm=$(build "$work/warm.log")
  dockerfile "five, changed in round $round" > "$work/ctx/Dockerfile"
  changed=$(build "$work/changed.log")
  echo "round $round: cold ${cold} s ($(steps "$work/cold.log")), unchanged ${warm} s ($(steps "$work/warm.log")), step 5 changed ${changed} s ($(steps "$work/changed.log"))"
  echo "$cold $warm $changed" >> "$work/times"
done
python3 - "$work/times" <<'PY'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
cold, warm, changed = (statistics.median(col) for col in zip(*rows))
print(f"p50 over {len(rows)} rounds: cold {cold:.1f} s, unchanged {warm:.2f} s ({warm / cold:.3f}x cold), step 5 of 9 changed {changed:.1f} s ({changed / cold:.2f}x cold)")
PY
