"""What a sandbox hosts, through both faces against a scripted service: background processes
(start, list, get, output, follow, stdin, signal, wait, resize), open ports, timers, folder
listings without exec, filtered lists and many branches.

Each test is one scenario run on the sync face and on the async one: `step` awaits what the
async face returns and takes the sync face's answer as it is.
"""

import asyncio
import inspect
import json
import signal

import httpx
import pytest

from farm_sdk import (
    AsyncProcess,
    AsyncSandbox,
    BadRequest,
    ConnectionFailed,
    FarmError,
    NotFound,
    OutputChunk,
    Port,
    Process,
    ProcessInfo,
    Sandbox,
    WaitTimeout,
)
from mock_farm import ENTRY, PORT, SANDBOX, MockFarm, body, chunk, error, events, process, streamed

SB = "/v1/sandboxes/sb-1"
FACES = ["sync", "async"]


async def step(value):
    return await value if inspect.isawaitable(value) else value


async def collect(items):
    if hasattr(items, "__aiter__"):
        return [item async for item in items]
    return list(items)


def scenario(face, server, run):
    """Runs `run(sandbox)` on a sandbox `sb-1` of the face, against `server`."""
    if face == "sync":
        sandbox = Sandbox(server.farm(), "sb-1")
    else:
        sandbox = AsyncSandbox(server.async_farm(), "sb-1")
    asyncio.run(run(sandbox))


@pytest.mark.parametrize("face", FACES)
def test_a_process_starts_with_only_what_was_given_and_is_never_sent_twice(face):
    server = MockFarm().on("POST", f"{SB}/processes", httpx.Response(201, json=process()))

    async def run(sb):
        handle = await step(sb.processes.start(["python3", "-m", "http.server"], cwd="/srv", env={"A": "b"}))
        assert isinstance(handle, (Process, AsyncProcess)) and handle.pid == 42 and handle.running
        await step(sb.processes.start("top", pty=(24, 80), ring_bytes=4096, user="farm"))

    scenario(face, server, run)
    first, second = server.sent("POST", f"{SB}/processes")
    assert body(first) == {"argv": ["python3", "-m", "http.server"], "cwd": "/srv", "env": {"A": "b"}}
    assert body(second) == {"command": "top", "user": "farm", "ring_bytes": 4096, "pty": {"rows": 24, "cols": 80}}

    broken = MockFarm().on("POST", f"{SB}/processes", httpx.ReadError("reset"))

    async def started_once(sb):
        with pytest.raises(ConnectionFailed) as caught:
            await step(sb.processes.start("make"))
        assert caught.value.sent

    scenario(face, broken, started_once)
    assert len(broken.sent("POST", f"{SB}/processes")) == 1


@pytest.mark.parametrize("face", FACES)
def test_processes_are_listed_and_found_again_by_pid(face):
    server = (
        MockFarm()
        .on("GET", f"{SB}/processes",
            httpx.Response(200, json={"processes": [process(), process(pid=7, state="exited", exit_code=0)]}))
        .on("GET", f"{SB}/processes/7", httpx.Response(200, json=process(pid=7, state="exited", exit_code=0)))
        .on("GET", f"{SB}/processes/8", error(404, "no process 8", field="pid"))
    )

    async def run(sb):
        listed = await step(sb.processes.list())
        assert [(p.pid, p.running, p.exit_code) for p in listed] == [(42, True, None), (7, False, 0)]
        again = await step(sb.processes.get(7))
        assert again.info == ProcessInfo.from_json(process(pid=7, state="exited", exit_code=0))
        with pytest.raises(NotFound) as caught:
            await step(sb.processes.get(8))
        assert caught.value.field == "pid"

    scenario(face, server, run)


@pytest.mark.parametrize("face", FACES)
def test_output_is_read_from_an_offset_holding_the_answer_as_asked(face):
    server = (
        MockFarm()
        .on("POST", f"{SB}/processes", httpx.Response(201, json=process()))
        .on("GET", f"{SB}/processes/42/output", httpx.Response(200, json=chunk("world\n", offset=6, dropped=2)))
    )

    async def run(sb):
        handle = await step(sb.processes.start("x"))
        got = await step(handle.output("stderr", offset=4, max_bytes=100, wait=500))
        assert isinstance(got, OutputChunk)
        assert (got.data, got.offset, got.next, got.dropped, got.stream) == ("world\n", 6, 12, 2, "stderr")
        await step(handle.output())
        with pytest.raises(ValueError, match="stdout.*stderr"):
            await step(handle.output("stdin"))

    scenario(face, server, run)
    first, second = server.sent("GET", f"{SB}/processes/42/output")
    assert dict(first.url.params) == {"stream": "stderr", "offset": "4", "wait": "300.0", "max": "100"}
    assert dict(second.url.params) == {"stream": "stdout", "offset": "0", "wait": "0.0"}


def _followed(*items):
    return events(*items).encode()


@pytest.mark.parametrize("face", FACES)
def test_follow_gives_each_chunk_then_updates_the_handle_with_the_end(face):
    stream = _followed(
        ("stdout", chunk("got:a\n", offset=10)),
        ("stderr", chunk("warn\n")),
        ("stdout", chunk("bye\n", offset=16)),
        ("exit", process(state="exited", exit_code=3, stdout_bytes=20, stderr_bytes=5)),
    )
    server = (
        MockFarm()
        .on("POST", f"{SB}/processes", httpx.Response(201, json=process()))
        .on("GET", f"{SB}/processes/42/output/stream", streamed([stream[:17], stream[17:40], stream[40:]]))
    )

    async def run(sb):
        handle = await step(sb.processes.start("x"))
        chunks = await collect(handle.follow(stdout=10))
        assert [(c.stream, c.data, c.offset) for c in chunks] == [
            ("stdout", "got:a\n", 10), ("stderr", "warn\n", 0), ("stdout", "bye\n", 16)
        ]
        assert not handle.running and handle.exit_code == 3 and handle.info.stdout_bytes == 20

    scenario(face, server, run)
    [request] = server.sent("GET", f"{SB}/processes/42/output/stream")
    assert dict(request.url.params) == {"stdout": "10", "stderr": "0"}
    assert request.headers["Accept"] == "text/event-stream"


@pytest.mark.parametrize("face", FACES)
def test_a_follow_that_breaks_off_says_where_to_follow_from_and_an_error_event_ends_it(face):
    cut = _followed(("stdout", chunk("abc", offset=5)), ("stderr", chunk("e", offset=2)))
    failed = _followed(("error", {"error": "sandbox sb-1 its VM died"}))
    server = (
        MockFarm()
        .on("POST", f"{SB}/processes", httpx.Response(201, json=process()))
        .on("GET", f"{SB}/processes/42/output/stream", streamed([cut]), streamed([failed]))
    )

    async def run(sb):
        handle = await step(sb.processes.start("x"))
        with pytest.raises(ConnectionFailed, match="stdout=8, stderr=3"):
            await collect(handle.follow())
        with pytest.raises(FarmError, match="its VM died"):
            await collect(handle.follow())
        assert handle.running

    scenario(face, server, run)


@pytest.mark.parametrize("face", FACES)
def test_wait_holds_at_the_service_until_the_end_or_the_timeout(face):
    running, ended = process(), process(state="exited", signal=15)
    server = (
        MockFarm()
        .on("POST", f"{SB}/processes", httpx.Response(201, json=process()))
        .on("POST", f"{SB}/processes/42/wait",
            httpx.Response(200, json=running), httpx.Response(200, json=ended), httpx.Response(200, json=running))
    )

    async def run(sb):
        handle = await step(sb.processes.start("x"))
        info = await step(handle.wait())
        assert info.exited and info.signal == 15 and handle.info is info
        with pytest.raises(WaitTimeout, match="process 42 of sandbox sb-1 is still running after 0 s"):
            await step(handle.wait(timeout=0))

    scenario(face, server, run)
    waits = server.sent("POST", f"{SB}/processes/42/wait")
    assert [w.url.params["timeout"] for w in waits] == ["300.0", "300.0", "0.0"]


@pytest.mark.parametrize("face", FACES)
def test_stdin_signals_and_sizes(face):
    after = httpx.Response(200, json=process())
    server = (
        MockFarm()
        .on("POST", f"{SB}/processes", httpx.Response(201, json=process(pty=True)))
        .on("POST", f"{SB}/processes/42/stdin", after)
        .on("POST", f"{SB}/processes/42/signal", after)
        .on("POST", f"{SB}/processes/42/resize", after)
        .on("GET", f"{SB}/processes/42", httpx.Response(200, json=process(state="exited", exit_code=0)))
    )

    async def run(sb):
        handle = await step(sb.processes.start("cat", pty=(24, 80)))
        await step(handle.send_stdin("a\n"))
        await step(handle.send_stdin(b"b\n", close=True))
        await step(handle.close_stdin())
        with pytest.raises(ValueError, match="UTF-8"):
            await step(handle.send_stdin(b"\xff"))
        for sig in ("INT", 9, signal.SIGTERM):
            await step(handle.signal(sig))
        await step(handle.kill())
        with pytest.raises(TypeError):
            await step(handle.signal(True))
        await step(handle.resize(40, 100))
        assert (await step(handle.refresh())).exit_code == 0 and not handle.running

    scenario(face, server, run)
    assert [body(r) for r in server.sent("POST", f"{SB}/processes/42/stdin")] == [
        {"data": "a\n"}, {"data": "b\n", "close": True}, {"data": "", "close": True}
    ]
    assert [body(r)["signal"] for r in server.sent("POST", f"{SB}/processes/42/signal")] == ["INT", "9", "15", "KILL"]
    assert body(server.sent("POST", f"{SB}/processes/42/resize")[0]) == {"rows": 40, "cols": 100}


@pytest.mark.parametrize("face", FACES)
def test_stdin_and_signals_are_not_sent_again_once_they_may_have_arrived(face):
    server = (
        MockFarm()
        .on("POST", f"{SB}/processes", httpx.Response(201, json=process()))
        .on("POST", f"{SB}/processes/42/stdin", httpx.ReadError("reset"))
        .on("POST", f"{SB}/processes/42/signal", httpx.ReadError("reset"))
    )

    async def run(sb):
        handle = await step(sb.processes.start("x"))
        for call in (lambda: handle.send_stdin("once\n"), lambda: handle.signal("TERM")):
            with pytest.raises(ConnectionFailed):
                await step(call())

    scenario(face, server, run)
    assert len(server.sent("POST", f"{SB}/processes/42/stdin")) == 1
    assert len(server.sent("POST", f"{SB}/processes/42/signal")) == 1


@pytest.mark.parametrize("face", FACES)
def test_ports_open_list_and_close(face):
    server = (
        MockFarm()
        .on("POST", f"{SB}/ports", httpx.Response(201, json=PORT))
        .on("GET", f"{SB}/ports", httpx.Response(200, json={"ports": [PORT]}))
        .on("DELETE", f"{SB}/ports/8000", httpx.Response(200, json={"ports": []}))
        .on("DELETE", f"{SB}/ports/9", error(404, "port 9 is not open", field="port"))
    )

    async def run(sb):
        port = await step(sb.ports.open(8000))
        assert isinstance(port, Port) and port == Port.from_json(PORT)
        assert port.headers == {"Farm-Port-Token": "0123abcd"} and port.base_url == "http://127.0.0.1:9000"
        assert await step(sb.ports.list()) == [port]
        assert await step(sb.ports.close(8000)) is None
        with pytest.raises(NotFound):
            await step(sb.ports.close(9))

    scenario(face, server, run)
    assert body(server.sent("POST", f"{SB}/ports")[0]) == {"port": 8000}


def test_a_port_reaches_its_service_with_its_token_header():
    seen = []

    def service(request):
        seen.append(request)
        return httpx.Response(200, text="hello")

    port = Port.from_json(dict(PORT, address="0.0.0.0:9000"))
    assert port.base_url == "http://127.0.0.1:9000"
    with port.client(transport=httpx.MockTransport(service), headers={"X-More": "1"}) as client:
        assert client.get("/a?b=c").text == "hello"

    async def main():
        async with port.async_client(transport=httpx.MockTransport(service)) as client:
            assert (await client.get("/d")).text == "hello"

    asyncio.run(main())
    assert [str(r.url) for r in seen] == ["http://127.0.0.1:9000/a?b=c", "http://127.0.0.1:9000/d"]
    assert all(r.headers["Farm-Port-Token"] == "0123abcd" for r in seen) and seen[0].headers["X-More"] == "1"


@pytest.mark.parametrize("face", FACES)
def test_set_timeout_sends_what_was_given(face):
    server = MockFarm().on("POST", f"{SB}/timeout", httpx.Response(200, json=dict(SANDBOX, idle_timeout_secs=30)))

    async def run(sb):
        info = await step(sb.set_timeout(90.5))
        assert info.idle_timeout_secs == 30
        await step(sb.set_timeout(idle=30, lifetime=3600))
        with pytest.raises(ValueError, match="seconds.*idle=.*lifetime="):
            await step(sb.set_timeout())

    scenario(face, server, run)
    assert [body(r) for r in server.sent("POST", f"{SB}/timeout")] == [
        {"expires_in_secs": 91}, {"idle_timeout_secs": 30, "lifetime_secs": 3600}
    ]


@pytest.mark.parametrize("face", FACES)
def test_set_network_names_a_policy_or_none(face):
    server = MockFarm().on("POST", f"{SB}/network", httpx.Response(200, json=dict(SANDBOX, network="agent")))

    async def run(sb):
        info = await step(sb.set_network("agent"))
        assert info.network == "agent"
        await step(sb.set_network(None))

    scenario(face, server, run)
    assert [body(r) for r in server.sent("POST", f"{SB}/network")] == [{"network": "agent"}, {"network": None}]


@pytest.mark.parametrize("face", FACES)
def test_a_checkpoint_is_taken_and_the_sandbox_runs_on(face):
    saved = dict(SANDBOX, checkpoint_at_ms=1764990000000)
    server = MockFarm().on("POST", f"{SB}/checkpoint", httpx.Response(200, json=saved))

    async def run(sb):
        info = await step(sb.checkpoint())
        assert info.state == "running" and info.checkpoint_at_ms == 1764990000000

    scenario(face, server, run)
    assert server.paths() == [f"POST {SB}/checkpoint"]


@pytest.mark.parametrize("face", FACES)
def test_the_sandbox_list_is_filtered_by_state_and_metadata(face):
    server = MockFarm().on("GET", "/v1/sandboxes", httpx.Response(200, json={"sandboxes": [SANDBOX]}))

    async def run(sb):
        farm = sb.farm
        assert [s.id for s in await step(farm.sandboxes.list())] == ["sb-1"]
        await step(farm.sandboxes.list(state="running", metadata={"owner": "ann", "run": "7"}))

    scenario(face, server, run)
    plain, filtered = server.sent("GET", "/v1/sandboxes")
    assert not plain.url.params
    assert dict(filtered.url.params) == {"metadata.owner": "ann", "metadata.run": "7", "state": "running"}


@pytest.mark.parametrize("face", FACES)
def test_folders_are_listed_and_paths_stated_without_exec(face):
    listing = {"path": "/srv", "entries": [ENTRY, dict(ENTRY, name="sub", type="dir")], "truncated": True}
    server = (
        MockFarm()
        .on("GET", f"{SB}/entries", httpx.Response(200, json=listing))
        .on("GET", f"{SB}/stat",
            httpx.Response(200, json=dict(ENTRY, name="/srv/link", type="symlink", target="/etc/hostname")),
            error(404, "/srv/none: no such file", field="path"),
            error(404, "no sandbox sb-1"))
    )

    async def run(sb):
        folder = await step(sb.files.list("/srv", max_entries=2))
        assert folder.truncated and folder.names == ["index.html", "sub"] and len(folder) == 2
        assert [e.is_dir for e in folder] == [False, True] and folder.entries[0].mode == 0o644
        link = await step(sb.files.stat("/srv/link"))
        assert (link.type, link.target) == ("symlink", "/etc/hostname")
        assert await step(sb.files.exists("/srv/none")) is False
        with pytest.raises(NotFound):  # the sandbox itself is gone: not a missing path
            await step(sb.files.exists("/srv/x"))

    scenario(face, server, run)
    assert dict(server.sent("GET", f"{SB}/entries")[0].url.params) == {"path": "/srv", "max": "2"}


@pytest.mark.parametrize("face", FACES)
def test_many_branches_in_one_call(face):
    many = {"sandboxes": [dict(SANDBOX, id="sb-2", parent="sb-1"), dict(SANDBOX, id="sb-3", parent="sb-1")]}
    refused = error(400, "count must be 1 to 32", field="count")
    server = MockFarm().on("POST", f"{SB}/branch", httpx.Response(201, json=many), refused)

    async def run(sb):
        branches = await step(sb.branch(count=2))
        assert [b.id for b in branches] == ["sb-2", "sb-3"] and all(type(b) is type(sb) for b in branches)
        with pytest.raises(BadRequest):
            await step(sb.branch(count=33))
        for wrong in (0, -1, True, 1.5):
            with pytest.raises(ValueError, match="count"):
                await step(sb.branch(count=wrong))

    scenario(face, server, run)
    first = server.sent("POST", f"{SB}/branch")[0]
    assert json.loads(first.content) == {"count": 2} and first.headers["Idempotency-Key"]
