#!/usr/bin/env python3
"""The HTTP side of bench/serve.sh: served rollouts/s and session latencies against a running
`farm serve` (stock libraries only). Prints one JSON object.

    serve_client.py URL N_ROLLOUTS N_SESSION_OPS ACTIONS_JSON
"""

import json
import sys
import time

import requests


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(-(-q * len(v) // 1)) - 1))]


def stats(values):
    return {"n": len(values), "p50_ms": round(pct(values, 0.5) * 1e3, 1), "p99_ms": round(pct(values, 0.99) * 1e3, 1)}


def main():
    url, n, ops, actions = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
    http = requests.Session()

    def call(method, path, body=None):
        r = http.request(method, url + path, json=body, timeout=600)
        if r.status_code >= 400:
            sys.exit(f"{method} {path}: {r.status_code} {r.text}")
        return r

    # Served rollouts/s: one group of n, from submit to the last row pulled.
    t0 = time.monotonic()
    sub = call("POST", "/v1/rollouts", {"items": [{"task_id": "double", "n": n, "policy": {"kind": "replay", "actions": actions}}]}).json()
    wanted = set(sub["groups"][0]["rollout_ids"])
    cursor, got, statuses = 0, set(), {}
    while got != wanted:
        r = call("GET", f"/v1/results?cursor={cursor}&max=1000&wait=30")
        cursor = int(r.headers["farm-next-cursor"])
        for line in r.text.splitlines():
            row = json.loads(line)
            if row.get("rollout_id") in wanted:
                got.add(row["rollout_id"])
                statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    served_secs = time.monotonic() - t0

    # Session latencies.
    create, execs, branches, submits = [], [], [], []
    for _ in range(ops):
        t = time.monotonic()
        sid = call("POST", "/v1/sessions", {"task_id": "double"}).json()["session_id"]
        create.append(time.monotonic() - t)
        for _ in range(3):
            t = time.monotonic()
            call("POST", f"/v1/sessions/{sid}/exec", {"command": "cat n.txt"})
            execs.append(time.monotonic() - t)
        t = time.monotonic()
        bid = call("POST", f"/v1/sessions/{sid}/branch").json()["session_id"]
        branches.append(time.monotonic() - t)
        for s in (sid, bid):
            t = time.monotonic()
            call("POST", f"/v1/sessions/{s}/submit", {})
            submits.append(time.monotonic() - t)
    print(json.dumps({
        "served": {"rollouts": n, "secs": round(served_secs, 2), "per_sec": round(n / served_secs, 2), "statuses": statuses},
        "session_create": stats(create),
        "exec": stats(execs),
        "branch": stats(branches),
        "submit": stats(submits),
    }))


if __name__ == "__main__":
    main()
