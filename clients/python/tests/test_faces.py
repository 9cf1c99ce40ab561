"""The sync and the async client are two faces of one core: the same calls, with the same
parameters and defaults, and the same ends when a stream breaks or is left early."""

import asyncio
import inspect
import os

import httpx
import pytest

from farm_sdk import (
    AsyncEnvironment,
    AsyncFarm,
    AsyncFiles,
    AsyncPorts,
    AsyncProcess,
    AsyncProcesses,
    AsyncSandbox,
    AsyncTerminal,
    ConnectionFailed,
    Environment,
    Farm,
    Files,
    Ports,
    Process,
    Processes,
    Sandbox,
    Terminal,
)
from farm_sdk.aio import AsyncEnvironments, AsyncSandboxes, AsyncWorkspaces
from farm_sdk.client import Environments, Sandboxes, Workspaces
from mock_farm import MockFarm, events

FACES = [
    (Farm, AsyncFarm),
    (Environments, AsyncEnvironments),
    (Sandboxes, AsyncSandboxes),
    (Sandbox, AsyncSandbox),
    (Files, AsyncFiles),
    (Environment, AsyncEnvironment),
    (Processes, AsyncProcesses),
    (Process, AsyncProcess),
    (Ports, AsyncPorts),
    (Terminal, AsyncTerminal),
    (Workspaces, AsyncWorkspaces),
]
# The one async call that is not a coroutine function: it returns a `SandboxCreation`, to
# await or to use with `async with`.
NOT_A_COROUTINE = {(AsyncSandboxes, "create")}


def calls(face):
    return {name for name in dir(face) if not name.startswith("_") and callable(getattr(face, name))}


def shape(function):
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("sync, asynchronous", FACES, ids=[s.__name__ for s, _ in FACES])
def test_both_faces_have_the_same_calls_with_the_same_parameters(sync, asynchronous):
    assert calls(sync) == calls(asynchronous)
    for name in sorted(calls(sync)):
        assert shape(getattr(sync, name)) == shape(getattr(asynchronous, name)), name


@pytest.mark.parametrize("sync, asynchronous", FACES, ids=[s.__name__ for s, _ in FACES])
def test_the_async_face_awaits_what_the_sync_face_returns(sync, asynchronous):
    for name in sorted(calls(sync)):
        method = inspect.getattr_static(asynchronous, name)
        if method is inspect.getattr_static(sync, name) or (asynchronous, name) in NOT_A_COROUTINE:
            continue  # inherited, as `Environment.from_json`
        function = getattr(asynchronous, name)
        if inspect.isgeneratorfunction(getattr(sync, name)):
            assert inspect.isasyncgenfunction(function), name
        else:
            assert inspect.iscoroutinefunction(function), name
    assert hasattr(sync, "__enter__") == hasattr(asynchronous, "__aenter__")
    sync_properties = {n for n in dir(sync) if isinstance(inspect.getattr_static(sync, n), property)}
    async_properties = {n for n in dir(asynchronous) if isinstance(inspect.getattr_static(asynchronous, n), property)}
    assert sync_properties == async_properties


class Body(httpx.SyncByteStream, httpx.AsyncByteStream):
    """An answer's body in pieces, broken off after them unless `ends`; it knows whether it
    was closed."""

    def __init__(self, pieces, ends):
        self.pieces, self.ends, self.closed = pieces, ends, False

    def __iter__(self):
        yield from self.pieces
        if not self.ends:
            raise httpx.ReadError("connection reset")

    async def __aiter__(self):
        for piece in self.pieces:
            yield piece
        if not self.ends:
            raise httpx.ReadError("connection reset")

    def close(self):
        self.closed = True

    async def aclose(self):
        self.closed = True


def test_a_download_cut_off_leaves_no_file_and_fails_as_a_connection(tmp_path):
    for face in ("sync", "async"):
        body = Body([b"part of it"], ends=False)
        server = MockFarm().on("GET", "/v1/sandboxes/sb-1/files", httpx.Response(200, stream=body))
        target = str(tmp_path / face / "out.bin")
        with pytest.raises(ConnectionFailed) as caught:
            if face == "sync":
                Sandbox(server.farm(), "sb-1").files.download_file("/out.bin", target)
            else:
                asyncio.run(AsyncSandbox(server.async_farm(), "sb-1").files.download_file("/out.bin", target))
        assert caught.value.sent and isinstance(caught.value.__cause__, httpx.ReadError)
        assert body.closed and os.listdir(tmp_path / face) == []


def test_leaving_iter_exec_early_closes_the_stream():
    output = events(("stdout", {"data": "a"}), ("stdout", {"data": "b"}), ("exit", {"exit_code": 0})).encode()
    body = Body([output[:30], output[30:]], ends=True)
    server = MockFarm().on("POST", "/v1/sandboxes/sb-1/exec/stream", httpx.Response(200, stream=body))
    items = Sandbox(server.farm(), "sb-1").iter_exec("x")
    assert next(items) == ("stdout", "a")
    items.close()
    assert body.closed

    body = Body([output[:30], output[30:]], ends=True)
    server = MockFarm().on("POST", "/v1/sandboxes/sb-1/exec/stream", httpx.Response(200, stream=body))

    async def main():
        items = AsyncSandbox(server.async_farm(), "sb-1").iter_exec("x")
        assert await items.__anext__() == ("stdout", "a")
        await items.aclose()

    asyncio.run(main())
    assert body.closed
