"""farm's NeMo Gym provider (`farm_sdk.nemogym.FarmProvider`) against a real `farm serve`, in
a venv with nemo-gym from PyPI (unmodified), the SDK installed with its entry points:
`farm/tests/nemogym.rs` runs it.

    python nemogym_check.py URL ENVIRONMENT

ENVIRONMENT is a ready environment of the python image. Gym finds the provider by its entry
point; the provider keeps the protocol's contract (nemo-gym 0.4 ships no conformance suite:
these are its base.py's and its documentation's rules); farm's extras (branch, pause and
resume, snapshot, a port's endpoint) work; and a Gym resources server of our own runs six
rollouts of a scripted policy in farm sandboxes with the expected rewards. Every sandbox made
is removed; prints `nemogym: ok` last.
"""

import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

URL, ENV = sys.argv[1:3]
os.environ["FARM_URL"] = URL

from nemo_gym.sandbox import (  # noqa: E402
    AsyncSandbox,
    Sandbox,
    SandboxCreateError,
    SandboxSpec,
    SandboxStatus,
    create_provider,
    list_providers,
)

# Found through the `nemo_gym.sandbox_providers` entry point of the installed SDK.
assert "farm" in list_providers(), list_providers()
CONFIG = {"farm": {}}  # the service's address from $FARM_URL, as the SDK reads it


async def contract(tmp: Path):
    provider = create_provider(CONFIG)
    assert provider.name == "farm"
    handle = await provider.create(SandboxSpec(image=ENV, env={"FOO": "bar"}, metadata={"check": "nemogym"}))
    try:
        assert handle.provider_name == "farm" and await provider.status(handle) == SandboxStatus.RUNNING
        r = await provider.exec(handle, "echo out; echo err >&2; exit 7")
        assert (r.return_code, r.stdout, r.stderr, r.error_type) == (7, "out\n", "err\n", None), r
        assert (await provider.exec(handle, "echo $FOO $BAR", env={"BAR": "baz"})).stdout == "bar baz\n"
        await provider.exec(handle, "mkdir -p /tmp/cw")
        assert (await provider.exec(handle, "pwd", cwd="/tmp/cw")).stdout == "/tmp/cw\n"
        assert (await provider.exec(handle, "id -un", user="nobody")).stdout == "nobody\n"
        await provider.exec(handle, "echo one > /tmp/state.txt")
        assert (await provider.exec(handle, "cat /tmp/state.txt")).stdout == "one\n"
        blob = tmp / "blob.bin"
        blob.write_bytes(bytes(range(256)) * 64)
        await provider.upload_file(handle, blob, "/tmp/up/deeper/blob.bin")
        back = tmp / "nested" / "back.bin"
        await provider.download_file(handle, "/tmp/up/deeper/blob.bin", back)
        assert back.read_bytes() == blob.read_bytes()
        try:
            await provider.download_file(handle, "/tmp/none", tmp / "none")
            raise AssertionError("a missing file was downloaded")
        except FileNotFoundError:
            pass
        late = await provider.exec(handle, "sleep 600", timeout_s=2)
        assert (late.return_code, late.error_type) == (125, "timeout"), late
        killed = await provider.exec(handle, "kill -TERM $$")
        assert killed.return_code == 143, killed
    finally:
        await provider.close(handle)
        await provider.close(handle)  # again: no error
        await provider.aclose()
    assert await provider.status(handle) == SandboxStatus.STOPPED
    await provider.aclose()
    # A spec farm cannot honour is refused before anything is made; an unknown environment
    # is Gym's create error.
    for options in ({"platform": {"os": "linux", "arch": "arm64"}}, {"gpus": 1}):
        try:
            await provider.create(SandboxSpec(image=ENV, provider_options=options))
            raise AssertionError(f"{options} was taken")
        except ValueError:
            pass
    try:
        await provider.create(SandboxSpec(image="env-000000000000000000000000"))
        raise AssertionError("an unknown environment made a sandbox")
    except SandboxCreateError:
        pass
    # Several sandboxes of one provider at once.
    handles = await asyncio.gather(*[provider.create(SandboxSpec(image=ENV)) for _ in range(3)])
    outs = await asyncio.gather(*[provider.exec(h, f"echo {i}") for i, h in enumerate(handles)])
    assert [o.stdout for o in outs] == ["0\n", "1\n", "2\n"]
    await asyncio.gather(*[provider.close(h) for h in handles])
    await provider.aclose()


async def extras():
    provider = create_provider(CONFIG)
    handle = await provider.create(SandboxSpec(image=ENV))
    made = [handle]
    try:
        await provider.exec(handle, "echo before > /tmp/state")
        copies = await provider.branch(handle, 2)
        made += copies
        await provider.exec(copies[0], "echo diverged > /tmp/state")
        states = [(await provider.exec(h, "cat /tmp/state")).stdout for h in (handle, *copies)]
        assert states == ["before\n", "before\n", "diverged\n"] or states == ["before\n", "diverged\n", "before\n"], states
        # A snapshot (before any pause: farm keeps a resumed sandbox's state in its pause
        # folder) is an image later specs name.
        snapshot = await provider.snapshot(handle)
        from_snapshot = await provider.create(SandboxSpec(image=snapshot))
        made.append(from_snapshot)
        assert (await provider.exec(from_snapshot, "cat /tmp/state")).stdout == "before\n"
        await provider.pause(handle)
        assert await provider.status(handle) == SandboxStatus.STOPPED
        await provider.resume(handle)
        assert (await provider.exec(handle, "cat /tmp/state")).stdout == "before\n"
        await provider.exec(handle, "cd /tmp && (python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &)")
        endpoint = await provider.endpoint(handle, 8000)
        import httpx

        for _ in range(300):  # a wait for the server to listen, not a claim on its speed
            served = httpx.get(endpoint.endpoint + "/state", headers=endpoint.headers, timeout=30)
            if served.status_code == 200:
                break
            await asyncio.sleep(0.2)
        assert served.text == "before\n", (served.status_code, served.text)
    finally:
        for h in made:
            await provider.close(h)
        await provider.aclose()


def facade():
    spec = SandboxSpec(image=ENV, workdir="/tmp/wd", files={"/tmp/wd/seed.txt": "seeded"})
    with Sandbox(CONFIG, spec) as sandbox:
        sandbox.start()
        assert sandbox.exec("cat seed.txt").stdout == "seeded"
    assert sandbox.status() == SandboxStatus.STOPPED


def rollouts():
    """A Gym resources server of our own: a sandbox per session, a command tool, a verifier
    reading the answer; a scripted policy; three tasks, two rollouts each."""
    from fastapi import FastAPI, Request
    from fastapi.testclient import TestClient
    from nemo_gym.base_resources_server import (
        BaseResourcesServerConfig,
        BaseSeedSessionRequest,
        BaseSeedSessionResponse,
        BaseVerifyRequest,
        BaseVerifyResponse,
        SimpleResourcesServer,
    )
    from nemo_gym.global_config import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
    from nemo_gym.openai_utils import NeMoGymResponse
    from nemo_gym.server_utils import SESSION_ID_KEY, ServerClient
    from pydantic import BaseModel, Field

    class TaskConfig(BaseResourcesServerConfig):
        sandbox_provider: Any = CONFIG
        image: str = ENV

    class Seed(BaseSeedSessionRequest):
        task_id: str

    class Command(BaseModel):
        command: str

    class Ran(BaseModel):
        stdout: Any
        stderr: Any
        return_code: int

    class Verify(BaseVerifyRequest):
        task_id: str
        expected: str

    class Verified(BaseVerifyResponse):
        task_id: str

    class TaskServer(SimpleResourcesServer):
        config: TaskConfig
        sandboxes: dict = Field(default_factory=dict)

        def setup_webserver(self) -> FastAPI:
            app = super().setup_webserver()
            app.post("/run_command")(self.run_command)
            return app

        async def seed_session(self, request: Request, body: Seed) -> BaseSeedSessionResponse:
            sandbox = AsyncSandbox(self.config.sandbox_provider)
            await sandbox.start(SandboxSpec(image=self.config.image, workdir="/work",
                                            files={"/work/task.txt": body.task_id}, metadata={"task": body.task_id}))
            self.sandboxes[request.session[SESSION_ID_KEY]] = sandbox
            return BaseSeedSessionResponse()

        async def run_command(self, request: Request, body: Command) -> Ran:
            r = await self.sandboxes[request.session[SESSION_ID_KEY]].exec(body.command, timeout_s=60)
            return Ran(stdout=r.stdout, stderr=r.stderr, return_code=r.return_code)

        async def verify(self, request: Request, body: Verify) -> Verified:
            sandbox = self.sandboxes.pop(request.session[SESSION_ID_KEY])
            try:
                r = await sandbox.exec("cat answer.txt")
                reward = float(r.return_code == 0 and (r.stdout or "").strip() == body.expected)
            finally:
                await sandbox.stop()
            return Verified(**body.model_dump(), reward=reward)

    def policy(task_id):  # the scripted policy: wrong on t2
        answer = "nope" if task_id == "t2" else f"done-{task_id}"
        return ["cat task.txt", f"echo {answer} > answer.txt"]

    empty = NeMoGymResponse(id="r", created_at=0.0, model="scripted", object="response", output=[],
                            parallel_tool_calls=False, tool_choice="none", tools=[]).model_dump()
    server = TaskServer(config=TaskConfig(host="127.0.0.1", port=0, entrypoint="", name="farm_task"),
                        server_client=MagicMock(spec=ServerClient))
    rows = [{"task_id": t, "expected": f"done-{t}",
             "responses_create_params": {"input": [{"role": "user", "content": f"solve {t}"}]}} for t in ("t1", "t2", "t3")]
    verified = []
    with TestClient(server.setup_webserver()) as client:
        for index, row in enumerate(rows):
            for rollout in range(2):
                client.cookies.clear()
                client.post("/seed_session", json=row).raise_for_status()
                for command in policy(row["task_id"]):
                    ran = client.post("/run_command", json={"command": command}).json()
                    assert ran["return_code"] == 0, ran
                answer = client.post("/verify", json={**row, "response": empty})
                answer.raise_for_status()
                verified.append({TASK_INDEX_KEY_NAME: index, ROLLOUT_INDEX_KEY_NAME: rollout,
                                 "reward": answer.json()["reward"]})
        metrics = client.post("/aggregate_metrics", json={"verify_responses": verified}).json()
    assert [v["reward"] for v in verified] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0], verified
    assert not server.sandboxes
    mean = [v for k, v in metrics["agent_metrics"].items() if "reward" in k and "mean" in k]
    print("rollouts:", [v["reward"] for v in verified], "mean reward", mean)


with tempfile.TemporaryDirectory() as tmp:
    asyncio.run(contract(Path(tmp)))
asyncio.run(extras())
facade()
rollouts()
print("nemogym: ok")
