"""A sandbox's terminal on both faces, over a stand-in WebSocket (`mock_farm.FakeSocket`): its
address and token, the first message, keys and resizes, output and `expect`, notes, the end,
a refusal before the upgrade, and what is said when websockets is missing."""

import asyncio
import inspect
import json
import re
from urllib.parse import parse_qs, urlsplit

import pytest

from farm_sdk import AsyncFarm, AsyncSandbox, AsyncTerminal, Conflict, Farm, FarmError, Sandbox, Terminal, WaitTimeout
from farm_sdk import _pty
from mock_farm import HANG, URL, FakeSocket

FACES = ["sync", "async"]
STARTED = json.dumps({"type": "started", "pid": 42})


async def step(value):
    return await value if inspect.isawaitable(value) else value


def terminal_test(face, monkeypatch, messages, run, token="s3cret"):
    """Runs `run(sandbox, socket)` on the face's sandbox `sb-1` of a service at `URL` with
    `token`, whose terminal sockets say `messages`."""
    socket = FakeSocket(messages, asynchronous=face == "async")
    name = "sync_connector" if face == "sync" else "async_connector"
    monkeypatch.setattr(_pty, name, lambda: socket.connect)
    if face == "sync":
        sandbox = Sandbox(Farm(URL, token=token), "sb-1")
    else:
        sandbox = AsyncSandbox(AsyncFarm(URL, token=token), "sb-1")
    asyncio.run(run(sandbox, socket))
    return socket


@pytest.mark.parametrize("face", FACES)
def test_a_terminal_opens_with_the_token_types_and_reads_until_it_ends(face, monkeypatch):
    messages = [STARTED, b"$ ", b"echo hi\r\nh", b"i\r\n$ ", json.dumps({"type": "dropped", "bytes": 10}),
                b"\xe2\x82", b"\xac done\r\n", json.dumps({"type": "exit", "exit_code": 0, "signal": None})]

    async def run(sb, socket):
        terminal = await step(sb.pty(rows=30, cols=100))
        assert isinstance(terminal, (Terminal, AsyncTerminal)) and terminal.pid == 42 and not terminal.ended
        await step(terminal.send("echo hi\n"))
        await step(terminal.send(b"\x03"))
        await step(terminal.resize(40, 120))
        assert await step(terminal.recv()) == b"$ "
        assert await step(terminal.expect("hi\r\n")) == "echo hi\r\n"  # the echo: past it, the output
        assert await step(terminal.expect(re.compile(r"^hi\r$", re.M))) == "hi\r"
        assert await step(terminal.expect("€ done")) == "\n$ € done"  # a character split across messages
        assert await step(terminal.wait()) == 0 and terminal.ended and terminal.dropped == 10
        assert await step(terminal.recv()) == b""
        with pytest.raises(EOFError, match="ended before it showed 'more' \\(pid 42\\)"):
            await step(terminal.expect("more"))
        await step(terminal.close())

    socket = terminal_test(face, monkeypatch, messages, run)
    url = urlsplit(socket.url)
    assert (url.scheme, url.netloc, url.path) == ("ws", "farm.test", "/v1/sandboxes/sb-1/pty")
    assert parse_qs(url.query) == {"rows": ["30"], "cols": ["100"]}
    assert socket.headers == {"authorization": "Bearer s3cret"}
    assert socket.sent == [b"echo hi\n", b"\x03", json.dumps({"type": "resize", "rows": 40, "cols": 120})]
    assert socket.closed


@pytest.mark.parametrize("face", FACES)
def test_starting_and_attaching_take_what_each_may(face, monkeypatch):
    async def run(sb, socket):
        async def opened(**options):
            terminal = await step(sb.pty(**options))
            await step(terminal.close())
            return parse_qs(urlsplit(socket.url).query)

        started = await opened(command="python3 -q", cwd="/app", user="farm", keep=True)
        assert started == {"rows": ["24"], "cols": ["80"], "command": ["python3 -q"], "cwd": ["/app"],
                           "user": ["farm"], "keep": ["true"]}
        assert await opened(pid=42, offset=7) == {"rows": ["24"], "cols": ["80"], "pid": ["42"], "offset": ["7"]}
        for wrong in ({"pid": 42, "command": "ls"}, {"pid": 42, "keep": True}, {"offset": 3}):
            with pytest.raises(ValueError):
                await step(sb.pty(**wrong))

    terminal_test(face, monkeypatch, [STARTED, STARTED], run)


@pytest.mark.parametrize("face", FACES)
def test_expect_and_recv_give_up_after_their_timeout_saying_what_was_seen(face, monkeypatch):
    async def run(sb, socket):
        terminal = await step(sb.pty())
        with pytest.raises(WaitTimeout, match=r"had not shown '>>> ' \(pid 42\); it showed: 'Python 3'"):
            await step(terminal.expect(">>> ", timeout=0.01))

    terminal_test(face, monkeypatch, [STARTED, b"Python 3", HANG], run)


@pytest.mark.parametrize("face", FACES)
def test_a_socket_closed_on_an_error_raises_it_and_a_note_alone_does_not(face, monkeypatch):
    messages = [STARTED, json.dumps({"type": "error", "error": "a text message is JSON"}), b"ok",
                json.dumps({"type": "error", "error": "sandbox sb-1 was removed"})]

    async def run(sb, socket):
        terminal = await step(sb.pty())
        assert await step(terminal.recv()) == b"ok"
        with pytest.raises(FarmError, match="the terminal closed: sandbox sb-1 was removed"):
            await step(terminal.recv())
        assert terminal.ended and terminal.exit_code is None

    terminal_test(face, monkeypatch, messages, run)


class Refused(Exception):
    """What websockets raises for an answer that is not an upgrade (its `InvalidStatus`)."""

    class response:
        status_code = 409
        body = json.dumps({"error": "process 7 has no terminal", "field": "pid"}).encode()


@pytest.mark.parametrize("face", FACES)
def test_a_refusal_before_the_upgrade_is_the_services_error(face, monkeypatch):
    def refuse(url, additional_headers, open_timeout):
        raise Refused()

    monkeypatch.setattr(_pty, "sync_connector" if face == "sync" else "async_connector", lambda: refuse)
    sandbox = Sandbox(Farm(URL), "sb-1") if face == "sync" else AsyncSandbox(AsyncFarm(URL), "sb-1")

    async def run():
        with pytest.raises(Conflict) as caught:
            await step(sandbox.pty(pid=7))
        assert caught.value.field == "pid"
        assert "GET /v1/sandboxes/sb-1/pty: 409 process 7 has no terminal" in str(caught.value)

    asyncio.run(run())


@pytest.mark.parametrize("face", FACES)
def test_a_first_message_that_is_not_started_fails_the_open_and_closes(face, monkeypatch):
    async def run(sb, socket):
        with pytest.raises(FarmError, match="did not start: no such user"):
            await step(sb.pty(user="nobody"))
        assert socket.closed

    terminal_test(face, monkeypatch, [json.dumps({"type": "error", "error": "no such user"})], run)


def test_without_websockets_the_error_says_what_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_websockets(name, *args, **kwargs):
        if name.startswith("websockets"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_websockets)
    for connector in (_pty.sync_connector, _pty.async_connector):
        with pytest.raises(ImportError, match=r"pip install 'farm-sdk\[pty\]'"):
            connector()


def test_an_https_service_gives_a_wss_socket_and_no_token_no_header():
    url, path, headers = _pty.address("https://farm.example/base/", {"User-Agent": "x"}, "sb 1", 24, 80,
                                      None, None, None, None, None, False)
    assert url == "wss://farm.example/base/v1/sandboxes/sb%201/pty?rows=24&cols=80"
    assert path == "/v1/sandboxes/sb%201/pty" and headers == {}
