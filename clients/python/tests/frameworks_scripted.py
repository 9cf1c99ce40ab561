"""The framework backends against the scripted service, where SWE-ReX and mini-swe-agent are
installed: the agents venv of scripts/setup.sh, where farm/tests/frameworks.rs runs this file
(none skipped) before the same backends meet real guests. Its name keeps it out of a plain
`pytest clients/python/tests` (the interpreter that runs the rest has neither framework);
name it to run it:

    $FARM_CACHE_DIR/agents-venv/bin/python -m pytest clients/python/tests/frameworks_scripted.py

mini-swe-agent's environment: what each action sends and how its result reads, submission,
timeouts, signals, failures, the sandbox's uname, cleanup. SWE-ReX's deployment: the server's
command line, the runtime's headers, a server that ends before it answers (its output in the
error, the sandbox removed), stop before start.
"""

import asyncio
import gc
import os

import httpx
import pytest

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
swerex = pytest.importorskip("swerex", reason="SWE-ReX is not installed here (the agents venv has it)")
pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed here (the agents venv has it)")

from farm_sdk import Sandbox  # noqa: E402
from farm_sdk import minisweagent as mini  # noqa: E402
from farm_sdk import swerex as rex  # noqa: E402
from minisweagent.exceptions import Submitted  # noqa: E402
from mock_farm import PORT, SANDBOX, MockFarm, body, chunk, error, process  # noqa: E402
from swerex.exceptions import DeploymentNotStartedError  # noqa: E402

SB = "/v1/sandboxes/sb-1"
UNAME = "Linux\nsb-1\n6.1.0-farm\n#1 SMP\nx86_64\n"


def exec_answer(stdout="", exit_code=0, **more):
    return httpx.Response(200, json=dict({"exit_code": exit_code, "stdout": stdout, "stderr": ""}, **more))


def test_an_action_runs_merged_in_a_new_shell_in_its_folder_with_its_variables(monkeypatch):
    monkeypatch.setenv("FROM_HOST", "yes")
    server = MockFarm().on("POST", f"{SB}/exec", exec_answer("out\nerr\n", 3))
    env = mini.FarmEnvironment(sandbox=Sandbox(server.farm(), "sb-1"), cwd="/testbed", env={"A": "b"},
                               forward_env=["FROM_HOST", "NOT_SET"], timeout=45)
    output = env.execute({"command": "make test"})
    assert output == {"output": "out\nerr\n", "returncode": 3, "exception_info": ""}
    env.execute({"command": "ls"}, cwd="/tmp", timeout=5)
    first, second = (body(r) for r in server.sent("POST", f"{SB}/exec"))
    assert first["argv"] == ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh", "bash", "-lc", "make test"]
    assert (first["cwd"], first["env"], first["timeout_secs"]) == ("/testbed", {"FROM_HOST": "yes", "A": "b"}, 45)
    assert (second["cwd"], second["timeout_secs"]) == ("/tmp", 5)


def test_submission_timeouts_signals_and_failures_read_as_mini_swe_agent_reads_them():
    server = MockFarm().on(
        "POST", f"{SB}/exec",
        exec_answer("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\ndiff --git a b\n"),
        exec_answer("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n", 1),
        exec_answer("partial", None, timed_out=True),
        exec_answer("", None, signal=9),
        exec_answer("x" * 10, 0, stdout_truncated=True, output_cap_bytes=10),
        error(502, "sandbox sb-1 its VM died: qemu exited; it is removed"),
    )
    env = mini.FarmEnvironment(sandbox=Sandbox(server.farm(), "sb-1"))
    with pytest.raises(Submitted) as submitted:
        env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff"})
    [message] = submitted.value.messages
    assert message["extra"] == {"exit_status": "Submitted", "submission": "diff --git a b\n"}
    assert env.execute({"command": "false"})["returncode"] == 1  # the word, but not exit 0: no submission
    late = env.execute({"command": "sleep 99"}, timeout=2)
    assert late["returncode"] == -1 and late["output"] == "partial"
    assert late["exception_info"] == "An error occurred while executing the command: Command 'sleep 99' timed out after 2 seconds"
    assert late["extra"]["exception_type"] == "TimeoutExpired"
    assert env.execute({"command": "kill -9 $$"})["returncode"] == 128 + 9
    assert env.execute({"command": "yes"})["output"] == "x" * 10 + "\n[output cut at 10 bytes]\n"
    died = env.execute({"command": "ls"})
    assert died["returncode"] == -1 and "its VM died" in died["exception_info"]
    assert died["extra"]["exception_type"] == "ServerError"


def test_the_template_variables_are_the_sandboxs_and_asked_once():
    server = MockFarm().on("POST", f"{SB}/exec", exec_answer(UNAME))
    env = mini.FarmEnvironment(sandbox=Sandbox(server.farm(), "sb-1"), cwd="/w")
    variables = env.get_template_vars(task="fix it")
    assert (variables["system"], variables["release"], variables["version"], variables["machine"]) == (
        "Linux", "6.1.0-farm", "#1 SMP", "x86_64"
    )
    assert variables["cwd"] == "/w" and variables["task"] == "fix it" and "token" not in variables
    env.get_template_vars()
    assert len(server.sent("POST", f"{SB}/exec")) == 1
    serialized = env.serialize()["info"]
    assert serialized["config"]["environment_type"] == "farm_sdk.minisweagent.FarmEnvironment"
    assert serialized["farm"] == {"sandbox": "sb-1"}


def test_cleanup_removes_the_sandbox_it_made_and_leaves_a_given_one(monkeypatch):
    server = (
        MockFarm()
        .on("POST", "/v1/sandboxes", httpx.Response(201, json=SANDBOX))
        .on("DELETE", SB, httpx.Response(200, json={"id": "sb-1", "deleted": True}))
    )
    monkeypatch.setattr(mini, "Farm", lambda url, token: server.farm())
    with mini.FarmEnvironment(environment="env-1", network="pypi", token="secret",
                              sandbox_options={"metadata": {"run": "1"}}) as env:
        assert env.sandbox.id == "sb-1" and "secret" not in str(env.serialize())
    assert env.sandbox is None and server.paths() == ["POST /v1/sandboxes", f"DELETE {SB}"]
    assert body(server.requests[0]) == {"environment": "env-1", "network": "pypi", "metadata": {"run": "1"}}
    with pytest.raises(RuntimeError, match="cleanup"):
        env.execute({"command": "ls"})
    given = mini.FarmEnvironment(sandbox=Sandbox(server.farm(), "sb-1"))
    given.cleanup()
    assert server.paths().count(f"DELETE {SB}") == 1
    with pytest.raises(ValueError, match="environment= .* or sandbox="):
        mini.FarmEnvironment()


def test_a_dropped_environment_removes_its_sandbox_once_and_a_cleaned_one_not_again(monkeypatch):
    server = (
        MockFarm()
        .on("POST", "/v1/sandboxes", httpx.Response(201, json=SANDBOX))
        .on("DELETE", SB, httpx.Response(200, json={"id": "sb-1", "deleted": True}))
    )
    monkeypatch.setattr(mini, "Farm", lambda url, token: server.farm())
    env = mini.FarmEnvironment(environment="env-1")
    del env
    gc.collect()
    assert server.paths() == ["POST /v1/sandboxes", f"DELETE {SB}"]
    env = mini.FarmEnvironment(environment="env-1")
    env.cleanup()
    del env
    gc.collect()
    assert server.paths().count(f"DELETE {SB}") == 2, server.paths()
    # A half-made one (its create refused) holds nothing to remove.
    refusing = MockFarm().on("POST", "/v1/sandboxes", error(429, "busy"))
    monkeypatch.setattr(mini, "Farm", lambda url, token: refusing.farm(retries=0))
    with pytest.raises(Exception):
        mini.FarmEnvironment(environment="env-1")
    gc.collect()
    assert refusing.paths() == ["POST /v1/sandboxes"]


def test_a_dropped_deployment_removes_its_sandbox(monkeypatch):
    import farm_sdk._release as release

    server = (
        MockFarm()
        .on("POST", "/v1/sandboxes", httpx.Response(201, json=SANDBOX))
        .on("DELETE", SB, httpx.Response(200, json={"id": "sb-1", "deleted": True}))
    )
    monkeypatch.setattr(release, "Farm", lambda url, token, **kw: server.farm())

    async def no_server(self):
        return None

    monkeypatch.setattr(rex.FarmDeployment, "_start_server", no_server)

    async def main():
        farm = server.async_farm()
        deployment = rex.FarmDeployment(environment="env-1", farm=farm)
        await deployment.start()
        del deployment
        gc.collect()
        await farm.close()

    asyncio.run(main())
    assert server.paths() == ["POST /v1/sandboxes", f"DELETE {SB}"]


def test_the_runtime_sends_the_api_key_and_the_ports_token():
    runtime = rex.FarmRemoteRuntime(port_header={"Farm-Port-Token": "t0k"}, host="http://127.0.0.1:9000",
                                    port=None, auth_token="key")
    assert runtime._headers == {"X-API-Key": "key", "Farm-Port-Token": "t0k"}
    assert runtime._api_url == "http://127.0.0.1:9000"


def test_a_server_that_ends_before_it_answers_fails_the_start_with_its_output_and_removes_the_sandbox():
    server = (
        MockFarm()
        .on("POST", "/v1/sandboxes", httpx.Response(201, json=SANDBOX))
        .on("POST", f"{SB}/processes", httpx.Response(201, json=process(pid=85)))
        .on("POST", f"{SB}/ports", httpx.Response(201, json=dict(PORT, address="127.0.0.1:1")))
        .on("GET", f"{SB}/processes/85", httpx.Response(200, json=process(pid=85, state="exited", exit_code=127)))
        .on("GET", f"{SB}/processes/85/output", httpx.Response(200, json=chunk("swerex-remote: not found\n")))
        .on("DELETE", SB, httpx.Response(200, json={"id": "sb-1", "deleted": True}))
    )

    async def main():
        farm = server.async_farm()
        deployment = rex.FarmDeployment(environment="env-1", farm=farm, port=8123,
                                        sandbox_options={"network": "pypi"}, runtime_timeout=5)
        with pytest.raises(RuntimeError, match="ended in sandbox sb-1 before it answered.*exit code 127") as caught:
            await deployment.start()
        assert "swerex-remote: not found" in str(caught.value)
        with pytest.raises(DeploymentNotStartedError):
            deployment.sandbox
        await deployment.stop()  # nothing left to stop: no error, no request
        await farm.close()

    asyncio.run(main())
    argv = body(server.sent("POST", f"{SB}/processes")[0])["argv"]
    assert argv[:2] == ["swerex-remote", "--auth-token"] and len(argv[2]) == 32 and argv[3:] == ["--port", "8123"]
    assert body(server.sent("POST", f"{SB}/ports")[0]) == {"port": 8123}
    assert body(server.sent("POST", "/v1/sandboxes")[0]) == {"environment": "env-1", "network": "pypi"}
    assert server.paths()[-1] == f"DELETE {SB}" and server.paths().count(f"DELETE {SB}") == 1


def test_a_deployment_not_started_has_no_runtime_and_stops_quietly():
    deployment = rex.FarmDeployment(environment="env-1", url="http://farm.test")

    async def main():
        with pytest.raises(DeploymentNotStartedError):
            await deployment.is_alive()
        await deployment.stop()

    asyncio.run(main())
    with pytest.raises(DeploymentNotStartedError):
        deployment.runtime
