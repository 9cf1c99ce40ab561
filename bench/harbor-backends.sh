#!/usr/bin/env bash
# The same Harbor job on farm's environment backend and on Harbor's own podman backend (podman
# with runc), with Harbor's own CLI, in one run on this machine.
#
#   bench/harbor-backends.sh [N_CONCURRENT]    (default 2; after scripts/setup.sh; installs
#                                               podman and runc, and podman-compose into
#                                               Harbor's venv, if missing;
#                                               BACKENDS="farm" or "podman" runs one side only)
#
# The job: the oracle agent on the eleven sample tasks (configs/data/harbor). Each backend runs
# it cold (every environment built: farm with an empty snapshot store and image cache, podman
# with none of the tasks' images) and then cached (built already). For each run it prints the
# job's wall time, each trial's environment start (Harbor's environment_setup phase) and stop
# (from the verifier's end to the trial's end) as p50/p99, the verdicts, and the ratios
# farm/podman. The services the tasks install from (scripts/harbor-services.sh) listen on the
# ports the tasks' Dockerfiles default to (15000-15002), so neither backend needs build args.
#
# podman's copy of the tasks adds an environment/docker-compose.yaml (the host's network), and
# host.farm.internal is 127.0.0.1 in /etc/hosts while the bench runs: the way to let Harbor's
# compose-based backend reach the services on loopback. farm's copy is the tasks as they are
# (farm refuses compose files).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
N="${1:-2}"
FARM="$REPO/target/release/farm"
CACHE="${FARM_CACHE_DIR:-$HOME/.cache/farm}"
HARBOR="$CACHE/harbor-venv/bin/harbor"
[ -x "$HARBOR" ] || { echo "no Harbor at $HARBOR: run scripts/setup.sh" >&2; exit 1; }
[ -x "$FARM" ] || { echo "no $FARM: run scripts/setup.sh" >&2; exit 1; }
work=$(mktemp -d -t farm-harbor-backends-XXXXXX)
hosts_backup="$work/hosts.orig"
serve_pid=
cleanup() {
  if [ -n "$serve_pid" ]; then kill "$serve_pid" 2>/dev/null; wait "$serve_pid" 2>/dev/null || true; fi
  [ -f "$hosts_backup" ] && cat "$hosts_backup" > /etc/hosts
  bash "$REPO/scripts/harbor-services.sh" stop "$work/services" >/dev/null 2>&1 || true
  podman ps -aq --filter label=com.docker.compose.project 2>/dev/null | xargs -r podman rm -f >/dev/null 2>&1 || true
  if [ -n "${KEEP:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
  echo "installing podman and runc (the comparison's container runtime)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman runc uidmap >/dev/null
fi
# Harbor drives podman through podman-compose >= 1.1 (bookworm's 1.0.3 lacks --in-pod): from
# PyPI into Harbor's venv, whose bin/ leads PATH for the podman jobs.
"$CACHE/harbor-venv/bin/python" -c 'import podman_compose' 2>/dev/null \
  || "$CACHE/harbor-venv/bin/python" -m pip install --quiet --disable-pip-version-check 'podman-compose==1.6.0'
# podman's settings for this run only: runc, and the host's network for builds too (podman-compose
# 1.0 passes no build network), so RUN steps reach the services on loopback.
# podman's default file limit is more than this machine's sandbox lets a container set.
printf '[containers]\nnetns = "host"\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n[engine]\nruntime = "runc"\n' > "$work/containers.conf"

bash scripts/harbor-services.sh start "$work/services" 15000 15001 15002 >/dev/null
# shellcheck disable=SC1091
. "$work/services/env"
printf '[mirrors]\n"registry.farm.test" = ["%s"]\n' "$HARBOR_REGISTRY" > "$work/registries.toml"

# farm: a service with the sandbox API, its own image cache (kernel, agent and built-in images
# linked) and snapshot store, so the first job builds everything.
mkdir -p "$work/cache/current"
for a in kernel agent shim minimal python; do ln -s "$(readlink -f "$CACHE/current/$a")" "$work/cache/current/$a"; done
cat > "$work/serve.toml" <<EOF
[serve]
suites = []
[serve.sandboxes]
[serve.sandboxes.build_network]
allow = ["$HARBOR_APT", "$HARBOR_PYPI"]
[serve.sandboxes.networks.harbor]
allow = ["$HARBOR_PYPI"]
EOF
FARM_CACHE_DIR="$work/cache" FARM_SNAPSHOT_DIR="$work/store" FARM_REGISTRIES="$work/registries.toml" FARM_RUN_DIR="$work/run" \
  "$FARM" serve "$work/serve.toml" --out "$work/serve-out" --listen 127.0.0.1:0 2>"$work/serve.log" &
serve_pid=$!
url=
for _ in $(seq 600); do
  url=$(grep -o 'listening on http://[0-9.:]*' "$work/serve.log" | head -1 | sed 's/listening on //') && [ -n "$url" ] && break
  kill -0 "$serve_pid" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
  sleep 0.2
done
[ -n "$url" ] || { echo "farm serve did not start" >&2; cat "$work/serve.log" >&2; exit 1; }

job() { # job NAME TASKS ENV-ARGS...
  local name=$1 tasks=$2 t0 t1
  shift 2
  t0=$(date +%s.%N)
  PYTHONPATH="$REPO/clients/python" "$HARBOR" run --path "$tasks" --agent oracle --n-concurrent "$N" --yes --quiet \
    --jobs-dir "$work/jobs" --job-name "$name" "$@" >"$work/$name.log" 2>&1 || { echo "harbor run $name failed:" >&2; tail -30 "$work/$name.log" >&2; }
  t1=$(date +%s.%N)
  echo "$name $(echo "$t1 - $t0" | bc)" >> "$work/walls"
}
farm_job() { job "$1" "$REPO/configs/data/harbor" --env farm_sdk.harbor:FarmEnvironment --ek "url=$url" --ek network=harbor; }

# podman: the tasks with a compose override each; host.farm.internal in /etc/hosts while it runs.
cp -r "$REPO/configs/data/harbor" "$work/podman-tasks"
for t in "$work"/podman-tasks/*/; do
  cat > "$t/environment/docker-compose.yaml" <<'EOF'
services:
  main:
    network_mode: host
EOF
done
cp /etc/hosts "$hosts_backup"
grep -q 'host.farm.internal' /etc/hosts || echo '127.0.0.1 host.farm.internal' >> /etc/hosts
CONTAINERS_CONF="$work/containers.conf" podman pull -q --tls-verify=false "docker://$HARBOR_REGISTRY/harbor-base:bookworm" >/dev/null
podman tag "$HARBOR_REGISTRY/harbor-base:bookworm" registry.farm.test/harbor-base:bookworm
podman_cold() { # none of the tasks' images
  podman images --format '{{.Repository}}:{{.Tag}} {{.ID}}' | grep -v 'harbor-base' | awk '{print $2}' | sort -u | xargs -r podman rmi -f >/dev/null 2>&1 || true
}
# --no-delete: Harbor's default (--delete) removes each trial's image at its end, so every
# trial would build again; kept, the second job finds them.
podman_job() { PATH="$CACHE/harbor-venv/bin:$PATH" CONTAINERS_CONF="$work/containers.conf" job "$1" "$work/podman-tasks" --env podman --no-delete; }

echo "farm (TCG, 2 cores) and podman (runc), harbor run --agent oracle --n-concurrent $N, 11 tasks:" >&2
case " ${BACKENDS:-farm podman} " in *" farm "*) farm_job farm-cold; farm_job farm-cached ;; esac
case " ${BACKENDS:-farm podman} " in *" podman "*) podman_cold; podman_job podman-cold; podman_job podman-cached; podman_cold ;; esac

python3 - "$work/jobs" "$work/walls" <<'PY'
import json, os, sys
from datetime import datetime
jobs, walls = sys.argv[1], dict(l.split() for l in open(sys.argv[2]))
def t(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")) if s else None
def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")
stats = {}
for name in ["farm-cold", "farm-cached", "podman-cold", "podman-cached"]:
    starts, stops, verdicts, errors = [], [], {}, {}
    d = os.path.join(jobs, name)
    for trial in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        p = os.path.join(d, trial, "result.json")
        if not os.path.exists(p):
            continue
        r = json.load(open(p))
        task = r["task_name"].rsplit("/", 1)[-1]
        env = r.get("environment_setup") or {}
        if env.get("started_at") and env.get("finished_at"):
            starts.append((t(env["finished_at"]) - t(env["started_at"])).total_seconds())
        ver = r.get("verifier") or {}
        if ver.get("finished_at") and r.get("finished_at"):
            stops.append((t(r["finished_at"]) - t(ver["finished_at"])).total_seconds())
        rewards = (r.get("verifier_result") or {}).get("rewards") or {}
        verdicts[task] = rewards.get("reward")
        if r.get("exception_info"):
            errors[task] = r["exception_info"]["exception_type"] + ": " + r["exception_info"]["exception_message"][:160]
    stats[name] = (float(walls.get(name, "nan")), starts, stops, verdicts)
    passed = sum(1 for v in verdicts.values() if v == 1.0)
    print(f"{name:14} wall {stats[name][0]:7.1f} s   env start p50 {pct(starts, .5):6.2f} s p99 {pct(starts, .99):6.2f} s   "
          f"stop p50 {pct(stops, .5):5.2f} s p99 {pct(stops, .99):5.2f} s   rewarded 1: {passed}/{len(verdicts)}")
    for task, e in errors.items():
        print(f"    {task}: {e}")
for kind in ["cold", "cached"]:
    f, p = stats[f"farm-{kind}"], stats[f"podman-{kind}"]
    if not (f[3] and p[3]):
        continue
    same = f[3] == p[3]
    print(f"{kind:6}: farm/podman wall x{f[0] / p[0]:.2f}, env start p50 x{pct(f[1], .5) / max(1e-9, pct(p[1], .5)):.2f}, "
          f"stop p50 x{pct(f[2], .5) / max(1e-9, pct(p[2], .5)):.2f}; verdicts {'the same' if same else 'DIFFER: ' + str(sorted(set(f[3].items()) ^ set(p[3].items())))}")
PY
