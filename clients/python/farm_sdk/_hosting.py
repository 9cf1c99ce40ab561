"""What a sandbox hosts, written once for the sync and the async faces, without I/O (see
`_core`): its background processes (start, list, get, output, follow, stdin, signal, wait,
resize) and its open ports; with them the calls beside them: timers, a folder's entries and
a path's facts without exec, filtered lists, many branches in one call.

Each operation builds its request here (bodies leave out what the caller did not give) and
decodes the answer into the models of `hosting_models` and `models`.
"""

from __future__ import annotations

import math
import signal as signals
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from ._calls import Command, _given, _id, listed, run_body
from ._core import Emit, Operation, _json, read_events
from ._http import Call, new_key
from ._sse import OutputFollow
from .errors import NotFound, WaitTimeout
from .hosting_models import OutputChunk, Port, ProcessInfo
from .models import EntryInfo, FolderListing, SandboxInfo

#: The longest one wait or output read may hold its request at the service (seconds).
MAX_HOLD_SECS = 300.0
#: A signal: a name (`"TERM"`, `"SIGKILL"`), a number, or a `signal.Signals`.
Signal = Union[str, int, signals.Signals]
#: A terminal's size: (rows, columns).
Size = Tuple[int, int]
_EVENTS = "text/event-stream"


def _sandbox(sandbox_id: str) -> str:
    return f"/v1/sandboxes/{_id(sandbox_id)}"


def _process(sandbox_id: str, pid: int) -> str:
    return f"{_sandbox(sandbox_id)}/processes/{int(pid)}"


def _text(data: Union[str, bytes], what: str) -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} must be UTF-8 text: the API carries it as a JSON string") from e


def signal_name(signal: Signal) -> str:
    """What the service takes for a signal: a name or a number, as text."""
    if isinstance(signal, bool) or not isinstance(signal, (str, int)):
        raise TypeError(f"a signal is a name or a number, not {signal!r}")
    if isinstance(signal, int):  # a number, or a signal.Signals
        return str(int(signal))
    return signal


def _size(size: Size) -> Dict[str, int]:
    rows, cols = size
    return {"rows": int(rows), "cols": int(cols)}


# Requests.


def start_call(
    sandbox_id: str,
    command: Command,
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
    user: Optional[str],
    ring_bytes: Optional[int],
    pty: Optional[Size],
) -> Call:
    """A start is never sent again once it may have reached the service (the process may be
    running); a 429 or 503 is retried."""
    body = run_body(command, cwd, env, user, ring_bytes=ring_bytes, pty=_size(pty) if pty is not None else None)
    return Call("POST", f"{_sandbox(sandbox_id)}/processes", json=body, resend=False)


def output_call(sandbox_id: str, pid: int, stream: str, offset: int, max_bytes: Optional[int], wait: float) -> Call:
    if stream not in ("stdout", "stderr"):
        raise ValueError(f"stream must be 'stdout' or 'stderr', not {stream!r}")
    hold = max(0.0, min(float(wait), MAX_HOLD_SECS))
    params: Dict[str, Any] = {"stream": stream, "offset": int(offset), "wait": hold}
    if max_bytes is not None:
        params["max"] = int(max_bytes)
    return Call("GET", f"{_process(sandbox_id, pid)}/output", params=params, wait=math.ceil(hold))


def follow_call(sandbox_id: str, pid: int, stdout: int, stderr: int) -> Call:
    params = {"stdout": int(stdout), "stderr": int(stderr)}
    return Call("GET", f"{_process(sandbox_id, pid)}/output/stream", params=params, accept=_EVENTS)


def stdin_call(sandbox_id: str, pid: int, data: Union[str, bytes], close: bool) -> Call:
    """Not sent again once it may have arrived: the bytes would be written twice."""
    body: Dict[str, Any] = {"data": _text(data, "stdin")}
    if close:
        body["close"] = True
    return Call("POST", f"{_process(sandbox_id, pid)}/stdin", json=body, resend=False)


def signal_call(sandbox_id: str, pid: int, signal: Signal) -> Call:
    body = {"signal": signal_name(signal)}
    return Call("POST", f"{_process(sandbox_id, pid)}/signal", json=body, resend=False)


def wait_call(sandbox_id: str, pid: int, hold: float) -> Call:
    return Call("POST", f"{_process(sandbox_id, pid)}/wait", params={"timeout": hold}, wait=math.ceil(hold))


def timeout_body(
    seconds: Optional[float], idle: Optional[float], lifetime: Optional[float]
) -> Dict[str, int]:
    def whole(value: Optional[float]) -> Optional[int]:
        return None if value is None else int(math.ceil(value))

    body = _given(expires_in_secs=whole(seconds), idle_timeout_secs=whole(idle), lifetime_secs=whole(lifetime))
    if not body:
        raise ValueError("set_timeout needs seconds (from now), idle= or lifetime= (from creation)")
    return body


def list_sandboxes_call(state: Optional[str], metadata: Optional[Mapping[str, str]]) -> Call:
    params: Dict[str, Any] = {f"metadata.{k}": v for k, v in (metadata or {}).items()}
    if state is not None:
        params["state"] = state
    return Call("GET", "/v1/sandboxes", params=params or None)


# Processes.


def _listed(call: Call, key: str) -> Operation[List[Any]]:
    """The list under `key` in `call`'s answer (none when it is missing)."""
    return listed((yield from _json(call)), key)


def start_process(call: Call) -> Operation[ProcessInfo]:
    """`call` is a start, `start_call`."""
    return ProcessInfo.from_json((yield from _json(call)))


def list_processes(sandbox_id: str) -> Operation[List[ProcessInfo]]:
    listed = yield from _listed(Call("GET", f"{_sandbox(sandbox_id)}/processes"), "processes")
    return [ProcessInfo.from_json(p) for p in listed]


def get_process(sandbox_id: str, pid: int) -> Operation[ProcessInfo]:
    return ProcessInfo.from_json((yield from _json(Call("GET", _process(sandbox_id, pid)))))


def process_output(
    sandbox_id: str, pid: int, stream: str, offset: int, max_bytes: Optional[int], wait: float
) -> Operation[OutputChunk]:
    answer = yield from _json(output_call(sandbox_id, pid, stream, offset, max_bytes, wait))
    return OutputChunk.from_json(answer, stream)


def follow_output(sandbox_id: str, pid: int, stdout: int, stderr: int) -> Operation[ProcessInfo]:
    """Emits each `OutputChunk` of either stream as it comes, from the offsets given, up to
    the process's end; returns how it ended."""
    call = follow_call(sandbox_id, pid, stdout, stderr)
    return (yield from read_events(call, OutputFollow(call.method, call.path, stdout, stderr), Emit))


def send_stdin(sandbox_id: str, pid: int, data: Union[str, bytes], close: bool) -> Operation[ProcessInfo]:
    return ProcessInfo.from_json((yield from _json(stdin_call(sandbox_id, pid, data, close))))


def signal_process(sandbox_id: str, pid: int, signal: Signal) -> Operation[ProcessInfo]:
    return ProcessInfo.from_json((yield from _json(signal_call(sandbox_id, pid, signal))))


def wait_process(sandbox_id: str, pid: int, timeout: Optional[float]) -> Operation[ProcessInfo]:
    """The process once it ended: waits at the service, at most `MAX_HOLD_SECS` a request,
    for ever when `timeout` is None; past `timeout` seconds, `WaitTimeout`."""
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    while True:
        left = MAX_HOLD_SECS if deadline is None else max(0.0, deadline - time.monotonic())
        info = ProcessInfo.from_json((yield from _json(wait_call(sandbox_id, pid, min(left, MAX_HOLD_SECS)))))
        if not info.running:
            return info
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"process {pid} of sandbox {sandbox_id} is still running after {timeout} s")


def resize(sandbox_id: str, pid: int, rows: int, cols: int) -> Operation[ProcessInfo]:
    call = Call("POST", f"{_process(sandbox_id, pid)}/resize", json=_size((rows, cols)))
    return ProcessInfo.from_json((yield from _json(call)))


# Ports.


def open_port(sandbox_id: str, port: int) -> Operation[Port]:
    """Opening a port that is open gives its token again: safe to send again."""
    call = Call("POST", f"{_sandbox(sandbox_id)}/ports", json={"port": int(port)})
    return Port.from_json((yield from _json(call)))


def list_ports(sandbox_id: str) -> Operation[List[Port]]:
    return [Port.from_json(p) for p in (yield from _listed(Call("GET", f"{_sandbox(sandbox_id)}/ports"), "ports"))]


def close_port(sandbox_id: str, port: int) -> Operation[None]:
    yield Call("DELETE", f"{_sandbox(sandbox_id)}/ports/{int(port)}")


# Timers, listings, many branches.


def set_timeout(
    sandbox_id: str, seconds: Optional[float], idle: Optional[float], lifetime: Optional[float]
) -> Operation[SandboxInfo]:
    call = Call("POST", f"{_sandbox(sandbox_id)}/timeout", json=timeout_body(seconds, idle, lifetime))
    return SandboxInfo.from_json((yield from _json(call)))


def set_network(sandbox_id: str, network: Optional[str]) -> Operation[SandboxInfo]:
    call = Call("POST", f"{_sandbox(sandbox_id)}/network", json={"network": network})
    return SandboxInfo.from_json((yield from _json(call)))


def list_sandboxes(state: Optional[str], metadata: Optional[Mapping[str, str]]) -> Operation[List[SandboxInfo]]:
    return [SandboxInfo.from_json(s) for s in (yield from _listed(list_sandboxes_call(state, metadata), "sandboxes"))]


def stat(sandbox_id: str, path: str) -> Operation[EntryInfo]:
    call = Call("GET", f"{_sandbox(sandbox_id)}/stat", params={"path": path})
    return EntryInfo.from_json((yield from _json(call)))


def exists(sandbox_id: str, path: str) -> Operation[bool]:
    """Whether anything is at `path` (a dangling link counts). A sandbox that is not there
    is still `NotFound` (its error names no field)."""
    try:
        yield from stat(sandbox_id, path)
    except NotFound as e:
        if e.field != "path":
            raise
        return False
    return True


def list_folder(sandbox_id: str, path: str, max_entries: Optional[int]) -> Operation[FolderListing]:
    params: Dict[str, Any] = {"path": path}
    if max_entries is not None:
        params["max"] = int(max_entries)
    call = Call("GET", f"{_sandbox(sandbox_id)}/entries", params=params)
    return FolderListing.from_json((yield from _json(call)))


def branch_many(sandbox_id: str, count: int) -> Operation[List[str]]:
    """`count` branches made at once (all or none): their ids."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a whole number of branches, 1 or more; got {count!r}")
    call = Call(
        "POST", f"{_sandbox(sandbox_id)}/branch", json={"count": count}, idempotency_key=new_key()
    )
    return [SandboxInfo.from_json(s).id for s in (yield from _listed(call, "sandboxes"))]


class ProcessHandle:
    """What the sync and async handles of a background process share: the service's last
    answer about it (`info`, updated by each call) and what it says. `pid` stays the
    process's handle after a branch, a pause and a resume."""

    def __init__(self, http: Any, sandbox_id: str, info: ProcessInfo) -> None:
        self._http = http
        self.sandbox_id = sandbox_id
        self.info = info

    @property
    def pid(self) -> int:
        return self.info.pid

    @property
    def running(self) -> bool:
        return self.info.running

    @property
    def exit_code(self) -> Optional[int]:
        return self.info.exit_code

    def _update(self, info: ProcessInfo) -> ProcessInfo:
        self.info = info
        return info
