#!/usr/bin/env python3
"""Pause and resume of `farm serve` sessions (bench/RESULTS.md; run by bench/pause.sh).

For each image (minimal: configs/serve.toml; python: configs/task-folders.toml), N sessions
each do some work (a 16 MiB file in the workspace, a background process holding a file open;
on python, a Python process with 32 MiB of live objects), then, in the same run:
  - branch (the baseline: a snapshot of the session and a fork of it),
  - pause (snapshot, pack against the task snapshot, VM stopped), with the paused folder's size,
  - resume (RAM rebuilt and checked, fork), and the first exec after it.
Prints p50/p99 per figure and its ratio to branch.

    bench/pause.py FARM WORK [N]
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import requests

FARM, WORK = sys.argv[1], sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 8
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def serve(config, out):
    p = subprocess.Popen([FARM, "serve", config, "--out", out, "--listen", "127.0.0.1:0"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = []
    ready = threading.Event()

    def read():
        for line in p.stderr:
            if "listening on http://" in line and not url:
                url.append(line.split("listening on ")[1].split()[0])
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    ready.wait(900)
    if not url:
        sys.exit(f"farm serve {config} did not start")
    return p, url[0]


def post(url, path, body=None, ok=(200, 201)):
    r = requests.post(url + path, json=body if body is not None else {}, timeout=900)
    if r.status_code not in ok:
        sys.exit(f"POST {path}: {r.status_code} {r.text}")
    return r.json()


def timed(f):
    t = time.monotonic()
    out = f()
    return (time.monotonic() - t) * 1e3, out


def bench(name, config, task, work_cmd):
    out = os.path.join(WORK, name)
    p, url = serve(config, out)
    try:
        figures = {"branch_ms": [], "pause_ms": [], "resume_ms": [], "first_exec_after_resume_ms": [], "paused_mib": [], "memory_pages_changed": []}
        memory = 0
        for _ in range(N):
            s = post(url, "/v1/sessions", {"task_id": task})["session_id"]
            step = post(url, f"/v1/sessions/{s}/exec", {"command": work_cmd})["step"]
            if step["exit_code"] != 0:
                sys.exit(f"the work failed: {step}")
            ms, b = timed(lambda: post(url, f"/v1/sessions/{s}/branch"))
            figures["branch_ms"].append(ms)
            requests.delete(f"{url}/v1/sessions/{b['session_id']}", timeout=60)
            ms, paused = timed(lambda: post(url, f"/v1/sessions/{s}/pause"))
            figures["pause_ms"].append(ms)
            figures["paused_mib"].append(paused["paused"]["disk_bytes"] / 2**20)
            figures["memory_pages_changed"].append(paused["paused"]["memory_pages_changed"])
            memory = paused["paused"]["memory_bytes"]
            ms, _ = timed(lambda: post(url, f"/v1/sessions/{s}/resume"))
            figures["resume_ms"].append(ms)
            ms, step = timed(lambda: post(url, f"/v1/sessions/{s}/exec", {"command": "kill -0 $(cat /tmp/holder.pid) && wc -c < big.bin"}))
            if step["step"]["exit_code"] != 0:
                sys.exit(f"the session did not come back as it was: {step}")
            figures["first_exec_after_resume_ms"].append(ms)
            requests.delete(f"{url}/v1/sessions/{s}", timeout=60)
        base = pct(figures["branch_ms"], 0.5)
        print(json.dumps({"image": name, "sessions": N, "guest_ram_mib": memory / 2**20}))
        for key, values in figures.items():
            line = {"what": key, "p50": round(pct(values, 0.5), 1), "p99": round(pct(values, 0.99), 1)}
            if key.endswith("_ms"):
                line["ratio_p50_to_branch"] = round(pct(values, 0.5) / base, 2)
            print(json.dumps(line))
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(120)


MINIMAL_WORK = "head -c 16777216 /dev/urandom > big.bin; (exec 3>>/tmp/held; while sleep 1; do echo tick >&3; done) >/dev/null 2>&1 & echo $! > /tmp/holder.pid"
PYTHON_WORK = MINIMAL_WORK.replace("> /tmp/holder.pid", "> /tmp/writer.pid") + \
    "; python3 -c 'import time; x = bytearray(32 << 20); x[::4096] = bytes([7]) * len(x[::4096]); time.sleep(100000)' >/dev/null 2>&1 & echo $! > /tmp/holder.pid; sleep 2"
bench("minimal", os.path.join(REPO, "configs/serve.toml"), "double", MINIMAL_WORK)
bench("python", os.path.join(REPO, "configs/task-folders.toml"), "greeting", PYTHON_WORK)
