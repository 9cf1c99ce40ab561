#!/usr/bin/env python3
"""A training loop's side of `farm serve`, with stock libraries only (requests; pyarrow for
the Arrow stream, when installed). `Farm` talks to one service; `Fleet` makes several (one per
node) one pool.

It submits one group of rollouts per task for an OpenAI-compatible model endpoint, pulls
the scored rows as they finish (long-polling with a cursor, so a reconnect loses nothing),
prints the rewards per group, then drives a live session itself: a command, a branch, a
different command in each branch, and a submit of both.

    farm serve configs/serve.toml &
    python3 examples/farm_client.py --farm http://127.0.0.1:8765 \\
        --model-url http://127.0.0.1:8000/v1 --model my-model --tasks double answer

With several --farm URLs the same steps run on the fleet: groups spread by each service's
free capacity, results pulled from all of them.

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

    def call(self, method, path, body=None, timeout=600, **kwargs):
        r = self.http.request(method, self.url + path, json=body, timeout=timeout, **kwargs)
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


class Down(Exception):
    """An endpoint that cannot be reached now (restarting, or its node is gone)."""


class Fleet:
    """Several `farm serve` endpoints as one pool.

    - `submit` spreads groups (a group never splits) by each endpoint's free capacity from
      `/v1/capacity`; an endpoint that does not answer gets nothing.
    - `results` pulls from every endpoint with a cursor of its own (`self.cursors`, keep it
      to resume after the trainer restarts). An endpoint that is down keeps its cursor, and
      its rows are pulled once it is back: a service restarted on its output folder serves
      every row again from the same cursors, and records what it lost as `env_error` rows
      "lost in restart" (see `lost_in_restart`).
    - Sessions stay where they were opened: a `Session` (and its `handle`) names its endpoint.
    """

    def __init__(self, urls, token=None):
        self.members = {url.rstrip("/"): Farm(url, token) for url in urls}
        if not self.members:
            raise ValueError("a fleet needs at least one endpoint")
        self.cursors = {url: 0 for url in self.members}
        self._plans = {}

    def _capacity(self, url):
        try:
            # A refused connection is seen at once; the time limit is for a service that
            # hangs, with room for one that is merely slow on a loaded machine.
            return self.members[url].call("GET", "/v1/capacity", timeout=60).json()
        except (requests.ConnectionError, requests.Timeout) as e:
            raise Down(url) from e

    def capacities(self):
        """{url: capacity or None when down}."""
        out = {}
        for url in self.members:
            try:
                out[url] = self._capacity(url)
            except Down:
                out[url] = None
        return out

    def submit(self, items, key):
        """Submits each item (a group of n samples) to one endpoint, most free capacity first.
        Returns the groups as `/v1/rollouts` answers them, each with its `endpoint`. A retry
        with the same key reuses the first call's placement, so every endpoint sees its own
        idempotency key again and nothing runs twice."""
        plan = self._plans.get(key)
        if plan is None:
            free = {}
            for url, cap in self.capacities().items():
                if cap is not None:
                    free[url] = cap["slots"] + cap["queue_limit"] - cap["in_flight"] - cap["queued"]
            if not free:
                raise Down("no endpoint of the fleet answers")
            plan = {}
            for i, item in enumerate(items):
                url = max(free, key=lambda u: free[u])  # ties: the first listed
                free[url] -= item.get("n", 1)
                plan.setdefault(url, []).append(i)
            self._plans[key] = plan
        groups = []
        for url, indices in plan.items():
            answer = self.members[url].submit([items[i] for i in indices], key=f"{key}@{url}")
            for g in answer["groups"]:
                groups.append(dict(g, endpoint=url))
        return groups

    def results(self, wait=10.0, max_rows=100):
        """New rows from every endpoint that answers, each with its `endpoint`. Waits up to
        `wait` seconds in all when there is nothing new."""
        rows = []
        per = max(0.0, wait / len(self.members))
        for url, farm in self.members.items():
            try:
                got, nxt = farm.results(self.cursors[url], wait=0.0 if rows else per, max_rows=max_rows)
            except (requests.ConnectionError, requests.Timeout):
                continue
            except RuntimeError:
                continue  # a 5xx while it starts: try again next time
            self.cursors[url] = nxt
            rows.extend(dict(r, endpoint=url) for r in got)
        return rows

    def open_session(self, task_id, **fields):
        """A live session on the endpoint with the most free session room."""
        room = {}
        for url, cap in self.capacities().items():
            if cap is not None:
                room[url] = cap["max_sessions"] - cap["sessions"]
        if not room:
            raise Down("no endpoint of the fleet answers")
        url = max(room, key=lambda u: room[u])
        s = self.members[url].call("POST", "/v1/sessions", dict(fields, task_id=task_id)).json()
        return Session(self.members[url], url, s["session_id"], s)

    def session(self, handle):
        """The session a `Session.handle` names."""
        url = handle["endpoint"].rstrip("/")
        if url not in self.members:
            raise ValueError(f"{url} is not an endpoint of this fleet")
        return Session(self.members[url], url, handle["session_id"], {})


def lost_in_restart(row):
    """A rollout its endpoint lost when it restarted: submit it again to get a verdict."""
    return row.get("status") == "env_error" and "lost in restart" in (row.get("error") or "")


class Session:
    """A live session on one endpoint of a fleet. `handle` ({"endpoint", "session_id"}) can be
    stored and turned back into a Session with `Fleet.session`."""

    def __init__(self, farm, endpoint, session_id, opened):
        self.farm, self.endpoint, self.id, self.opened = farm, endpoint, session_id, opened

    @property
    def handle(self):
        return {"endpoint": self.endpoint, "session_id": self.id}

    def _post(self, what, body=None):
        return self.farm.call("POST", f"/v1/sessions/{self.id}/{what}", body if body is not None else {}).json()

    def exec(self, command, **fields):
        return self._post("exec", dict(fields, command=command))

    def write_file(self, path, content, **fields):
        return self._post("write_file", dict(fields, path=path, content=content))

    def branch(self):
        """A branch, on the same endpoint (it forks this session's VM there)."""
        b = self._post("branch")
        return Session(self.farm, self.endpoint, b["session_id"], b)

    def submit(self, answer=None):
        return self._post("submit", {} if answer is None else {"answer": answer})

    def close(self):
        self.farm.call("DELETE", f"/v1/sessions/{self.id}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--farm", nargs="+", default=["http://127.0.0.1:8765"], help="one endpoint, or several: a fleet")
    p.add_argument("--model-url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", default="test-model")
    p.add_argument("--tasks", nargs="+", default=["double", "answer"])
    p.add_argument("--n", type=int, default=2, help="samples per group")
    p.add_argument("--session-task", default="double")
    args = p.parse_args()
    fleet = Fleet(args.farm, os.environ.get("FARM_SERVE_TOKEN"))

    for url, cap in fleet.capacities().items():
        print(f"capacity of {url}:", cap)

    # 1. Submit a group per task, for policy version 1, spread over the fleet.
    policy = {"kind": "openai", "base_url": args.model_url, "model": args.model, "temperature": 1.0, "logprobs": True}
    items = [{"task_id": t, "n": args.n, "seed": 7, "policy": policy, "policy_version": 1} for t in args.tasks]
    groups = fleet.submit(items, key=f"example-{os.getpid()}-{time.time()}")
    wanted = {rid: g["group_id"] for g in groups for rid in g["rollout_ids"]}
    print(f"submitted {len(wanted)} rollouts in {len(groups)} groups to {len({g['endpoint'] for g in groups})} endpoint(s)")

    # 2. Pull rows until every submitted rollout has one. Rows of other trainers' work (or
    # of earlier runs) come too: keep what is ours.
    rewards = {}
    deadline = time.time() + 900
    while len([r for r in wanted if r in rewards]) < len(wanted):
        if time.time() > deadline:
            sys.exit("timed out waiting for results")
        for row in fleet.results(wait=30):
            if row.get("rollout_id") in wanted:
                rewards[row["rollout_id"]] = (row["status"], row["reward"])
    for g in groups:
        got = [rewards[r] for r in g["rollout_ids"]]
        shown = ", ".join(f"{s}:{'null' if r is None else r}" for s, r in got)
        print(f"group {g['group_id']} task {g['task_id']}: {shown}")

    # 3. The same rows in bulk, as Arrow (the Parquet schema), when pyarrow is installed.
    try:
        first = next(iter(fleet.members.values()))
        table = first.results_arrow(0)
        print(f"arrow: {table.num_rows} rows, columns include {', '.join(table.column_names[:4])}, ...")
    except ImportError:
        print("arrow: pyarrow not installed, skipped")

    # 4. A live session, stepped by this script, with a branch (on the session's endpoint).
    s = fleet.open_session(args.session_task, seed=3)
    obs = s.exec("cat n.txt")
    print("session", s.id, "sees n.txt =", obs["step"]["stdout"].strip())
    b = s.branch()
    s.exec("echo 41 > out.txt")
    b.exec("echo $(( $(cat n.txt) * 2 )) > out.txt")
    for name, session in (("original", s), ("branch", b)):
        seen = session.exec("cat out.txt")["step"]["stdout"].strip()
        verdict = session.submit()
        print(f"session {name}: out.txt = {seen}, {verdict['status']} reward {verdict['reward']}")


if __name__ == "__main__":
    main()
