"""A GRPO-style loop on farm through OpenEnv: for each group, one prepared state (a session
reset on a task and stepped once), then N sessions branched from it, each driven by a policy,
submitted and scored by farm where the policy cannot reach; the group's rewards give each
member its advantage (reward minus the group's mean, over the group's standard deviation).

No model is needed: the policy here is scripted (it picks one of a few candidate commands by
the member's index), standing in for N samples of a model. Swap `scripted_policy` for your
model's sampling to train on it.

    farm serve configs/serve.toml --listen 127.0.0.1:8080 &
    ~/.cache/farm/openenv-venv/bin/python examples/grpo_openenv.py --url http://127.0.0.1:8080

It needs OpenEnv's client (`pip install openenv`; scripts/setup.sh makes
~/.cache/farm/openenv-venv). The token comes from FARM_SERVE_TOKEN when the service has one.
The last line printed is JSON: every group's rewards and advantages.
"""

import argparse
import json
import os
import statistics
import sys
import threading

from openenv.core import GenericEnvClient

# What a model might answer to "double the number in n.txt into out.txt": some right, some not.
CANDIDATES = [
    "echo $(( $(cat n.txt) * 2 )) > out.txt",
    "cat n.txt > out.txt",
    "echo $(( $(cat n.txt) + 2 )) > out.txt",
    "printf '%s\\n' $(( $(cat n.txt) + $(cat n.txt) )) > out.txt",
]


def scripted_policy(member, observation):
    """One sample's actions, given what the prepared state showed (the number)."""
    del observation  # a model would read it
    return [{"kind": "exec", "command": CANDIDATES[member % len(CANDIDATES)]}, {"kind": "submit"}]


def connect(url, token):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return GenericEnvClient(base_url=url.rstrip("/") + "/v1/openenv", headers=headers, message_timeout_s=600).sync()


def run_group(url, token, task, group, size):
    # The prepared state: every member starts from it exactly (the same VM state, forked).
    with connect(url, token) as root:
        root.reset(task_id=task, seed=group)
        shown = root.step({"kind": "exec", "command": "cat n.txt"}).observation
        parent = root.state()["session_id"]
        rewards = [None] * size
        failures = []

        def member(i):
            try:
                with connect(url, token) as env:
                    env.reset(branch_of=parent)
                    result = None
                    for action in scripted_policy(i, shown):
                        result = env.step(action)
                        if result.done:
                            break
                    # No reward (an env_error, a policy that never submitted): the sample is
                    # left out of the group, never counted as a failure.
                    rewards[i] = float(result.reward) if result and result.done and result.reward is not None else None
            except Exception as e:  # noqa: BLE001 - one member's failure is reported, not fatal
                failures.append(f"member {i}: {e}")

        threads = [threading.Thread(target=member, args=(i,)) for i in range(size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    # Leaving `root` ends the prepared session (it is never submitted: no row).
    scored = [r for r in rewards if r is not None]
    mean = statistics.fmean(scored) if scored else 0.0
    spread = statistics.pstdev(scored) if len(scored) > 1 else 0.0
    advantages = [None if r is None else round((r - mean) / (spread + 1e-6), 4) for r in rewards]
    return {"group": group, "rewards": rewards, "mean": mean, "advantages": advantages, "failures": failures}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("FARM_URL", "http://127.0.0.1:8080"))
    p.add_argument("--task", default="double", help="a task id of the served suite")
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    args = p.parse_args()
    token = os.environ.get("FARM_SERVE_TOKEN")
    out = []
    for g in range(args.groups):
        result = run_group(args.url, token, args.task, g, args.group_size)
        print(
            f"group {g}: rewards {result['rewards']} mean {result['mean']:.2f} "
            f"advantages {result['advantages']}",
            file=sys.stderr,
        )
        for f in result["failures"]:
            print(f"  {f}", file=sys.stderr)
        out.append(result)
    print(json.dumps({"groups": out}))
    return 1 if any(r["failures"] for r in out) else 0


if __name__ == "__main__":
    sys.exit(main())
