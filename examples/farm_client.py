#!/usr/bin/env python3
"""A training loop's side of `farm serve`, with stock libraries only (requests; pyarrow for
the Arrow stream, when installed).

It submits one group of rollouts per task for an OpenAI-compatible model endpoint, pulls
the scored rows as they finish (long-polling with a cursor, so a reconnect loses nothing),
prints the rewards per group, then drives a live session itself: a command, a branch, a
different command in each branch, and a submit of both.

    farm serve configs/serve.toml &
    python3 examples/farm_client.py --farm http://127.0.0.1:8765 \\
        --model-url http://127.0.0.1:8000/v1 --model my-model --tasks double answer

With FARM_SERVE_TOKEN set, it is sent as the bearer token.
"""

import argparse
import json
import os
import sys
import time

import requests


class Farm:
    def __init__(self, url, token=None):
        self.url = url.rstrip("/")
        self.http = requests.Session()
        if token:
            self.http.headers["Authorization"] = f"Bearer {token}"

    def call(self, method, path, body=None, **kwargs):
        r = self.http.request(method, self.url + path, json=body, timeout=600, **kwargs)
        if r.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text}")
        return r

    def submit(self, items, key):
        # A retried submit with the same key gets the same rollouts, never twice as many.
        return self.call("POST", "/v1/rollouts", {"items": items}, headers={"Idempotency-Key": key}).json()

    def results(self, cursor, wait=30.0, max_rows=100):
        r = self.call("GET", "/v1/results", params={"cursor": cursor, "max": max_rows, "wait": wait})
        rows = [json.loads(line) for line in r.text.splitlines() if line]
        return rows, int(r.headers["farm-next-cursor"])

    def results_arrow(self, cursor, max_rows=1000):
        import pyarrow.ipc

        r = self.call("GET", "/v1/results", params={"cursor": cursor, "max": max_rows},
                      headers={"Accept": "application/vnd.apache.arrow.stream"})
        return pyarrow.ipc.open_stream(r.content).read_all()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--farm", default="http://127.0.0.1:8765")
    p.add_argument("--model-url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", default="test-model")
    p.add_argument("--tasks", nargs="+", default=["double", "answer"])
    p.add_argument("--n", type=int, default=2, help="samples per group")
    p.add_argument("--session-task", default="double")
    args = p.parse_args()
    farm = Farm(args.farm, os.environ.get("FARM_SERVE_TOKEN"))

    print("capacity:", farm.call("GET", "/v1/capacity").json())

    # 1. Submit a group per task, for policy version 1.
    policy = {"kind": "openai", "base_url": args.model_url, "model": args.model, "temperature": 1.0, "logprobs": True}
    items = [{"task_id": t, "n": args.n, "seed": 7, "policy": policy, "policy_version": 1} for t in args.tasks]
    submitted = farm.submit(items, key=f"example-{os.getpid()}-{time.time()}")
    wanted = {rid: g["group_id"] for g in submitted["groups"] for rid in g["rollout_ids"]}
    print(f"submitted {len(wanted)} rollouts in {len(submitted['groups'])} groups")

    # 2. Pull rows until every submitted rollout has one. Rows of other trainers' work (or
    # of earlier runs) come too: keep what is ours.
    cursor, rewards = 0, {}
    deadline = time.time() + 900
    while len([r for r in wanted if r in rewards]) < len(wanted):
        if time.time() > deadline:
            sys.exit("timed out waiting for results")
        rows, cursor = farm.results(cursor)
        for row in rows:
            if row.get("rollout_id") in wanted:
                rewards[row["rollout_id"]] = (row["status"], row["reward"])
    for g in submitted["groups"]:
        got = [rewards[r] for r in g["rollout_ids"]]
        shown = ", ".join(f"{s}:{'null' if r is None else r}" for s, r in got)
        print(f"group {g['group_id']} task {g['task_id']}: {shown}")

    # 3. The same rows in bulk, as Arrow (the Parquet schema), when pyarrow is installed.
    try:
        table = farm.results_arrow(0)
        print(f"arrow: {table.num_rows} rows, columns include {', '.join(table.column_names[:4])}, ...")
    except ImportError:
        print("arrow: pyarrow not installed, skipped")

    # 4. A live session, stepped by this script, with a branch.
    s = farm.call("POST", "/v1/sessions", {"task_id": args.session_task, "seed": 3}).json()
    sid = s["session_id"]
    obs = farm.call("POST", f"/v1/sessions/{sid}/exec", {"command": "cat n.txt"}).json()
    print("session", sid, "sees n.txt =", obs["step"]["stdout"].strip())
    b = farm.call("POST", f"/v1/sessions/{sid}/branch").json()
    bid = b["session_id"]
    farm.call("POST", f"/v1/sessions/{sid}/exec", {"command": "echo 41 > out.txt"})
    farm.call("POST", f"/v1/sessions/{bid}/exec", {"command": "echo $(( $(cat n.txt) * 2 )) > out.txt"})
    for name, session in (("original", sid), ("branch", bid)):
        seen = farm.call("POST", f"/v1/sessions/{session}/exec", {"command": "cat out.txt"}).json()["step"]["stdout"].strip()
        verdict = farm.call("POST", f"/v1/sessions/{session}/submit", {}).json()
        print(f"session {name}: out.txt = {seen}, {verdict['status']} reward {verdict['reward']}")


if __name__ == "__main__":
    main()
