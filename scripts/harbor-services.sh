#!/usr/bin/env bash
# Local stand-ins for what Harbor tasks reach while their environments build and their
# verifiers run, all on loopback, all from this machine:
#   - an OCI registry (Debian's docker-registry) holding the tasks' base image,
#     `harbor-base:bookworm`: the set-up script's Debian bookworm tree (python3, git) plus pip;
#   - a Python package index (PEP 503 "simple") with pytest and its dependencies;
#   - a Debian repository with tcc and the C library headers.
#
#   scripts/harbor-services.sh start DIR [REGISTRY_PORT PYPI_PORT APT_PORT]
#   scripts/harbor-services.sh stop DIR
#
# `start` serves from DIR (the registry's storage, the index and the repository), writes the
# servers' pids to DIR/pids and the addresses to DIR/env (HARBOR_REGISTRY as the host pulls
# from it; HARBOR_PYPI and HARBOR_APT as guests reach them, host.farm.internal:PORT), and
# prints them. Ports default to 15000, 15001 and 15002; 0
# picks free ones. The base image is built once per set-up and cached in the artifact cache.
# With HARBOR_SERVICES_OWNER=PID, the servers die with that process (a watcher stops them
# and removes DIR once PID is gone), however it ends: a test binary that runs only some of
# its tests, or is killed, leaves nothing behind.
# Needs scripts/setup.sh (umoci, skopeo, docker-registry, dpkg-dev, the packages).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${FARM_CACHE_DIR:-$HOME/.cache/farm}"
cmd="${1:?usage: harbor-services.sh start|stop DIR [REGISTRY_PORT PYPI_PORT APT_PORT]}"
DIR="${2:?usage: harbor-services.sh start|stop DIR}"
log() { printf '[harbor-services] %s\n' "$*" >&2; }
die() { printf '[harbor-services] error: %s\n' "$*" >&2; exit 1; }

if [ "$cmd" = stop ]; then
  [ -f "$DIR/pids" ] && xargs -r kill < "$DIR/pids" 2>/dev/null || true
  rm -f "$DIR/pids"
  exit 0
fi
[ "$cmd" = start ] || die "unknown command $cmd (start or stop)"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port() { if [ "${1:-}" = 0 ]; then free_port; else echo "$2"; fi; }
REG_PORT=$(port "${3:-15000}" "${3:-15000}"); PYPI_PORT=$(port "${4:-15001}" "${4:-15001}"); APT_PORT=$(port "${5:-15002}" "${5:-15002}")
# A port something already listens on would pass the readiness check below with another's
# service (a run that was not stopped): refuse it instead.
for p in "$REG_PORT" "$PYPI_PORT" "$APT_PORT"; do
  if python3 -c "import socket, sys; socket.create_connection(('127.0.0.1', $p), 1)" 2>/dev/null; then
    die "something already listens on 127.0.0.1:$p (an earlier run's services? scripts/harbor-services.sh stop DIR, or pick other ports)"
  fi
done
PKGS="$CACHE/harbor-packages"
[ -d "$PKGS/debs" ] && [ -d "$PKGS/wheels" ] || die "no packages in $PKGS (run scripts/setup.sh)"

# 1. The base image, as an OCI layout, once per debootstrap tree and pip wheel.
rootfs=$(ls -td "$CACHE"/rootfs/python-* 2>/dev/null | grep -v '\.done$' | head -1)
[ -d "$rootfs" ] || die "no debootstrap tree in $CACHE/rootfs (run scripts/setup.sh)"
pip_whl=$(python3 -c 'import ensurepip, glob, os; print(sorted(glob.glob(os.path.join(os.path.dirname(ensurepip.__file__), "_bundled", "pip-*.whl")))[-1])')
base_key=$(printf 'v3\n%s\n%s\n' "$rootfs" "$(basename "$pip_whl")" | sha256sum | cut -c1-16)
BASE="$CACHE/harbor-base/$base_key"
if [ ! -f "$BASE/done" ]; then
  log "building the base image harbor-base:bookworm from $rootfs (once)"
  rm -rf "$BASE" && mkdir -p "$BASE"
  work=$(mktemp -d "$CACHE/tmp/harbor-base-XXXXXX")
  (
    cd "$work"
    umoci init --layout L >/dev/null && umoci new --image L:b >/dev/null && umoci unpack --image L:b B >/dev/null
    cp -a "$rootfs/." B/rootfs/
    # pip, from the host Python's bundled wheel (the same Python 3.11 as the guest's).
    python3 "$pip_whl/pip" install --quiet --no-index --no-warn-script-location --target B/rootfs/usr/local/lib/python3.11/dist-packages "$pip_whl"
    printf '#!/bin/sh\nexec python3 -m pip "$@"\n' > B/rootfs/usr/local/bin/pip && chmod 755 B/rootfs/usr/local/bin/pip
    # As the python images on Docker Hub: pip may install into the system (PEP 668 marker off).
    rm -f B/rootfs/usr/lib/python3*/EXTERNALLY-MANAGED
    # The local index is plain HTTP on the host's loopback, as guests see it.
    printf '[global]\ntrusted-host = host.farm.internal\n' > B/rootfs/etc/pip.conf
    umoci repack --image L:b B >/dev/null
    umoci config --image L:b --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --config.workingdir / >/dev/null
  ) || die "building the base image failed"
  mv "$work/L" "$BASE/layout" && rm -rf "$work" && touch "$BASE/done"
fi

# 2. The package index and the Debian repository, as static folders.
rm -rf "$DIR/pypi" "$DIR/apt" && mkdir -p "$DIR/pypi/simple" "$DIR/apt"
python3 - "$PKGS/wheels" "$DIR/pypi" <<'PY'
import hashlib, os, re, shutil, sys
wheels, root = sys.argv[1], sys.argv[2]
os.makedirs(f"{root}/packages", exist_ok=True)
projects = {}
for name in sorted(os.listdir(wheels)):
    project = re.sub(r"[-_.]+", "-", name.split("-")[0]).lower()
    shutil.copy(f"{wheels}/{name}", f"{root}/packages/{name}")
    digest = hashlib.sha256(open(f"{wheels}/{name}", "rb").read()).hexdigest()
    projects.setdefault(project, []).append(f'<a href="../../packages/{name}#sha256={digest}">{name}</a>')
for project, links in projects.items():
    os.makedirs(f"{root}/simple/{project}", exist_ok=True)
    open(f"{root}/simple/{project}/index.html", "w").write("\n".join(links) + "\n")
open(f"{root}/simple/index.html", "w").write("\n".join(f'<a href="{p}/">{p}</a>' for p in projects) + "\n")
PY
cp "$PKGS"/debs/*.deb "$DIR/apt/"
(cd "$DIR/apt" && dpkg-scanpackages --multiversion . /dev/null 2>/dev/null > Packages)
python3 - "$DIR/apt" <<'PY'
import email.utils, hashlib, os, sys
root = sys.argv[1]
data = open(f"{root}/Packages", "rb").read()
release = f"Origin: farm\nLabel: farm-harbor\nDate: {email.utils.formatdate(usegmt=True)}\nSHA256:\n {hashlib.sha256(data).hexdigest()} {len(data)} Packages\n"
open(f"{root}/Release", "w").write(release)
PY

# 3. The servers.
"$0" stop "$DIR"
rm -rf "$DIR/registry" && mkdir -p "$DIR/registry"
cat > "$DIR/registry/config.yml" <<YML
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: $DIR/registry/data
http:
  addr: 127.0.0.1:$REG_PORT
YML
nohup docker-registry serve "$DIR/registry/config.yml" >"$DIR/registry/log" 2>&1 &
echo $! >> "$DIR/pids"
nohup python3 -m http.server "$PYPI_PORT" --bind 127.0.0.1 --directory "$DIR/pypi" >"$DIR/pypi.log" 2>&1 &
echo $! >> "$DIR/pids"
nohup python3 -m http.server "$APT_PORT" --bind 127.0.0.1 --directory "$DIR/apt" >"$DIR/apt.log" 2>&1 &
echo $! >> "$DIR/pids"
if [ -n "${HARBOR_SERVICES_OWNER:-}" ]; then
  owner="$HARBOR_SERVICES_OWNER"
  # shellcheck disable=SC2016
  nohup bash -c 'while kill -0 "$1" 2>/dev/null && [ -f "$2/pids" ]; do sleep 1; done
    if [ -f "$2/pids" ]; then xargs -r kill < "$2/pids" 2>/dev/null; rm -rf "$2"; fi' \
    harbor-services-watcher "$owner" "$DIR" >/dev/null 2>&1 < /dev/null &
fi
for p in "$REG_PORT" "$PYPI_PORT" "$APT_PORT"; do
  up=
  for _ in $(seq 600); do
    python3 -c "import socket, sys; socket.create_connection(('127.0.0.1', $p), 1)" 2>/dev/null && up=1 && break
    sleep 0.1
  done
  [ -n "$up" ] || die "nothing listens on 127.0.0.1:$p after 60 s (logs in $DIR)"
done
skopeo copy -q --dest-tls-verify=false "oci:$BASE/layout:b" "docker://127.0.0.1:$REG_PORT/harbor-base:bookworm" || die "pushing the base image failed (registry log: $DIR/registry/log)"
# The registry is pulled from on the host (127.0.0.1); the index and the repository are
# reached from guests, where the host's loopback is host.farm.internal.
printf 'HARBOR_REGISTRY=127.0.0.1:%s\nHARBOR_PYPI=host.farm.internal:%s\nHARBOR_APT=host.farm.internal:%s\n' "$REG_PORT" "$PYPI_PORT" "$APT_PORT" | tee "$DIR/env"
