#!/usr/bin/env python3
"""E2B's SDK against farm's own SDK on one `farm serve` (run by bench/e2b.sh).

    e2b_sdks.py URL KEY N

Makes an environment of the python image, then N rounds, the clients alternating: a
sandbox made, its first command run, the sandbox killed. E2B's SDK runs every command as
`/bin/bash -l -c CMD` (a login shell, which reads the profile: ~100 ms of guest time under
TCG), so farm's SDK runs that same argv (`farm_same`), and its own shell command as well
(`farm_sh`, `/bin/sh -c`). Prints one JSON object: create-to-first-command p50/p99 of each,
and E2B's over farm's for the same command.
"""

import json
import os
import sys
import time

URL, KEY, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.environ["E2B_API_URL"] = URL
os.environ["E2B_SANDBOX_URL"] = URL
os.environ["E2B_API_KEY"] = "e2b_" + KEY[len("farm_"):]

from e2b import Sandbox  # noqa: E402 (after the settings it reads)
from farm_sdk import Farm  # noqa: E402

farm = Farm(URL, token=KEY)
env = farm.environments.create(image="python")


def e2b_round():
    started = time.monotonic()
    sbx = Sandbox.create(template=env.id)
    assert sbx.commands.run("echo hi").stdout == "hi\n"
    took = time.monotonic() - started
    sbx.kill()
    return took


def farm_round(command):
    started = time.monotonic()
    sb = farm.sandboxes.create(env)
    assert sb.exec(command).stdout == "hi\n"
    took = time.monotonic() - started
    sb.kill()
    return took


def farm_same():
    return farm_round(["/bin/bash", "-l", "-c", "echo hi"])


def farm_sh():
    return farm_round("echo hi")


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


# One of each first, not counted: the environment's first forks warm the host's caches.
e2b_round(), farm_same(), farm_sh()
times = {"e2b": [], "farm_same": [], "farm_sh": []}
for i in range(N):
    order = [("e2b", e2b_round), ("farm_same", farm_same), ("farm_sh", farm_sh)]
    for name, run in order if i % 2 == 0 else reversed(order):
        times[name].append(run())
summary = {
    name: {"p50_ms": round(percentile(t, 50) * 1e3, 1), "p99_ms": round(percentile(t, 99) * 1e3, 1), "n": len(t)}
    for name, t in times.items()
}
summary["e2b_over_farm_same_p50"] = round(summary["e2b"]["p50_ms"] / summary["farm_same"]["p50_ms"], 2)
print(json.dumps(summary))
