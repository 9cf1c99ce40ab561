#!/usr/bin/env python3
"""An inspect_ai eval of N samples, on farm's sandbox type and on inspect's `local` sandbox,
alternating for ROUNDS rounds (run by bench/inspect.sh).

    inspect_eval.py FOLDER N ROUNDS

Each sample: a solver that writes a file, runs Python on it and lists the folder (three
sandbox execs), and a scorer that reads the answer back (one more). Samples at once: 8 on
both. The first eval of each, not counted, builds farm's environment and warms the host.
Prints one JSON object: each eval's seconds (p50 over rounds), samples a second, and farm's
over local.
"""

import json
import sys
import time
from pathlib import Path

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import sandbox

FOLDER, N, ROUNDS = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])


@solver
def compute():
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        n = int(state.input_text.split()[-1])
        box = sandbox()
        await box.write_file("program.py", f"print({n} * {n})\n")
        ran = await box.exec(["python3", "program.py"])
        await box.write_file("answer.txt", ran.stdout)
        await box.exec(["ls", "-la"])
        return state

    return solve


@scorer(metrics=[accuracy()])
def answered():
    async def score(state: TaskState, target: Target) -> Score:
        text = await sandbox().read_file("answer.txt")
        return Score(value=CORRECT if text.strip() == target.text else INCORRECT)

    return score


def run(kind: str) -> float:
    samples = [Sample(input=f"square {n}", target=str(n * n), id=f"n{n}") for n in range(N)]
    task = Task(dataset=samples, solver=compute(), scorer=answered(), sandbox=kind, name=f"bench_{kind}")
    usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)

    def model(*_):
        out = ModelOutput.from_content("mockllm/model", "ok")
        out.usage = usage
        return out

    started = time.monotonic()
    (log,) = eval(task, model=get_model("mockllm/model", custom_outputs=model), log_dir=str(FOLDER),
                  display="none", max_sandboxes=8, max_samples=8)
    took = time.monotonic() - started
    assert log.status == "success", log.error
    assert log.results.scores[0].metrics["accuracy"].value == 1.0, log.results
    return took


run("local"), run("farm")
times = {"local": [], "farm": []}
for i in range(ROUNDS):
    for kind in ("local", "farm") if i % 2 == 0 else ("farm", "local"):
        times[kind].append(run(kind))
p50 = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
print(json.dumps({
    "samples": N,
    "rounds": ROUNDS,
    "local_s": [round(t, 2) for t in times["local"]],
    "farm_s": [round(t, 2) for t in times["farm"]],
    "local_samples_per_s": round(N / p50["local"], 2),
    "farm_samples_per_s": round(N / p50["farm"], 2),
    "farm_over_local_p50": round(p50["farm"] / p50["local"], 2),
}))
