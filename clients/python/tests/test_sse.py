"""Streamed exec: the event-stream parser, and exec_stream / iter_exec over it."""

import httpx
import pytest

from farm_sdk import ConnectionFailed, ExecResult, FarmError, Sandbox
from farm_sdk._sse import Event, SSEParser
from mock_farm import MockFarm, body, chunks, error, events, streamed

STREAM = (
    ": a keep-alive comment\n"
    "event: stdout\n"
    'data: {"data": "collecting ...\\n"}\n'
    "\n"
    "event: stderr\r\n"
    'data: {"data": "warning: é\\n"}\r\n'
    "\r\n"
    "event: note\n"
    "data: first line\n"
    "data: second line\n"
    "data:third\n"
    "\n"
    "data: unnamed\r"
    "\r"
    ": the end\n"
)
EXPECTED = [
    Event("stdout", '{"data": "collecting ...\\n"}'),
    Event("stderr", '{"data": "warning: é\\n"}'),
    Event("note", "first line\nsecond line\nthird"),
    Event("message", "unnamed"),
]


def test_events_whole():
    assert SSEParser().feed(STREAM) == EXPECTED


def test_events_split_across_chunks_at_every_point():
    for cut in range(len(STREAM) + 1):
        parser = SSEParser()
        got = parser.feed(STREAM[:cut]) + parser.feed(STREAM[cut:])
        assert got == EXPECTED, f"cut at {cut}"
    parser = SSEParser()
    assert [e for ch in STREAM for e in parser.feed(ch)] == EXPECTED


def test_an_event_is_only_given_once_its_blank_line_came():
    parser = SSEParser()
    assert parser.feed('event: exit\ndata: {"exit_code": 0}\n') == []
    assert parser.feed("\n") == [Event("exit", '{"exit_code": 0}')]


OUTPUT = events(
    ("stdout", {"data": "step 1\n"}),
    ("stderr", {"data": "warn ✓\n"}),
    ("stdout", {"data": "step 2\n"}),
    ("exit", {"exit_code": 3, "signal": None, "timed_out": False, "stdout_truncated": False,
              "stderr_truncated": False, "duration_ms": 12}),
).encode()


@pytest.mark.parametrize("size", [1, 3, 7, len(OUTPUT)])
def test_exec_stream_gives_chunks_to_callbacks_and_collects_the_result(size):
    server = MockFarm().on("POST", "/v1/sandboxes/sb-1/exec/stream", streamed(chunks(OUTPUT, size)))
    out, err = [], []
    result = Sandbox(server.farm(), "sb-1").exec_stream(
        "make", cwd="/src", timeout=30, on_stdout=out.append, on_stderr=err.append
    )
    assert "".join(out) == "step 1\nstep 2\n" and "".join(err) == "warn ✓\n"
    assert result.exit_code == 3 and not result.ok and result.duration_ms == 12
    assert result.stdout == "step 1\nstep 2\n" and result.stderr == "warn ✓\n"
    request = server.requests[0]
    assert body(request) == {"command": "make", "cwd": "/src", "timeout_secs": 30}
    assert request.headers["Accept"] == "text/event-stream"


def test_iter_exec_yields_output_then_the_result():
    server = MockFarm().on("POST", "/v1/sandboxes/sb-1/exec/stream", streamed(chunks(OUTPUT, 5)))
    items = list(Sandbox(server.farm(), "sb-1").iter_exec(["make", "-j2"]))
    assert items[:-1] == [("stdout", "step 1\n"), ("stderr", "warn ✓\n"), ("stdout", "step 2\n")]
    assert isinstance(items[-1], ExecResult) and items[-1].exit_code == 3
    assert body(server.requests[0]) == {"argv": ["make", "-j2"]}


def test_an_error_event_raises():
    stream = events(("stdout", {"data": "partial"}), ("error", {"error": "the sandbox died"})).encode()
    server = MockFarm().on("POST", "/v1/sandboxes/sb-1/exec/stream", streamed([stream]))
    seen = []
    with pytest.raises(FarmError, match="the sandbox died") as caught:
        Sandbox(server.farm(), "sb-1").exec_stream("x", on_stdout=seen.append)
    assert seen == ["partial"] and caught.value.path == "/v1/sandboxes/sb-1/exec/stream"


def test_a_stream_cut_before_the_exit_is_a_connection_failure():
    stream = events(("stdout", {"data": "partial"})).encode()
    server = MockFarm().on("POST", "/v1/sandboxes/sb-1/exec/stream", streamed([stream]))
    with pytest.raises(ConnectionFailed, match="before the command's exit"):
        Sandbox(server.farm(), "sb-1").exec_stream("x")


def test_a_streamed_exec_is_retried_only_when_refused():
    server = MockFarm().on(
        "POST", "/v1/sandboxes/sb-1/exec/stream", error(429, "busy", retry_after="1"), streamed([OUTPUT])
    )
    assert Sandbox(server.farm(), "sb-1").exec_stream("x").exit_code == 3
    assert len(server.requests) == 2
    server = MockFarm().on("POST", "/v1/sandboxes/sb-1/exec/stream", httpx.RemoteProtocolError("closed"), streamed([OUTPUT]))
    with pytest.raises(ConnectionFailed):
        Sandbox(server.farm(), "sb-1").exec_stream("x")
    assert len(server.requests) == 1
