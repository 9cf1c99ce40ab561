#!/usr/bin/env python3
"""The sandbox API's benchmark (run by bench/sandboxes.sh).

    sandboxes.py URL latency N LABEL          one JSON line: create-to-first-exec p50/p99
    sandboxes.py URL leak N RUN_DIR SERVE_PID one JSON object: N sandboxes at once, then the leak check
    sandboxes.py - report LATENCY.jsonl LEAK.json
"""

import concurrent.futures
import json
import os
import sys
import time

import requests

HTTP = requests.Session()


def call(url, method, path, body=None, expect=(200, 201, 202)):
    r = HTTP.request(method, url + path, json=body, timeout=900)
    if r.status_code not in expect:
        raise SystemExit(f"{method} {path}: {r.status_code} {r.text}")
    return r.json()


def environment(url):
    env = call(url, "POST", "/v1/environments", {"image": "minimal"})
    offset = 0
    while env["state"] == "building":
        logs = call(url, "GET", f"/v1/environments/{env['id']}/logs?offset={offset}&wait=30")
        offset = logs["next"]
        env = call(url, "GET", f"/v1/environments/{env['id']}")
    if env["state"] != "ready":
        raise SystemExit(f"the environment failed: {env}")
    return env["id"]


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def wait_warm(url, env_id, want, limit=120):
    started = time.monotonic()
    while call(url, "GET", f"/v1/environments/{env_id}")["warm"] < want:
        if time.monotonic() - started > limit:
            return False
        time.sleep(0.05)
    return True


def latency(url, n, label):
    env_id = environment(url)
    # The first sandbox starts the environment's pool (when there is one).
    first = call(url, "POST", "/v1/sandboxes", {"environment": env_id})
    call(url, "DELETE", f"/v1/sandboxes/{first['id']}")
    pooled = label != "pool-0"
    totals, creates, execs, misses = [], [], [], 0
    for _ in range(n):
        if pooled and not wait_warm(url, env_id, 1):
            misses += 1
        else:
            time.sleep(0.3)  # the same pause either way: the host settles after a delete
        t0 = time.monotonic()
        sb = call(url, "POST", "/v1/sandboxes", {"environment": env_id})
        t1 = time.monotonic()
        out = call(url, "POST", f"/v1/sandboxes/{sb['id']}/exec", {"command": "true"})
        t2 = time.monotonic()
        assert out["exit_code"] == 0, out
        call(url, "DELETE", f"/v1/sandboxes/{sb['id']}")
        totals.append((t2 - t0) * 1e3)
        creates.append((t1 - t0) * 1e3)
        execs.append((t2 - t1) * 1e3)
    print(json.dumps({
        "label": label, "n": n, "pool_misses": misses,
        "p50_ms": round(percentile(totals, 50), 1), "p99_ms": round(percentile(totals, 99), 1),
        "create_p50_ms": round(percentile(creates, 50), 1), "exec_p50_ms": round(percentile(execs, 50), 1),
    }))


def qemu_pids(run_dir):
    """Live QEMU processes with a file under run_dir open."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"qemu-system" not in open(f"/proc/{pid}/cmdline", "rb").read():
                continue
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith(run_dir) for fd in fds):
                found.append(int(pid))
        except OSError:
            continue
    return found


def qemu_of(run_dir):
    """How many live QEMU processes have a file under run_dir open."""
    return len(qemu_pids(run_dir))


def mem_available_mib():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


def files_under(path):
    return sum(len(files) for _, _, files in os.walk(path))


def leak(url, n, run_dir, serve_pid):
    env_id = environment(url)
    first = call(url, "POST", "/v1/sandboxes", {"environment": env_id})
    call(url, "DELETE", f"/v1/sandboxes/{first['id']}")
    wait_warm(url, env_id, 2)
    out_dir = os.path.join(os.path.dirname(run_dir), "out-2", "sandboxes")
    HTTP.close()  # the client's own kept-alive connections are not the service's leak
    time.sleep(1)
    before = {"qemu": qemu_of(run_dir), "fds": len(os.listdir(f"/proc/{serve_pid}/fd")),
              "files": files_under(out_dir), "mem_available_mib": mem_available_mib(), "serve_rss_mib": rss_mib(serve_pid)}

    def one(i):
        sb = call(url, "POST", "/v1/sandboxes", {"environment": env_id, "env": {"I": str(i)}})
        out = call(url, "POST", f"/v1/sandboxes/{sb['id']}/exec", {"command": "echo $I > /tmp/i && cat /tmp/i"})
        assert out["stdout"] == f"{i}\n", out
        return sb["id"]

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(one, range(n)))
    t1 = time.monotonic()
    peak = {"qemu": qemu_of(run_dir), "mem_available_mib": mem_available_mib(),
            "sandboxes": len(call(url, "GET", "/v1/sandboxes")["sandboxes"])}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: call(url, "DELETE", f"/v1/sandboxes/{i}"), ids))
    t2 = time.monotonic()
    wait_warm(url, env_id, 2)
    listed = len(call(url, "GET", "/v1/sandboxes")["sandboxes"])
    HTTP.close()
    time.sleep(2)
    after = {"qemu": qemu_of(run_dir), "fds": len(os.listdir(f"/proc/{serve_pid}/fd")),
             "files": files_under(out_dir), "mem_available_mib": mem_available_mib(), "sandboxes": listed,
             "serve_rss_mib": rss_mib(serve_pid)}
    print(json.dumps({"n": n, "create_and_use_secs": round(t1 - t0, 1), "delete_secs": round(t2 - t1, 1),
                      "before": before, "peak": peak, "after": after,
                      "leaked_qemu": after["qemu"] - before["qemu"], "leaked_fds": after["fds"] - before["fds"],
                      "leaked_files": after["files"] - before["files"]}))


def report(latency_path, leak_path):
    rows = {r["label"]: r for r in map(json.loads, open(latency_path))}
    print("sandbox create -> first exec (ms), minimal image, TCG:")
    for label, r in rows.items():
        print(f"  {label:7} n={r['n']:3}  p50 {r['p50_ms']:7.1f}  p99 {r['p99_ms']:7.1f}   "
              f"(create p50 {r['create_p50_ms']:.1f}, exec p50 {r['exec_p50_ms']:.1f}, pool misses {r['pool_misses']})")
    if "pool-0" in rows and "pool-2" in rows:
        print(f"  warm pool / no pool: p50 x{rows['pool-2']['p50_ms'] / rows['pool-0']['p50_ms']:.2f}, "
              f"p99 x{rows['pool-2']['p99_ms'] / rows['pool-0']['p99_ms']:.2f}")
    l = json.load(open(leak_path))
    print(f"{l['n']} sandboxes at once: created and used in {l['create_and_use_secs']} s, deleted in {l['delete_secs']} s; "
          f"peak {l['peak']['qemu']} QEMU, MemAvailable {l['before']['mem_available_mib']} -> {l['peak']['mem_available_mib']} "
          f"-> {l['after']['mem_available_mib']} MiB")
    print(f"  after: {l['after']['sandboxes']} sandboxes, leaked QEMU {l['leaked_qemu']}, fds {l['leaked_fds']}, "
          f"files {l['leaked_files']}; farm serve RSS {l['before']['serve_rss_mib']} -> {l['after']['serve_rss_mib']} MiB")


if __name__ == "__main__":
    url, mode = sys.argv[1].rstrip("/"), sys.argv[2]
    if mode == "latency":
        latency(url, int(sys.argv[3]), sys.argv[4])
    elif mode == "leak":
        leak(url, int(sys.argv[3]), sys.argv[4], sys.argv[5])
    else:
        report(sys.argv[3], sys.argv[4])
