"""A real inspect_ai eval on farm (`farm/tests/inspect.rs` runs it in the inspect venv, the
SDK installed with its entry points): a task of our own that says `sandbox=("farm",
"compose.yaml")` as it would say `("docker", "compose.yaml")`, three samples, inspect's own
mock model calling inspect's own `bash` tool, a scorer that runs a command in the sandbox.
Then the same task left with `sandbox_cleanup=False`, and `inspect sandbox cleanup farm`
removing what it left. Prints one JSON line of what it saw.

    python inspect_eval_check.py FOLDER      (FOLDER: where the task's files are written)
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import Generate, TaskState, generate, solver, use_tools
from inspect_ai.tool import bash
from inspect_ai.util import sandbox

from farm_sdk import Farm

FOLDER = Path(sys.argv[1])
FOLDER.mkdir(parents=True, exist_ok=True)
# A Docker task's files, unchanged: a Dockerfile and a one-service compose file.
(FOLDER / "Dockerfile").write_text("FROM farm:python\nRUN echo built-by-the-dockerfile > /built.txt\nWORKDIR /task\n")
(FOLDER / "compose.yaml").write_text(
    "services:\n  default:\n    build: .\n    command: tail -f /dev/null\n    working_dir: /task\n"
    "    environment:\n      - GREETING=hello\n    network_mode: none\n"
)


@scorer(metrics=[accuracy()])
def answer_in_sandbox():
    async def score(state: TaskState, target: Target) -> Score:
        answer = await sandbox().exec(["cat", "answer.txt"])
        built = await sandbox().exec(["cat", "/built.txt"])
        right = answer.success and answer.stdout.strip() == target.text and built.stdout == "built-by-the-dockerfile\n"
        return Score(value=CORRECT if right else INCORRECT, answer=answer.stdout.strip())

    return score


def model_turn(input, tools, tool_choice, config):
    """inspect's mock model: a `bash` call that writes the square of the sample's number (and
    the greeting the compose file sets), then, after the tool's answer, a last word."""
    usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    if any(message.role == "tool" for message in input):
        output = ModelOutput.from_content("mockllm/model", "done")
    else:
        n = int(str(input[-1].content).split()[-1])
        command = f'echo $(({n} * {n})) > answer.txt && echo "$GREETING from $(pwd)"'
        output = ModelOutput.for_tool_call("mockllm/model", "bash", {"command": command})
    output.usage = usage
    return output


@solver
def remote_probe():
    """inspect's `exec_remote` (its tools binary pushed through exec's stdin, its server left
    running in the sandbox), its answer kept in the sample's store."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        result = await sandbox().exec_remote(["sh", "-c", "echo remote; echo err >&2; exit 3"], stream=False)
        state.store.set("remote", [result.returncode, result.stdout, result.stderr])
        return state

    return solve


def squares_task(remote=False):
    samples = [Sample(input=f"square {n}", target=str(n * n if n != 4 else 17), id=f"n{n}") for n in (2, 3, 4)]
    return Task(
        dataset=samples[:1] if remote else samples,
        solver=[*([remote_probe()] if remote else []), use_tools(bash()), generate()],
        scorer=answer_in_sandbox(),
        sandbox=("farm", str(FOLDER / "compose.yaml")),
        name="squares",
    )


logs = eval(squares_task(), model=get_model("mockllm/model", custom_outputs=model_turn),
            log_dir=str(FOLDER / "logs"), display="none")
(log,) = logs
assert log.status == "success", log.error
assert log.eval.sandbox.type == "farm", log.eval.sandbox
scores = {s.id: s.scores["answer_in_sandbox"].value for s in log.samples}
assert scores == {"n2": CORRECT, "n3": CORRECT, "n4": INCORRECT}, scores  # n4's target is wrong on purpose
tool_outputs = [m.content for s in log.samples for m in s.messages if m.role == "tool"]
assert all("hello from /task" in str(t) for t in tool_outputs), tool_outputs
execs = [e for s in log.samples for e in s.events if e.event == "sandbox" and e.action == "exec"]
assert execs, "the log shows the samples' commands in their sandboxes"
with Farm() as farm:
    left = farm.sandboxes.list(metadata={"inspect_ai": "1"})
assert left == [], f"the eval left sandboxes: {left}"

# exec_remote, and --no-sandbox-cleanup: the sandbox stays, and `inspect sandbox cleanup farm`
# removes it.
(kept_log,) = eval(squares_task(remote=True), model=get_model("mockllm/model", custom_outputs=model_turn),
                   log_dir=str(FOLDER / "logs"), display="none", sandbox_cleanup=False)
assert kept_log.status == "success", kept_log.error
assert kept_log.samples[0].store["remote"] == [3, "remote\n", "err\n"], kept_log.samples[0].store
with Farm() as farm:
    kept = farm.sandboxes.list(metadata={"inspect_ai": "1"})
assert len(kept) == 1, kept
inspect_cli = os.path.join(os.path.dirname(sys.executable), "inspect")
cleaned = subprocess.run([inspect_cli, "sandbox", "cleanup", "farm"], capture_output=True, text=True, timeout=300)
assert cleaned.returncode == 0, cleaned.stderr
with Farm() as farm:
    assert farm.sandboxes.list(metadata={"inspect_ai": "1"}) == [], "cleanup left a sandbox"
print(json.dumps({"scores": scores, "execs": len(execs), "kept_then_cleaned": kept[0].id}))
