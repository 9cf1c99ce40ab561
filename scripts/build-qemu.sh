#!/usr/bin/env bash
# Builds QEMU with farm's reset patch from Debian's source package of the QEMU installed here
# (the same version, with Debian's own patches: the 7.2 stable updates and the rest), for
# x86_64 system emulation only, into the artifact cache:
#
#   scripts/build-qemu.sh            prints the binary's path (builds it once; later calls
#                                    find it in place)
#
# The patch (scripts/qemu/farm-selective-reset.patch) lets a reset in place keep the
# translated code of every page the reset did not change; stock QEMU throws all of it away
# on every state load (docs/snapshots.md, "Reset in place"). farm runs this binary by default
# (the set-up links it as current/qemu-farm-reset; FARM_QEMU=qemu-system-x86_64 picks
# Debian's); its version line says "farm-reset", which is how farm knows.
#
# Layout: /usr/local/lib/farm/qemu/<key>/bin/qemu-system-x86_64 (or under $FARM_QEMU_DIR),
# and share/qemu -> /usr/share/qemu (the firmware of Debian's qemu-system-data: a
# relocatable QEMU looks for it beside its bin/). Not in the artifact cache: farm starts QEMU
# as a uid of its own, which cannot reach into root's home. <key>: the Debian version, this
# script and the patch. About 4 minutes on 2 cores.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${FARM_CACHE_DIR:-$HOME/.cache/farm}"
log() { echo "[build-qemu $(date +%H:%M:%S)] $*" >&2; }

VERSION="$(dpkg-query -W -f='${Version}' qemu-system-x86 2>/dev/null)" \
  || { echo "qemu-system-x86 is not installed (scripts/setup.sh installs it)" >&2; exit 1; }
SOURCE_VERSION="${VERSION#*:}"      # no epoch
SOURCE_VERSION="${SOURCE_VERSION%+b[0-9]*}"  # no binNMU suffix
UPSTREAM="${SOURCE_VERSION%-*}"
KEY="$( { echo "$VERSION"; cat "$0" "$REPO/scripts/qemu/farm-selective-reset.patch"; } | sha256sum | cut -c1-16)"
QEMU_DIR="${FARM_QEMU_DIR:-/usr/local/lib/farm/qemu}"
OUT="$QEMU_DIR/$KEY"
if [ -x "$OUT/bin/qemu-system-x86_64" ]; then
  echo "$OUT/bin/qemu-system-x86_64"
  exit 0
fi

# (scripts/setup.sh installs them before it starts this beside other work: no apt here then.)
DEPS=(meson ninja-build pkg-config libglib2.0-dev libpixman-1-dev libseccomp-dev libfdt-dev bzip2 xz-utils curl patch)
if ! dpkg-query -W -f='${Status}\n' "${DEPS[@]}" 2>/dev/null | grep -c "install ok installed" | grep -qx "${#DEPS[@]}"; then
  log "installing QEMU's build dependencies"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${DEPS[@]}" >/dev/null
fi

WORK="$CACHE/tmp/qemu-$KEY.build"
rm -rf "$WORK"
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT
POOL="${FARM_DEBIAN_POOL:-http://deb.debian.org/debian/pool/main/q/qemu}"
log "fetching Debian's source of qemu $SOURCE_VERSION"
for file in "qemu_${UPSTREAM}.orig.tar.xz" "qemu_${SOURCE_VERSION}.debian.tar.xz"; do
  curl -sSf --retry 3 -o "$WORK/$file" "$POOL/$file" \
    || { echo "could not download $POOL/$file" >&2; exit 1; }
done
tar xJf "$WORK/qemu_${UPSTREAM}.orig.tar.xz" -C "$WORK"
SRC="$(find "$WORK" -mindepth 1 -maxdepth 1 -type d -name 'qemu-*' | head -1)"
tar xJf "$WORK/qemu_${SOURCE_VERSION}.debian.tar.xz" -C "$SRC"
log "applying Debian's patches and farm's"
while read -r patch _; do
  case "$patch" in ''|'#'*) continue ;; esac
  patch -d "$SRC" -p1 -s --no-backup-if-mismatch < "$SRC/debian/patches/$patch"
done < "$SRC/debian/patches/series"
patch -d "$SRC" -p1 -s --no-backup-if-mismatch < "$REPO/scripts/qemu/farm-selective-reset.patch"

log "building qemu-system-x86_64 (farm-reset)"
mkdir -p "$WORK/build"
(cd "$WORK/build" && "$SRC/configure" --prefix=/usr --target-list=x86_64-softmmu \
  --without-default-features --enable-tcg --enable-kvm --enable-seccomp --enable-fdt=system \
  --disable-docs --disable-werror --disable-install-blobs --with-pkgversion=farm-reset \
  >"$WORK/configure.log" 2>&1) || { tail -20 "$WORK/configure.log" >&2; exit 1; }
ninja -C "$WORK/build" -j"$(nproc)" qemu-system-x86_64 >"$WORK/ninja.log" 2>&1 \
  || { tail -30 "$WORK/ninja.log" >&2; exit 1; }

mkdir -p "$QEMU_DIR"
STAGE="$QEMU_DIR/.$KEY.tmp"
rm -rf "$STAGE"
mkdir -p "$STAGE/bin" "$STAGE/share"
install -m 0755 "$WORK/build/qemu-system-x86_64" "$STAGE/bin/"
ln -s /usr/share/qemu "$STAGE/share/qemu"
rm -rf "$OUT"
mv "$STAGE" "$OUT"
log "done: $OUT/bin/qemu-system-x86_64 ($("$OUT/bin/qemu-system-x86_64" --version | head -1))"
echo "$OUT/bin/qemu-system-x86_64"
