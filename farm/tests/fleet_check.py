#!/usr/bin/env python3
"""Checks examples/farm_client.py's Fleet against two real `farm serve` processes on loopback
(run by farm/tests/serve.rs): submits spread by capacity, idempotent retries, a cursor per
endpoint, sessions that stay where they were opened, and a `kill -9` of one endpoint with a
restart on its output folder, after which no row is missing or delivered twice.

    fleet_check.py FARM_BIN CONFIG WORKDIR
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from farm_client import Fleet, lost_in_restart  # noqa: E402

FARM, CONFIG, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
procs = {}


def serve(name, listen):
    out, run_dir = os.path.join(WORK, name, "out"), os.path.join(WORK, name, "run")
    os.makedirs(run_dir, exist_ok=True)
    p = subprocess.Popen([FARM, "serve", CONFIG, "--out", out, "--listen", listen], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, FARM_RUN_DIR=run_dir))
    log, ready = [], threading.Event()
    url = []

    def read():
        for line in p.stderr:
            log.append(line)
            if "listening on http://" in line and not url:
                url.append(line.split("listening on ")[1].split()[0])
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    ready.wait(600)
    if not url:
        sys.exit(f"farm serve {name} did not start:\n{''.join(log)}")
    procs[name] = (p, log)
    return url[0]


def check(cond, what):
    if not cond:
        logs = "".join(f"--- {n}\n{''.join(log[-30:])}" for n, (_, log) in procs.items())
        sys.exit(f"FAILED: {what}\n{logs}")


def quick(n):
    return {"task_id": "double", "n": n, "policy": {"kind": "replay", "actions": [{"kind": "exec", "command": "echo 42 > out.txt"}]}}


def slow():
    return {"task_id": "double", "n": 1, "policy": {"kind": "replay", "actions": [{"kind": "exec", "command": "sleep 300"}]}}


seen = {}  # rollout_id -> row; a second row for one id is a failure


def pull(fleet, ids, timeout=600):
    deadline = time.time() + timeout
    while not all(i in seen for i in ids):
        check(time.time() < deadline, f"no row for {[i for i in ids if i not in seen]}")
        for row in fleet.results(wait=2):
            rid = row.get("rollout_id")
            check(rid not in seen, f"rollout {rid} delivered twice")
            seen[rid] = row


try:
    a, b = serve("a", "127.0.0.1:0"), serve("b", "127.0.0.1:0")
    fleet = Fleet([a, b])
    check(all(c is not None for c in fleet.capacities().values()), "both endpoints answer /v1/capacity")

    # Groups spread by free capacity: equal services get two groups each.
    groups = fleet.submit([quick(2) for _ in range(4)], key="batch-1")
    per = {url: sum(1 for g in groups if g["endpoint"] == url) for url in (a, b)}
    check(per == {a: 2, b: 2}, f"groups spread over both endpoints: {per}")
    ids = [r for g in groups for r in g["rollout_ids"]]
    again = fleet.submit([quick(2) for _ in range(4)], key="batch-1")
    check(sorted(r for g in again for r in g["rollout_ids"]) == sorted(ids), "a retried submit gets the same rollouts")
    pull(fleet, ids)
    check(all(seen[i]["status"] == "passed" for i in ids), f"all passed: {[seen[i]['status'] for i in ids]}")
    print(f"spread: {per}; {len(ids)} rows, each once")

    # Sessions stay on the endpoint that opened them; the handle carries it.
    s = fleet.open_session("double")
    br = s.branch()
    check(br.endpoint == s.endpoint, "a branch is on its session's endpoint")
    other = fleet.open_session("double")
    check(other.endpoint != s.endpoint, "the next session goes where there is more room")
    other.close()
    again = fleet.session(json.loads(json.dumps(s.handle)))
    again.exec("echo 42 > out.txt")
    br.exec("echo 41 > out.txt")
    check(again.submit()["status"] == "passed", "the session reached through its handle passed")
    check(br.submit()["status"] == "failed", "the branch, with its own files, failed")
    print(f"sessions: on {s.endpoint}, branch too; the next on {other.endpoint}")

    # kill -9 of one endpoint with work admitted; the fleet goes on with the other.
    held = fleet.submit([slow(), slow()], key="slow")
    on = {g["endpoint"]: g["rollout_ids"][0] for g in held}
    check(set(on) == {a, b}, f"one slow rollout on each endpoint: {on}")
    p, _ = procs["b"]
    p.send_signal(signal.SIGKILL)
    p.wait()
    check(fleet.capacities()[b] is None, "a killed endpoint is seen as down")
    during = fleet.submit([quick(1)], key="during")
    check([g["endpoint"] for g in during] == [a], "while b is down, submits go to a")
    fleet.results(wait=0)  # a down endpoint does not stop the pull
    fleet.members[a].call("POST", f"/v1/rollouts/{on[a]}/cancel")

    # b comes back on its port and output folder: the pull resumes from b's cursor.
    serve("b", "127.0.0.1:" + b.rsplit(":", 1)[1])
    later = [r for g in during for r in g["rollout_ids"]]
    pull(fleet, later + list(on.values()))
    check(lost_in_restart(seen[on[b]]), f"b's admitted rollout is reported lost in restart: {seen[on[b]]}")
    check(seen[on[a]]["status"] == "env_error" and "cancelled" in seen[on[a]]["error"], f"{seen[on[a]]}")
    check(all(seen[i]["status"] == "passed" for i in later), "the rollout submitted while b was down passed on a")
    # What was lost is submitted again, and passes.
    redo = fleet.submit([quick(1)], key="redo")
    pull(fleet, [r for g in redo for r in g["rollout_ids"]])
    # Nothing more arrives: every row was delivered once.
    extra = fleet.results(wait=1)
    check(extra == [], f"rows delivered again: {[r.get('rollout_id') for r in extra]}")
    print(f"restart: {len(seen)} rows, each once; cursors {fleet.cursors}")
    print("fleet ok")
finally:
    for name, (p, _) in procs.items():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for name, (p, _) in procs.items():
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
