#!/usr/bin/env bash
# Harbor sample tasks on farm, cold and cached, and under a container runtime (podman with
# runc) for comparison, in one run on this machine.
#
#   bench/harbor.sh            (after scripts/setup.sh; installs podman and runc if missing)
#
# 1. scripts/harbor-services.sh on free ports (registry, package index, Debian repository).
# 2. farm, cold: a fresh artifact cache for images and a fresh snapshot store, so the base
#    image is pulled and converted and every environment is built; then cached: the same run
#    again (environments from the store). Wall time of `farm run configs/harbor.toml`-like
#    suites, rollouts/s and per-rollout time from summary.json.
# 3. podman, cold (`build --no-cache`) and cached: each task's image built from its
#    Dockerfile, a container started, solution/ copied in and solve.sh run, tests/ copied in and
#    test.sh run, the reward read; per-task wall time.
# Prints a summary; the numbers go into bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
FARM="$REPO/target/release/farm"
CACHE="${FARM_CACHE_DIR:-$HOME/.cache/farm}"
work=$(mktemp -d -t farm-harbor-bench-XXXXXX)
cleanup() { bash "$REPO/scripts/harbor-services.sh" stop "$work/services" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
  echo "installing podman and runc (the comparison's container runtime)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman runc uidmap >/dev/null
fi
now() { python3 -c 'import time; print(time.monotonic())'; }

bash scripts/harbor-services.sh start "$work/services" 0 0 0 >/dev/null
# shellcheck disable=SC1091
. "$work/services/env"
printf '[mirrors]\n"registry.farm.test" = ["%s"]\n' "$HARBOR_REGISTRY" > "$work/registries.toml"
sed -e "s|host.farm.internal:15002|$HARBOR_APT|g" -e "s|host.farm.internal:15001|$HARBOR_PYPI|g" \
    -e "s|path = \"data/harbor\"|path = \"$REPO/configs/data/harbor\"|" -e "s|dir = \"../out/harbor\"|dir = \"out\"|" \
    configs/harbor.toml > "$work/suite.toml"

# 2. farm: a cache of its own for images (kernel, agent and built-in images linked).
mkdir -p "$work/cache/current"
for a in kernel agent shim minimal python; do ln -s "$(readlink -f "$CACHE/current/$a")" "$work/cache/current/$a"; done
farm_run() { # farm_run NAME
  local t0 t1
  t0=$(now)
  (cd "$work" && FARM_CACHE_DIR="$work/cache" FARM_SNAPSHOT_DIR="$work/store" FARM_REGISTRIES="$work/registries.toml" \
     HARBOR_PIP_INDEX="http://$HARBOR_PYPI/simple" "$FARM" run suite.toml --out "$work/out-$1" >"$work/$1.log" 2>&1)
  t1=$(now)
  python3 - "$1" "$t0" "$t1" "$work/out-$1/summary.json" <<'PY'
import json, sys
name, t0, t1, path = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
s = json.load(open(path)); p = s["performance"]
print(f"farm {name:7} wall {t1 - t0:6.1f} s   {s['counts']}   rollouts/s {p['rollouts_per_sec']:.2f}   per rollout: total mean {p['total']['mean_ms'] / 1e3:.1f} s (agent {p['rollout']['mean_ms'] / 1e3:.1f} s, verify {p['score']['mean_ms'] / 1e3:.1f} s)")
PY
}
echo "farm (TCG, 2 cores, concurrency auto):"
farm_run cold
farm_run cached

# 3. podman.
PODMAN="podman --runtime runc"
$PODMAN pull -q --tls-verify=false "docker://$HARBOR_REGISTRY/harbor-base:bookworm" >/dev/null
$PODMAN tag "$HARBOR_REGISTRY/harbor-base:bookworm" registry.farm.test/harbor-base:bookworm
python3 - "$REPO/configs/data/harbor" "$HARBOR_APT" "$HARBOR_PYPI" <<'PY'
import os, subprocess, sys, time, tomllib, json
root, apt, pypi = sys.argv[1], sys.argv[2], sys.argv[3]
podman = ["podman", "--runtime", "runc"]
common = ["--network", "host", "--add-host", "host.farm.internal:127.0.0.1", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
def sh(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)
def one(task, no_cache):
    d = os.path.join(root, task)
    cfg = tomllib.load(open(f"{d}/task.toml", "rb"))
    env = cfg.get("environment", {})
    image = f"farmbench/{task}"
    t0 = time.monotonic()
    if env.get("docker_image"):
        image = env["docker_image"]
    else:
        r = sh(podman + ["build", "-q", "--pull=never", *(["--no-cache"] if no_cache else []), *common[:4],
                         "--build-arg", f"APT_REPO=http://{apt}", "--build-arg", f"PIP_INDEX=http://{pypi}/simple", "-t", image, f"{d}/environment"])
        if r.returncode:
            return None, f"build failed: {r.stderr[-300:]}"
    t_build = time.monotonic() - t0
    name = f"farmbench-{task}"
    sh(podman + ["rm", "-f", name])
    envs = sum((["-e", f"{k}={v}"] for k, v in env.get("env", {}).items()), [])
    r = sh(podman + ["run", "-d", "--name", name, *common, *envs, image, "sleep", "infinity"])
    if r.returncode:
        return None, f"run failed: {r.stderr[-300:]}"
    wd = ["-w", env["workdir"]] if env.get("workdir") else []
    sh(podman + ["exec", name, "mkdir", "-p", "/solution", "/tests", "/logs/verifier", "/logs/agent"])
    sh(podman + ["cp", f"{d}/solution/.", f"{name}:/solution"])
    sh(podman + ["exec", *wd, name, "bash", "-c", "chmod +x /solution/solve.sh && /solution/solve.sh > /logs/agent/oracle.txt 2>&1"])
    sh(podman + ["cp", f"{d}/tests/.", f"{name}:/tests"])
    venv = sum((["-e", f"{k}={v.replace('${HARBOR_PIP_INDEX:-http://host.farm.internal:15001/simple}', f'http://{pypi}/simple')}"] for k, v in cfg.get("verifier", {}).get("env", {}).items()), [])
    sh(podman + ["exec", *wd, *venv, name, "bash", "-c", "chmod +x /tests/test.sh && /tests/test.sh > /logs/verifier/test-stdout.txt 2>&1"])
    reward = sh(podman + ["exec", name, "sh", "-c", "cat /logs/verifier/reward.json 2>/dev/null || cat /logs/verifier/reward.txt"]).stdout.strip()
    sh(podman + ["rm", "-f", "-t", "0", name])
    return (t_build, time.monotonic() - t0), reward
tasks = sorted(os.listdir(root))
for label, no_cache in (("cold", True), ("cached", False)):
    total, builds, runs, rewards = time.monotonic(), [], [], []
    for task in tasks:
        t, reward = one(task, no_cache)
        if t is None:
            print(f"podman {label}: {task}: {reward}")
            continue
        builds.append(t[0]); runs.append(t[1] - t[0]); rewards.append(reward)
    ok = sum(1 for r in rewards if r.startswith("1") or '"reward": 1' in r)
    print(f"podman {label:6} wall {time.monotonic() - total:6.1f} s   {ok}/{len(tasks)} rewarded 1   build total {sum(builds):.1f} s   per task (container, solve, verify) mean {sum(runs) / max(1, len(runs)):.2f} s")
PY
