#!/usr/bin/env bash
# Builds an earlier revision for a before/after benchmark, in its own worktree and artifact
# cache (reusing this cache's guest kernel and debootstrap tree), once: a second call finds
# the build in place.
#
#   source bench/build-rev.sh REV      sets OLD_TREE and OLD_CACHE
set -euo pipefail
REV="${1:?usage: source bench/build-rev.sh REV}"
CACHE="${FARM_CACHE_DIR:-$HOME/.cache/farm}"
OLD_TREE="${TMPDIR:-/tmp}/farm-rev-$REV"
OLD_CACHE="${TMPDIR:-/tmp}/farm-rev-cache-$REV"
if [ ! -x "$OLD_TREE/target/release/farm" ]; then
  rm -rf "$OLD_TREE"
  git worktree add --detach "$OLD_TREE" "$REV" >/dev/null 2>&1 || git clone -q . "$OLD_TREE"
  (cd "$OLD_TREE" && git checkout -q "$REV")
  mkdir -p "$OLD_CACHE/kernel" "$OLD_CACHE/rootfs"
  cp -a "$CACHE"/kernel/. "$OLD_CACHE/kernel/"
  cp -al "$CACHE"/rootfs/. "$OLD_CACHE/rootfs/" 2>/dev/null || cp -a "$CACHE"/rootfs/. "$OLD_CACHE/rootfs/"
  echo "building $REV in $OLD_TREE (cache $OLD_CACHE)" >&2
  (cd "$OLD_TREE" && FARM_CACHE_DIR="$OLD_CACHE" CARGO_TARGET_DIR="$OLD_TREE/target" bash scripts/setup.sh >"$OLD_TREE/setup.log" 2>&1) \
    || { tail -20 "$OLD_TREE/setup.log" >&2; exit 1; }
  # farm-protocol and farm-agent are fingerprinted without their checkout's path (see
  # .cargo/config.toml): the old revision's build of them is newer than this checkout's
  # sources, so this checkout's next build would link the old ones. Newer sources here
  # make cargo build them again.
  find protocol agent -name '*.rs' -exec touch {} +
fi
