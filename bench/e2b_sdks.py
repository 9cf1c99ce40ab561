#!/usr/bin/env python3
"""E2B's SDKs against farm's own SDK on one `farm serve` (run by bench/e2b.sh).

    e2b_sdks.py URL KEY N

Part one, create to first command: an environment of the python image, then N rounds, the
clients alternating: a sandbox made, its first command run, the sandbox killed. E2B's SDK
runs every command as `/bin/bash -l -c CMD` (a login shell, which reads the profile: ~100 ms
of guest time under TCG), so farm's SDK runs that same argv (`farm_same`), and its own shell
command as well (`farm_sh`, `/bin/sh -c`).

Part two, the code interpreter (E2B's template code-interpreter-v1, whose kernel is warm in
its snapshot): create to the first `run_code` against farm's SDK making a sandbox of the
same environment and running `python3 -c` in it (what a client with no interpreter does),
then N round trips of each in one sandbox: `run_code("x + 1")` in the kernel, and
`python3 -c` through farm's exec.

Prints one JSON object: p50/p99 of each, and the ratios.
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
from e2b_code_interpreter import Sandbox as CodeSandbox  # noqa: E402
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


def timed(call):
    started = time.monotonic()
    call()
    return time.monotonic() - started


def rounds(order, n):
    """One of each first, not counted (the first forks warm the host's caches), then n
    rounds, the order reversed every other round."""
    for _, run in order:
        run()
    times = {name: [] for name, _ in order}
    for i in range(n):
        for name, run in order if i % 2 == 0 else list(reversed(order)):
            times[name].append(run())
    return times


times = rounds([("e2b", e2b_round), ("farm_same", farm_same), ("farm_sh", farm_sh)], N)

# Part two: the code interpreter. The environment E2B's template names, made once.
CodeSandbox.create(timeout=600).kill()
interpreter = farm.environments.create(image="code-interpreter", setup=["farm-interpreter start"])


def e2b_first_run_code():
    started = time.monotonic()
    sbx = CodeSandbox.create()
    assert sbx.run_code("6 * 7").text == "42"
    took = time.monotonic() - started
    sbx.kill()
    return took


def farm_first_python():
    started = time.monotonic()
    sb = farm.sandboxes.create(interpreter)
    assert sb.exec(["python3", "-c", "print(6 * 7)"]).stdout == "42\n"
    took = time.monotonic() - started
    sb.kill()
    return took


times.update(rounds([("e2b_create_run_code", e2b_first_run_code), ("farm_create_python", farm_first_python)], N))
kernel = CodeSandbox.create(timeout=600)
kernel.run_code("x = 41")
sb = farm.sandboxes.create(interpreter)


def run_code():
    return timed(lambda: kernel.run_code("x + 1"))


def exec_python():
    return timed(lambda: sb.exec(["python3", "-c", "print(41 + 1)"]))


times.update(rounds([("e2b_run_code", run_code), ("farm_exec_python", exec_python)], N))
kernel.kill()
sb.kill()

summary = {
    name: {"p50_ms": round(percentile(t, 50) * 1e3, 1), "p99_ms": round(percentile(t, 99) * 1e3, 1), "n": len(t)}
    for name, t in times.items()
}


def ratio(a, b):
    return round(summary[a]["p50_ms"] / summary[b]["p50_ms"], 2)


summary["e2b_over_farm_same_p50"] = ratio("e2b", "farm_same")
summary["e2b_create_run_code_over_farm_create_python_p50"] = ratio("e2b_create_run_code", "farm_create_python")
summary["e2b_run_code_over_farm_exec_python_p50"] = ratio("e2b_run_code", "farm_exec_python")
print(json.dumps(summary))
