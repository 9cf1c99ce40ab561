#!/usr/bin/env python3
"""The HTTP side of bench/serve-density.sh (stock libraries only). Prints one JSON object.

    serve_density.py URL N_SESSIONS SERVE_PID KSM
"""

import json
import os
import sys
import time

import requests


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(-(-q * len(v) // 1)) - 1))] if v else None


def stats(values):
    if not values:
        return None
    return {"n": len(values), "p50_ms": round(pct(values, 0.5) * 1e3, 1), "p99_ms": round(pct(values, 0.99) * 1e3, 1)}


def meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            out[key] = int(value.split()[0]) * 1024
    return out


def tree_ticks(root):
    """CPU ticks of a process and all its descendants (the service and its QEMUs)."""
    children = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append((int(pid), int(fields[11]) + int(fields[12])))
            except OSError:
                pass
    total, todo = 0, [root]
    with open(f"/proc/{root}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    while todo:
        for pid, ticks in children.get(todo.pop(), []):
            total += ticks
            todo.append(pid)
    return total


step_refusals = 0


def main():
    url, n, serve_pid, ksm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    http = requests.Session()
    total = meminfo()["MemTotal"]
    peak_used = 0

    def call(method, path, body=None):
        return http.request(method, url + path, json=body, timeout=600)

    def step(sid):
        """One `cat n.txt` in session `sid`: (seconds, None) or (None, what went wrong); a 503
        (memory below half the reserve) is retried every 5 s for a minute, as a client would."""
        global step_refusals
        for _ in range(13):
            t = time.monotonic()
            r = call("POST", f"/v1/sessions/{sid}/exec", {"command": "cat n.txt"})
            if r.status_code != 503:
                break
            step_refusals += 1
            time.sleep(5)
        if r.status_code == 200 and r.json()["step"].get("exit_code") == 0:
            return time.monotonic() - t, None
        return None, f"{sid}: {r.status_code} {r.text[:200]}"

    capacity0 = call("GET", "/v1/capacity").json()
    # A 503 (memory past the reserve) is retried after its Retry-After, as a client would, while
    # memory still comes back (ksmd merging); a minute without a new session ends the fill.
    sessions, opens, refused, refusals, last_open = [], [], None, 0, time.monotonic()
    first_steps, failed = [], []
    while len(sessions) < n:
        t = time.monotonic()
        r = call("POST", "/v1/sessions", {"task_id": "double"})
        if r.status_code != 201:
            refused = {"status": r.status_code, "error": r.json().get("error"), "retry_after": r.headers.get("retry-after")}
            refusals += 1
            if r.status_code != 503 or time.monotonic() - last_open > 60:
                break
            time.sleep(int(r.headers.get("retry-after", "5")))
            continue
        last_open = time.monotonic()
        opens.append(time.monotonic() - t)
        sessions.append(r.json()["session_id"])
        # As a trainer does: the environment's first action right away (it grows the VM,
        # which the service's measured cost then includes).
        took, error = step(sessions[-1])
        first_steps.append(took) if took is not None else failed.append(f"first step of {error}")
        m = meminfo()
        peak_used = max(peak_used, m["MemTotal"] - m["MemAvailable"])
        if len(sessions) % 50 == 0:
            print(f"{len(sessions)} sessions live, host memory used {(m['MemTotal'] - m['MemAvailable']) >> 20} MiB", file=sys.stderr)

    steps = []
    for sid in sessions:
        took, error = step(sid)
        steps.append(took) if took is not None else failed.append(error)

    capacity1 = call("GET", "/v1/capacity").json()
    hz = os.sysconf("SC_CLK_TCK")
    t0, ticks0 = time.monotonic(), tree_ticks(serve_pid)
    time.sleep(60)
    idle_percent = (tree_ticks(serve_pid) - ticks0) / hz / (time.monotonic() - t0) * 100

    for sid in sessions:
        call("DELETE", f"/v1/sessions/{sid}")
    m = meminfo()
    print(json.dumps({
        "benchmark": "serve-density",
        "ksm": ksm,
        "sessions_wanted": n,
        "sessions_live": len(sessions),
        "last_refusal": refused,
        "refusals_503": refusals,
        "open_session": stats(opens),
        "first_step_after_open": stats(first_steps),
        "second_step_in_each_with_all_live": stats(steps),
        "step_refusals_503": step_refusals,
        "failed_steps": failed[:10],
        "idle_service_cpu_percent_of_one_core": round(idle_percent, 2),
        "max_sessions": capacity0["max_sessions"],
        "memory_at_start": capacity0["memory"],
        "memory_with_all_live": capacity1["memory"],
        "host_total_mib": total >> 20,
        "host_used_peak_percent": round(peak_used / total * 100, 2),
        "host_used_after_delete_mib": (m["MemTotal"] - m["MemAvailable"]) >> 20,
    }, indent=1))


if __name__ == "__main__":
    main()
