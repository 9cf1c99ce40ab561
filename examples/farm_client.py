#!/usr/bin/env python3
"""A training loop's side of `farm serve`, on the Python SDK's fleet API.

It uses `farm_sdk.fleet` (clients/python; pyarrow for the Arrow stream, when installed):
`Service` talks to one service; `Fleet` makes several (one per node) one pool.

It submits one group of rollouts per task for an OpenAI-compatible model endpoint, pulls
the scored rows as they finish (long-polling with a cursor, so a reconnect loses nothing),
prints the rewards per group, then drives a live session itself: a command, a branch, a
different command in each branch, and a submit of both.

    pip install ./clients/python        # or run from the checkout: clients/python is found
    farm serve configs/serve.toml &
    python3 examples/farm_client.py --farm http://127.0.0.1:8765 \\
        --model-url http://127.0.0.1:8000/v1 --model my-model --tasks double answer

With several --farm URLs the same steps run on the fleet: groups spread by each service's
free capacity, results pulled from all of them.

With FARM_SERVE_TOKEN set, it is sent as the bearer token.
"""

import argparse
import importlib.util
import os
import sys
import time

if importlib.util.find_spec("farm_sdk") is None:
    # Not installed: use the SDK of this checkout.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))

from farm_sdk.fleet import Down, Fleet, Service, Session, lost_in_restart  # noqa: E402

__all__ = ["Down", "Fleet", "Service", "Session", "lost_in_restart", "main"]


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
