"""A sandbox's terminal, `GET /v1/sandboxes/{id}/pty` (a WebSocket), without I/O: its
address, the client's messages, what the service's messages mean (`TerminalState`), and
how `recv`, `expect` and `wait` read them (`receive`, `expect`, `wait`), for the sync
`terminal.Terminal` and the async `aio_terminal.AsyncTerminal`.

On the socket, binary messages are the terminal's bytes both ways. Text messages are JSON:
the client's `{"type": "resize", "rows", "cols"}` and `{"type": "input", "data"}`; the
service's `started` (first, with the pid), `dropped` (output that overflowed the ring),
`exit` (the program ended; the socket closes) and `error`.

The WebSocket client is the `websockets` package (`pip install 'farm-sdk[pty]'`), imported
only when a terminal is opened.
"""

from __future__ import annotations

import codecs
import json
import re
import time
from typing import Any, Callable, Dict, Generator, List, Optional, Pattern, Tuple, Type, TypeVar, Union
from urllib.parse import urlencode, urlsplit, urlunsplit

from ._calls import _id
from .errors import ConnectionFailed, FarmError, WaitTimeout, error_from_answer

T = TypeVar("T")
#: What `Terminal.expect` looks for: text, or a compiled regular expression.
Expected = Union[str, Pattern[str]]
#: A terminal's reading that ends with a `T` (see `receive`, `expect` and `wait`).
Reading = Generator[Optional[float], None, T]
#: The most characters of output an `expect` that failed shows.
_SHOWN = 2000
_MISSING = (
    "a sandbox's terminal needs the websockets package (13 or later), which farm-sdk does not "
    "install by default: pip install 'farm-sdk[pty]' (or pip install websockets)"
)


def sync_connector() -> Callable[..., Any]:
    """`websockets.sync.client.connect`, or ImportError saying what to install."""
    try:
        from websockets.sync.client import connect
    except ImportError as e:
        raise ImportError(_MISSING) from e
    return connect


def async_connector() -> Callable[..., Any]:
    """`websockets.asyncio.client.connect`, or ImportError saying what to install."""
    try:
        from websockets.asyncio.client import connect
    except ImportError as e:
        raise ImportError(_MISSING) from e
    return connect


def address(
    base_url: str,
    headers: Any,
    sandbox_id: str,
    rows: int,
    cols: int,
    command: Optional[str],
    cwd: Optional[str],
    user: Optional[str],
    pid: Optional[int],
    offset: Optional[int],
    keep: bool,
) -> Tuple[str, str, Dict[str, str]]:
    """The socket's URL, its path (for errors) and the headers to send (the bearer token of
    the client's `headers`, when it has one). Attaching (`pid`) takes the size and `offset`
    only; starting takes the rest."""
    if pid is not None and (command is not None or cwd is not None or user is not None or keep):
        raise ValueError(
            "attaching to a process (pid=) takes rows, cols and offset only, not command, cwd, user or keep"
        )
    if pid is None and offset is not None:
        raise ValueError("offset is for attaching to a process (pid=)")
    query: Dict[str, Any] = {"rows": int(rows), "cols": int(cols)}
    for name, value in (("command", command), ("cwd", cwd), ("user", user), ("pid", pid), ("offset", offset)):
        if value is not None:
            query[name] = value
    if keep:
        query["keep"] = "true"
    path = f"/v1/sandboxes/{_id(sandbox_id)}/pty"
    base = urlsplit(base_url)
    scheme = {"http": "ws", "https": "wss"}.get(base.scheme, base.scheme)
    url = urlunsplit((scheme, base.netloc, base.path.rstrip("/") + path, urlencode(query), ""))
    sent = {k: v for k, v in dict(headers).items() if k.lower() == "authorization"}
    return url, path, sent


def refused(error: BaseException, path: str) -> FarmError:
    """The `FarmError` of a socket that did not open: the service's answer (a 4xx or 5xx
    before the upgrade, with its message), or a connection that failed."""
    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int):
        body = getattr(response, "body", b"") or b""
        return error_from_answer(status, bytes(body), "GET", path)
    failed = ConnectionFailed(f"the terminal's socket did not open: {error or type(error).__name__}", "GET", path)
    failed.__cause__ = error
    return failed


def resize_message(rows: int, cols: int) -> str:
    return json.dumps({"type": "resize", "rows": int(rows), "cols": int(cols)})


def keys(data: Union[str, bytes]) -> bytes:
    """Keys as the terminal takes them (text as UTF-8)."""
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


class TerminalState:
    """What the service said on one socket: the pid, output dropped, notes, how it ended; and
    the output read but not yet taken by a `recv` or an `expect` (decoded as UTF-8 as it
    comes, a character split across messages joined)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pid: Optional[int] = None
        self.exit_code: Optional[int] = None
        self.signal: Optional[int] = None
        #: Whether the program ended (`exit`) or the socket closed.
        self.ended = False
        #: Bytes of output that overflowed the ring before they were sent.
        self.dropped = 0
        #: The service's `error` notes, in order (a bad message; why the socket closes).
        self.errors: List[str] = []
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = ""

    def started(self, message: Union[str, bytes]) -> int:
        """Takes the socket's first message: the pid of the terminal's process."""
        event = _event(message)
        if event.get("type") == "started" and isinstance(event.get("pid"), int):
            self.pid = event["pid"]
            return self.pid
        why = event.get("error") or repr(message)
        raise FarmError(None, f"the terminal did not start: {why}", method="GET", path=self.path)

    def receive(self, message: Union[str, bytes]) -> None:
        """Takes a message: output joins what is not yet taken; a note is noted."""
        if isinstance(message, bytes):
            self._pending += self._decoder.decode(message)
            return
        event = _event(message)
        kind = event.get("type")
        if kind == "dropped":
            self.dropped += int(event.get("bytes") or 0)
        elif kind == "exit":
            self.exit_code, self.signal, self.ended = event.get("exit_code"), event.get("signal"), True
        elif kind == "error":
            self.errors.append(str(event.get("error")))

    def closed(self) -> None:
        """The socket closed: raises `FarmError` when it closed on an error, before any exit."""
        was_ended, self.ended = self.ended, True
        if not was_ended and self.errors:
            raise FarmError(None, f"the terminal closed: {self.errors[-1]}", method="GET", path=self.path)

    def take(self, expected: Expected) -> Optional[str]:
        """The output up to and including the first match of `expected`, taken; None when it
        has not come yet."""
        if isinstance(expected, str):
            at = self._pending.find(expected)
            end = -1 if at < 0 else at + len(expected)
        else:
            match = expected.search(self._pending)
            end = -1 if match is None else match.end()
        if end < 0:
            return None
        taken, self._pending = self._pending[:end], self._pending[end:]
        return taken

    def take_all(self) -> str:
        """All the output not yet taken, taken."""
        taken, self._pending = self._pending, ""
        return taken

    def seen(self) -> str:
        """The output read and not yet taken (what an `expect` that failed saw)."""
        return self._pending



def compile_expected(expected: Expected) -> Expected:
    if not isinstance(expected, (str, re.Pattern)):
        raise TypeError(f"expect takes text or a compiled regular expression, not {type(expected).__name__}")
    return expected


def unseen(state: TerminalState, expected: Expected, what: str) -> str:
    """Why an `expect` failed: what it looked for, and the end of what the terminal showed."""
    wanted = repr(expected) if isinstance(expected, str) else f"/{expected.pattern}/"
    shown = state.seen()[-_SHOWN:]
    return f"{what} {wanted} (pid {state.pid}); it showed: {shown!r}"


def closed_errors() -> Tuple[Type[BaseException], ...]:
    """What a connection raises once the socket closed: websockets' `ConnectionClosed` (when
    websockets is there), and `EOFError`."""
    try:
        from websockets.exceptions import ConnectionClosed
    except ImportError:
        return (EOFError,)
    return (ConnectionClosed, EOFError)


class Deadline:
    """Seconds left of a timeout (None: no end)."""

    def __init__(self, timeout: Optional[float]) -> None:
        self._end = None if timeout is None else time.monotonic() + timeout

    def left(self) -> Optional[float]:
        return None if self._end is None else max(0.0, self._end - time.monotonic())


# What `recv`, `expect` and `wait` do, written once for both terminals: each is a generator
# that yields the timeout of every message it needs read (the terminal's `_pull`, which may
# throw `WaitTimeout` in at the `yield`) and returns the call's result.


def receive(state: TerminalState, timeout: Optional[float]) -> Reading[bytes]:
    """`recv`: the output not yet taken, as soon as there is some; b"" once the terminal
    ended."""
    deadline = Deadline(timeout)
    while True:
        text = state.take_all()
        if text:
            return text.encode("utf-8")
        if state.ended:
            return b""
        yield deadline.left()


def expect(state: TerminalState, expected: Expected, timeout: Optional[float]) -> Reading[str]:
    """`expect`: the output up to and including `expected`, taken. `WaitTimeout` past
    `timeout`, `EOFError` when the terminal ends first; both say what was seen."""
    compile_expected(expected)
    deadline = Deadline(timeout)
    while True:
        taken = state.take(expected)
        if taken is not None:
            return taken
        if state.ended:
            raise EOFError(unseen(state, expected, "the terminal ended before it showed"))
        try:
            yield deadline.left()
        except WaitTimeout:
            raise WaitTimeout(unseen(state, expected, f"after {timeout} s the terminal had not shown")) from None


def wait(state: TerminalState, timeout: Optional[float]) -> Reading[Optional[int]]:
    """`wait`: the output read (and dropped) until the program ends; its exit code."""
    deadline = Deadline(timeout)
    while not state.ended:
        yield deadline.left()
        state.take_all()
    return state.exit_code


def _event(message: Union[str, bytes]) -> Dict[str, Any]:
    try:
        event = json.loads(message)
    except ValueError:
        return {"type": "error", "error": f"not JSON: {message!r}"}
    return event if isinstance(event, dict) else {"type": "error", "error": f"not an event: {message!r}"}


class TerminalHandle:
    """What the sync and async terminals share: the socket, and what its messages said so
    far (`TerminalState`)."""

    def __init__(self, connection: Any, state: TerminalState) -> None:
        self._connection = connection
        self._state = state

    @property
    def pid(self) -> int:
        return self._state.pid or 0

    @property
    def exit_code(self) -> Optional[int]:
        """The program's exit code once it ended (None while it runs, or when a signal ended it)."""
        return self._state.exit_code

    @property
    def signal(self) -> Optional[int]:
        return self._state.signal

    @property
    def ended(self) -> bool:
        """Whether the program ended or the socket closed."""
        return self._state.ended

    @property
    def dropped(self) -> int:
        """Bytes of output that overflowed the program's ring before they were sent."""
        return self._state.dropped
