"""farm_sdk's framework backends and its hosting faces against a real `farm serve`:
`farm/tests/frameworks.rs` runs each part in the agents venv of `scripts/setup.sh` (SWE-ReX,
mini-swe-agent and websockets from PyPI), with this checkout's SDK on PYTHONPATH.

    python frameworks_check.py swerex|minisweagent|sdk URL ENVIRONMENT

ENVIRONMENT is a ready environment whose image has SWE-ReX installed and Python 3. Each part
removes every sandbox it makes, and prints `PART: ok` last.
"""

import asyncio
import gc
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from farm_sdk import AsyncFarm, Farm, NotFound, WaitTimeout

#: Seconds a guest under TCG, beside other tests' guests, may take to show what is expected:
#: a deadline, not a timing claim.
PATIENCE = 300


def swerex(url, env):
    from farm_sdk.swerex import FarmDeployment
    from swerex.exceptions import DeploymentNotStartedError

    async def main():
        deployment = FarmDeployment(environment=env, url=url, sandbox_options={"metadata": {"check": "swerex"}})
        await deployment.start()
        try:
            assert (await deployment.is_alive()).is_alive
            await _rex_session_and_commands(deployment.runtime)
            await _rex_files(deployment.runtime, deployment.sandbox)
            log = await deployment.server.output("stderr")
            assert "POST /run_in_session" in log.data or "Uvicorn running" in log.data, log.data[-2000:]
            made = deployment.sandbox.id
        finally:
            await deployment.stop()
        try:
            deployment.runtime
        except DeploymentNotStartedError:
            pass
        else:
            raise AssertionError("a stopped deployment still has a runtime")
        async with AsyncFarm(url) as farm:
            try:
                await farm.sandboxes.get(made)
            except NotFound:
                return made
            raise AssertionError(f"sandbox {made} outlived the deployment's stop")

    made = asyncio.run(main())
    print(f"swe-rex ran in sandbox {made}, removed at stop")


async def _rex_session_and_commands(runtime):
    from swerex.runtime.abstract import BashAction, CloseBashSessionRequest, Command, CreateBashSessionRequest

    await runtime.create_session(CreateBashSessionRequest(startup_timeout=PATIENCE))
    # A session is one shell: a variable and a folder carry from command to command.
    for command in ("export GREETING=hello-rex", "mkdir -p /tmp/rex && cd /tmp/rex"):
        observed = await runtime.run_in_session(BashAction(command=command, timeout=PATIENCE))
        assert observed.exit_code == 0, observed
    read_back = BashAction(command='echo "$GREETING in $(pwd)"', timeout=PATIENCE)
    observed = await runtime.run_in_session(read_back)
    assert observed.output.strip() == "hello-rex in /tmp/rex", observed
    missing = BashAction(command="ls /nowhere", check="silent", timeout=PATIENCE)
    failed = await runtime.run_in_session(missing)
    assert failed.exit_code == 2 and "No such file" in failed.output, failed
    # A one-off command runs apart from the session.
    alone = await runtime.execute(Command(command="echo ${GREETING:-unset} $(pwd)", shell=True, cwd="/"))
    assert alone.stdout.strip() == "unset /", alone
    version = "import sys; print(sys.version_info[:2]); sys.exit(3)"
    argv = await runtime.execute(Command(command=["python3", "-c", version]))
    assert argv.exit_code == 3 and argv.stdout.strip() == "(3, 11)", argv
    await runtime.close_session(CloseBashSessionRequest())


async def _rex_files(runtime, sandbox):
    """Files written, read and uploaded by the runtime; the sandbox sees them."""
    from swerex.runtime.abstract import BashAction, CreateBashSessionRequest, ReadFileRequest, UploadRequest
    from swerex.runtime.abstract import WriteFileRequest

    await runtime.write_file(WriteFileRequest(path="/tmp/rex/note.txt", content="written by swe-rex\n"))
    read = await runtime.read_file(ReadFileRequest(path="/tmp/rex/note.txt"))
    assert read.content == "written by swe-rex\n", read
    assert await sandbox.files.read("/tmp/rex/note.txt") == b"written by swe-rex\n"
    with tempfile.TemporaryDirectory() as local:
        (Path(local) / "pkg").mkdir()
        (Path(local) / "pkg" / "mod.py").write_text("VALUE = 42\n")
        await runtime.upload(UploadRequest(source_path=local, target_path="/tmp/rex/up"))
    await runtime.create_session(CreateBashSessionRequest(session="files", startup_timeout=PATIENCE))
    uploaded = "cd /tmp/rex/up && python3 -c 'from pkg.mod import VALUE; print(VALUE)'"
    observed = await runtime.run_in_session(BashAction(command=uploaded, session="files", timeout=PATIENCE))
    assert observed.output.strip() == "42", observed


def minisweagent(url, env):
    import yaml
    from farm_sdk.minisweagent import FarmEnvironment
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import get_config_path
    from minisweagent.models.test_models import DeterministicModel, make_output

    def step(thought, command):
        return make_output(f"THOUGHT: {thought}\n\n```mswea_bash_command\n{command}\n```", [{"command": command}])

    model = DeterministicModel(
        outputs=[
            step("Write the answer.",
                 "mkdir -p answer && printf 'the answer is %s\\n' $((6 * 7)) > answer/out.txt && cat answer/out.txt"),
            step("Check it, and where I am.",
                 'test "$(cat answer/out.txt)" = "the answer is 42" && echo verified in $(pwd) as $FARM_CHECK; '
                 "echo to-stderr >&2"),
            step("Submit.", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat answer/out.txt"),
        ]
    )
    agent_config = yaml.safe_load(get_config_path("default").read_text())["agent"]
    with FarmEnvironment(environment=env, url=url, cwd="/work", env={"FARM_CHECK": "farm"}, timeout=PATIENCE,
                         sandbox_options={"metadata": {"check": "minisweagent"}}) as environment:
        sandbox = environment.sandbox
        sandbox.exec(["mkdir", "-p", "/work"])
        agent = DefaultAgent(model, environment, **dict(agent_config, step_limit=10, cost_limit=0))
        result = agent.run("Write the answer to /work/answer/out.txt, then submit it.")
        assert result["exit_status"] == "Submitted", result
        assert result["submission"] == "the answer is 42\n", result
        assert sandbox.files.read("/work/answer/out.txt") == b"the answer is 42\n"
        observations = [m["content"] for m in agent.messages if m.get("role") == "user"][1:]
        assert "<returncode>0</returncode>" in observations[1], observations
        assert "verified in /work as farm\nto-stderr\n" in observations[1], observations
        # The task's prompt names the sandbox's kernel, not the host's.
        release = sandbox.exec(["uname", "-r"]).stdout.strip()
        assert release in agent.messages[1]["content"], agent.messages[1]["content"][-800:]
        # An action past its time is killed and says so; a failing one gives its code.
        late = environment.execute({"command": "sleep 600"}, timeout=3)
        assert late["returncode"] == -1 and "timed out after 3 seconds" in late["exception_info"], late
        failing = environment.execute({"command": "exit 5"})
        assert failing["returncode"] == 5 and failing["exception_info"] == "", failing
        assert environment.serialize()["info"]["farm"]["sandbox"] == sandbox.id
        made = sandbox.id
    with Farm(url) as farm:
        try:
            farm.sandboxes.get(made)
            raise AssertionError(f"sandbox {made} outlived cleanup()")
        except NotFound:
            print(f"mini-swe-agent submitted in sandbox {made}, removed at cleanup")
    # Whoever forgets cleanup(): a FarmEnvironment dropped, and a program that ends holding
    # one (as `mini` does), leave no sandbox.
    dropped = FarmEnvironment(environment=env, url=url, sandbox_options={"metadata": {"check": "dropped"}})
    dropped_id = dropped.sandbox.id
    del dropped
    gc.collect()
    program = (
        "import sys; from farm_sdk.minisweagent import FarmEnvironment; "
        "env = FarmEnvironment(environment=sys.argv[1], url=sys.argv[2]); print(env.sandbox.id)"
    )
    ended = subprocess.run([sys.executable, "-c", program, env, url], capture_output=True, text=True, timeout=PATIENCE)
    assert ended.returncode == 0, ended.stderr
    exited_id = ended.stdout.strip().splitlines()[-1].strip()  # after the logger's lines
    with Farm(url) as farm:
        for forgotten in (dropped_id, exited_id):
            try:
                farm.sandboxes.get(forgotten)
                raise AssertionError(f"sandbox {forgotten} outlived the FarmEnvironment that made it")
            except NotFound:
                pass
    print("FarmEnvironments dropped or left at exit removed their sandboxes")


def swebench(url, env):
    """`mini-extra swebench` as it ships, each instance in a farm sandbox of its own image:
    mini-swe-agent's Docker environment with `farm-docker` as its docker. Two images of our
    own (Dockerfiles), three instances, two workers, a scripted model."""
    import json
    import os

    work = Path(tempfile.mkdtemp(prefix="farm-swebench-"))
    for name in ("a", "b"):
        (work / name).mkdir()
        (work / name / "Dockerfile").write_text(
            "FROM farm:python\n"
            "RUN mkdir -p /testbed && cd /testbed && git init -q && printf 'image-%s\\n' > f.txt \\\n"
            " && git add f.txt && git -c user.email=t@farm -c user.name=t commit -qm init\n" % name
        )
    images = {"farm__tiny-1": "a", "farm__tiny-2": "b", "farm__tiny-3": "a"}
    (work / "ds").mkdir()
    with open(work / "ds" / "test.jsonl", "w") as f:
        for iid, image in images.items():
            row = {"instance_id": iid, "problem_statement": f"Append a line to f.txt ({iid}).",
                   "image_name": f"dockerfile:{work / image}"}
            f.write(json.dumps(row) + "\n")
    docker = work / "farm-docker"
    docker.write_text(f"#!/bin/sh\nexec {sys.executable} -m farm_sdk.docker_cli \"$@\"\n")
    docker.chmod(0o755)

    def step(command):
        return {"role": "assistant", "content": f"THOUGHT: go\n\n```mswea_bash_command\n{command}\n```",
                "extra": {"actions": [{"command": command}], "cost": 0.0}}

    config = {
        "agent": {"system_template": "You are a scripted agent.", "instance_template": "{{task}}",
                  "step_limit": 5, "cost_limit": 0},
        "environment": {"environment_class": "docker", "executable": str(docker), "cwd": "/testbed",
                        "timeout": PATIENCE, "pull_timeout": 1800, "interpreter": ["bash", "-c"],
                        "env": {"PAGER": "cat", "GIT_PAGER": "cat"}},
        "model": {"model_class": "deterministic", "model_name": "deterministic",
                  "outputs": [step("echo edited >> f.txt && cat f.txt"),
                              step("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff")]},
    }
    (work / "config.yaml").write_text(json.dumps(config))
    out = work / "out"
    mini_extra = os.path.join(os.path.dirname(sys.executable), "mini-extra")
    environ = dict(os.environ, FARM_URL=url, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(work / "hf"))
    ran = subprocess.run(
        [mini_extra, "swebench", "--subset", str(work / "ds"), "--split", "test", "-w", "2",
         "-o", str(out), "-c", str(work / "config.yaml")],
        capture_output=True, text=True, timeout=3 * PATIENCE, env=environ,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    preds = json.loads((out / "preds.json").read_text())
    assert sorted(preds) == sorted(images), (preds, ran.stderr[-3000:])
    for iid, image in images.items():
        patch = preds[iid]["model_patch"]
        # The patch's context line is the instance's own image's.
        assert patch.startswith("diff --git a/f.txt b/f.txt") and f" image-{image}\n+edited\n" in patch, (iid, patch)
    # Each instance's sandbox is removed when its environment is dropped (mini-swe-agent's
    # Docker environment stops its container then, in the background).
    with Farm(url) as farm:
        deadline = time.time() + PATIENCE  # a deadline for the background stops, not a timing claim
        while True:
            left = [s for s in farm.sandboxes.list() if "farm-docker" in s.metadata]
            if not left or time.time() > deadline:
                break
            time.sleep(1)
    assert not left, f"instances' sandboxes left: {[s.id for s in left]}"
    print("mini-extra swebench: 3 instances submitted, each in its own image, no sandbox left")


def _until_served(port, deadline_secs=PATIENCE):
    """The first 200 of the port's service (it may still be starting: 502 until it listens)."""
    deadline = time.monotonic() + deadline_secs
    while True:
        answer = port.request("GET", "/")
        if answer.status_code == 200 or time.monotonic() > deadline:
            return answer
        time.sleep(0.5)


def sdk(url, env):
    with Farm(url) as farm, farm.sandboxes.create(env, metadata={"check": "sdk"}) as sb:
        # Files and folders without exec.
        sb.files.write("/srv/www/index.html", "<h1>hello from farm</h1>\n")
        listing = sb.files.list("/srv/www")
        assert listing.names == ["index.html"] and listing.entries[0].is_file and not listing.truncated, listing
        assert sb.files.stat("/srv/www").is_dir and not sb.files.exists("/srv/none")
        # A web server in the background, reached through its open port.
        server = sb.processes.start(["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"], cwd="/srv/www")
        port = sb.ports.open(8000)
        answer = _until_served(port)
        assert answer.status_code == 200 and answer.text == "<h1>hello from farm</h1>\n", (answer, answer.text)
        assert [p.port for p in sb.ports.list()] == [8000]
        with port.client() as client:
            assert client.get("/missing").status_code == 404
        log = server.output("stderr", wait=30)
        assert '"GET / HTTP/1.1" 200' in log.data, log
        again = sb.processes.get(server.pid)
        assert again.running and again.info.command.startswith("python3"), again
        assert server.pid in [p.pid for p in sb.processes.list()]
        server.signal("TERM")
        ended = server.wait(timeout=PATIENCE)
        assert ended.exited and ended.signal == 15, ended
        sb.ports.close(8000)
        assert port.request("GET", "/").status_code == 404
        # A process fed on stdin, followed to its end.
        echo = sb.processes.start("while read l; do echo got:$l; echo err:$l >&2; done; echo bye; exit 3")
        echo.send_stdin("a\nb\n", close=True)
        chunks = list(echo.follow())
        out = "".join(c.data for c in chunks if c.stream == "stdout")
        err = "".join(c.data for c in chunks if c.stream == "stderr")
        assert (out, err, echo.exit_code) == ("got:a\ngot:b\nbye\n", "err:a\nerr:b\n", 3), (out, err, echo.info)
        # Python's REPL on a terminal.
        with sb.pty(rows=30, cols=100, command="python3 -q") as terminal:
            terminal.expect(">>> ", timeout=PATIENCE)
            terminal.send("print(sum(i * i for i in range(5)))\n")
            terminal.expect(re.compile(r"^30\r?$", re.M), timeout=PATIENCE)
            terminal.resize(40, 120)
            terminal.send("import os; print(os.get_terminal_size())\n")
            terminal.expect("columns=120, lines=40", timeout=PATIENCE)
            terminal.send("exit()\n")
            assert terminal.wait(timeout=PATIENCE) == 0
        # Timers, the list filtered, many branches in one call.
        info = sb.set_timeout(1800, idle=300)
        assert info.idle_timeout_secs == 300 and info.expires_at_ms, info
        assert [s.id for s in farm.sandboxes.list(metadata={"check": "sdk"})] == [sb.id]
        assert farm.sandboxes.list(state="paused") == []
        branches = sb.branch(count=2)
        try:
            for branch in branches:
                assert branch.files.read("/srv/www/index.html") == b"<h1>hello from farm</h1>\n"
                assert branch.info().parent == sb.id
        finally:
            for branch in branches:
                branch.kill()
    asyncio.run(_sdk_async(url, env))
    print("the SDK's processes, ports and terminals work, sync and async")


async def _sdk_async(url, env):
    async with AsyncFarm(url) as farm, farm.sandboxes.create(env) as sb:
        counter = await sb.processes.start("for i in 1 2 3; do echo n$i; done; exit 4")
        lines = [chunk.data async for chunk in counter.follow()]
        assert "".join(lines) == "n1\nn2\nn3\n" and counter.exit_code == 4, (lines, counter.info)
        # A kept terminal outlives its socket; attaching again replays what it printed.
        async with await sb.pty(command="bash", keep=True) as terminal:
            await terminal.send("echo kept-$((40 + 2))\n")
            await terminal.expect("kept-42", timeout=PATIENCE)
            pid = terminal.pid
        async with await sb.pty(pid=pid, rows=50, cols=90) as again:
            await again.expect("kept-42", timeout=PATIENCE)
            await again.send("stty size; exit 7\n")
            await again.expect("50 90", timeout=PATIENCE)
            assert await again.wait(timeout=PATIENCE) == 7
        shell = await sb.processes.get(pid)
        assert shell.info.pty and shell.exit_code == 7, shell.info
        try:
            await shell.wait(timeout=0)
        except WaitTimeout:
            raise AssertionError("an ended process is not waited for")


PARTS = {"swerex": swerex, "minisweagent": minisweagent, "swebench": swebench, "sdk": sdk}

if __name__ == "__main__":
    part, url, env = sys.argv[1:4]
    PARTS[part](url, env)
    print(f"{part}: ok")
