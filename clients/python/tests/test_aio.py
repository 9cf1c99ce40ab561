"""The asyncio client mirrors the sync one (run with asyncio.run: no plugin needed)."""

import asyncio
import os
import tarfile

import httpx
import pytest

from farm_sdk import (
    AsyncEnvironment,
    AsyncFarm,
    AsyncSandbox,
    BuildError,
    ConnectionFailed,
    Environment,
    ExecResult,
    UnsafeArchive,
)
from mock_farm import ENV, SANDBOX, MockFarm, body, chunks, error, events, streamed, tar_of


def run(coroutine):
    return asyncio.run(coroutine)


def test_create_an_environment_and_wait_with_an_async_callback():
    server = (
        MockFarm()
        .on("POST", "/v1/environments", httpx.Response(202, json=dict(ENV, state="building")))
        .on("GET", "/v1/environments/env-1/logs",
            httpx.Response(200, json={"lines": ["FROM python"], "next": 1, "state": "ready"}),
            httpx.Response(200, json={"lines": [], "next": 1, "state": "ready"}))
        .on("GET", "/v1/environments/env-1", httpx.Response(200, json=ENV))
    )
    lines = []

    async def on_log(line):
        lines.append(line)

    async def main():
        async with server.async_farm() as farm:
            env = await farm.environments.create(image="python", on_log=on_log)
            assert isinstance(env, AsyncEnvironment) and isinstance(env, Environment) and env.ready
            assert await env.logs(offset=1) == ([], 1, "ready")

    run(main())
    assert lines == ["FROM python"]


def test_from_dockerfile_and_a_failed_build(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM python\n")
    failed = dict(ENV, state="failed", error={"message": "RUN failed", "dockerfile_line": 3, "instruction": "RUN x"})
    server = (
        MockFarm()
        .on("POST", "/v1/contexts", httpx.Response(201, json={"context": "ctx-1", "files": 1, "bytes": 1}))
        .on("POST", "/v1/environments", httpx.Response(202, json=dict(ENV, state="building")))
        .on("GET", "/v1/environments/env-1/logs", httpx.Response(200, json={"lines": [], "next": 0, "state": "failed"}))
        .on("GET", "/v1/environments/env-1", httpx.Response(200, json=failed))
    )

    async def main():
        with pytest.raises(BuildError) as caught:
            await server.async_farm().environments.from_dockerfile(str(tmp_path), target="app")
        assert caught.value.dockerfile_line == 3 and caught.value.instruction == "RUN x"

    run(main())
    create = server.sent("POST", "/v1/environments")[0]
    assert body(create) == {"dockerfile": {"context": "ctx-1", "path": "Dockerfile", "target": "app"}}


def test_sandboxes_exec_files_branch_and_kill():
    server = (
        MockFarm()
        .on("POST", "/v1/sandboxes", error(503, "busy", retry_after="1"), httpx.Response(201, json=SANDBOX))
        .on("POST", "/v1/sandboxes/sb-1/exec", httpx.Response(200, json={"exit_code": 0, "stdout": "ok\n"}))
        .on("PUT", "/v1/sandboxes/sb-1/files", httpx.Response(200, json={}))
        .on("GET", "/v1/sandboxes/sb-1/files", httpx.Response(200, content=b"data"))
        .on("POST", "/v1/sandboxes/sb-1/branch", httpx.Response(201, json=dict(SANDBOX, id="sb-2")))
        .on("POST", "/v1/sandboxes/sb-1/snapshot", httpx.Response(201, json=dict(ENV, id="env-2")))
        .on("GET", "/v1/sandboxes/sb-1", httpx.Response(200, json=SANDBOX))
        .on("DELETE", "/v1/sandboxes/sb-1", error(404, "gone"))
        .on("DELETE", "/v1/sandboxes/sb-2", httpx.Response(200, json={}))
    )

    async def main():
        farm = server.async_farm()
        sb = await farm.sandboxes.create("env-1", workdir="/app")
        assert isinstance(sb, AsyncSandbox)
        result = await sb.exec(["echo", "ok"], stdin="x")
        assert isinstance(result, ExecResult) and result.ok and result.stdout == "ok\n"
        await sb.files.write("/a", "text")
        assert await sb.files.read("/a") == b"data"
        branch = await sb.branch()
        assert branch.id == "sb-2"
        env = await sb.snapshot()
        assert isinstance(env, AsyncEnvironment) and env.id == "env-2"
        assert (await sb.info()).id == "sb-1"
        await branch.kill()
        await sb.kill()  # a 404: already gone, no error
        await farm.close()

    run(main())
    creates = server.sent("POST", "/v1/sandboxes")
    assert len(creates) == 2 and creates[0].headers["Idempotency-Key"] == creates[1].headers["Idempotency-Key"]
    assert body(creates[0]) == {"environment": "env-1", "workdir": "/app"}
    assert server.sleeps == [1.0]
    assert body(server.sent("POST", "/v1/sandboxes/sb-1/exec")[0]) == {"argv": ["echo", "ok"], "stdin": "x"}


def test_async_with_create_kills_on_exception():
    server = (
        MockFarm()
        .on("POST", "/v1/sandboxes", httpx.Response(201, json=SANDBOX))
        .on("DELETE", "/v1/sandboxes/sb-1", httpx.Response(200, json={}))
    )

    async def main():
        farm = server.async_farm()
        with pytest.raises(RuntimeError):
            async with farm.sandboxes.create("env-1") as sb:
                assert sb.id == "sb-1"
                raise RuntimeError("boom")
        sb = await AsyncSandbox.create("env-1", farm=farm)
        async with sb:
            pass

    run(main())
    assert server.paths() == ["POST /v1/sandboxes", "DELETE /v1/sandboxes/sb-1"] * 2


def test_exec_stream_and_iter_exec():
    stream = events(("stdout", {"data": "a\n"}), ("stderr", {"data": "b\n"}), ("exit", {"exit_code": 0})).encode()
    server = MockFarm().on(
        "POST", "/v1/sandboxes/sb-1/exec/stream", streamed(chunks(stream, 4)), streamed(chunks(stream, 9))
    )

    async def main():
        sb = AsyncSandbox(server.async_farm(), "sb-1")
        out = []

        async def on_stdout(text):
            out.append(text)

        err = []
        result = await sb.exec_stream("x", on_stdout=on_stdout, on_stderr=err.append)
        assert (out, err, result.ok, result.stdout, result.stderr) == (["a\n"], ["b\n"], True, "a\n", "b\n")
        items = [item async for item in sb.iter_exec("x")]
        assert items[:2] == [("stdout", "a\n"), ("stderr", "b\n")] and items[2].exit_code == 0

    run(main())


def test_exec_is_not_resent_after_the_connection_broke():
    server = MockFarm().on("POST", "/v1/sandboxes/sb-1/exec", httpx.ReadError("reset"))

    async def main():
        with pytest.raises(ConnectionFailed):
            await AsyncSandbox(server.async_farm(), "sb-1").exec("rm -rf /tmp/x")

    run(main())
    assert len(server.requests) == 1


def test_folders_and_unsafe_archives(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.txt").write_text("f")
    archive = {}

    def keep(request):
        archive["tar"] = request.content
        return httpx.Response(200, json={})

    evil = tar_of([(tarfile.TarInfo("/etc/evil"), b"x")])
    server = (
        MockFarm()
        .on("PUT", "/v1/sandboxes/sb-1/folders", keep)
        .on("GET", "/v1/sandboxes/sb-1/folders", lambda r: httpx.Response(200, content=archive["tar"]),
            httpx.Response(200, content=evil))
        .on("GET", "/v1/sandboxes/sb-1/files", httpx.Response(200, content=b"file"))
    )

    async def main():
        sb = AsyncSandbox(server.async_farm(), "sb-1")
        await sb.files.upload_dir(str(src), "/app")
        await sb.files.download_dir("/app", str(tmp_path / "copy"))
        assert (tmp_path / "copy" / "f.txt").read_text() == "f"
        with pytest.raises(UnsafeArchive, match="absolute"):
            await sb.files.download_dir("/app", str(tmp_path / "evil"))
        await sb.files.download_file("/x", str(tmp_path / "x"))
        (tmp_path / "up").write_bytes(b"up")
        os.chmod(tmp_path / "up", 0o700)
        await sb.files.upload_file(str(tmp_path / "up"), "/up")

    server.on("PUT", "/v1/sandboxes/sb-1/files", httpx.Response(200, json={}))
    run(main())
    assert (tmp_path / "x").read_bytes() == b"file"
    assert dict(server.sent("PUT", "/v1/sandboxes/sb-1/files")[0].url.params) == {"path": "/up", "mode": "700"}
