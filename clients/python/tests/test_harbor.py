"""`farm_sdk.harbor`, Harbor's environment backend, against a scripted service: run where Harbor
is installed (Python >= 3.12; farm/tests/harbor.rs runs these tests on Harbor's venv)."""

import asyncio
from pathlib import Path

import httpx
import pytest

pytest.importorskip("harbor.environments.base")

from harbor.models.task.config import EnvironmentConfig  # noqa: E402
from harbor.models.trial.paths import TrialPaths  # noqa: E402

from farm_sdk.harbor import FarmEnvironment, FarmRefusal  # noqa: E402
from mock_farm import ENV, SANDBOX, MockFarm, body  # noqa: E402


def environment(tmp_path, server, task=None, **options):
    (tmp_path / "environment").mkdir(exist_ok=True)
    (tmp_path / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\n")
    made = FarmEnvironment(
        environment_dir=tmp_path / "environment",
        environment_name="task",
        session_id="task__1__env",
        trial_paths=TrialPaths(tmp_path / "trial"),
        task_env_config=task or EnvironmentConfig(workdir="/app"),
        **options,
    )
    made._farm = server.async_farm()
    return made


def test_a_trial_builds_forks_runs_moves_files_and_kills(tmp_path):
    server = (
        MockFarm()
        .on("POST", "/v1/contexts", httpx.Response(201, json={"context": "ctx-1", "files": 1, "bytes": 10}))
        .on("POST", "/v1/environments", httpx.Response(200, json=ENV))
        .on("POST", "/v1/sandboxes", httpx.Response(201, json=SANDBOX))
        .on("POST", "/v1/sandboxes/sb-1/exec", httpx.Response(200, json={"exit_code": 0, "stdout": "hi\n"}))
        .on("PUT", "/v1/sandboxes/sb-1/files", httpx.Response(200, json={}))
        .on("GET", "/v1/sandboxes/sb-1/files", httpx.Response(200, content=b"out"))
        .on("DELETE", "/v1/sandboxes/sb-1", httpx.Response(200, json={}))
    )
    trial = environment(tmp_path, server, network="harbor")

    async def main():
        await trial.start(force_build=False)
        result = await trial.exec("echo hi")
        assert (result.return_code, result.stdout) == (0, "hi\n")
        await trial.upload_file(tmp_path / "environment" / "Dockerfile", "/app/Dockerfile")
        await trial.download_file("/out", tmp_path / "out" / "x")
        await trial.stop(delete=True)

    asyncio.run(main())
    assert (tmp_path / "out" / "x").read_bytes() == b"out"
    paths = server.paths()
    assert paths[:3] == ["POST /v1/contexts", "POST /v1/environments", "POST /v1/sandboxes"]
    assert paths[-3:] == ["PUT /v1/sandboxes/sb-1/files", "GET /v1/sandboxes/sb-1/files", "DELETE /v1/sandboxes/sb-1"]
    created = body(server.sent("POST", "/v1/sandboxes")[0])
    assert created["environment"] == "env-1" and created["network"] == "harbor"
    assert created["metadata"]["harbor.session_id"] == "task__1__env"


def test_what_farm_cannot_honour_is_refused_before_anything_is_made(tmp_path):
    server = MockFarm()
    public = environment(tmp_path, server)
    with pytest.raises(FarmRefusal, match="internet access"):
        asyncio.run(public.start(force_build=False))
    gpu = environment(tmp_path, server, EnvironmentConfig(gpus=1), network="harbor")
    with pytest.raises(FarmRefusal, match="GPU"):
        asyncio.run(gpu.start(force_build=False))
    assert server.requests == []
