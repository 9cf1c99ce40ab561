"""A sandbox's terminal over a WebSocket, for the sync client: `sb.pty()` gives a `Terminal`.

    with sb.pty(rows=24, cols=80) as t:          # a login shell (bash when the image has it)
        t.send("python3 -q\\n")
        t.expect(">>> ")
        t.send("print(6 * 7)\\n")
        t.expect("42")

Needs the `websockets` package (`pip install 'farm-sdk[pty]'`).
"""

from __future__ import annotations

from typing import Optional, TypeVar, Union, cast

from . import _pty
from ._core import Progress
from ._http import SyncHTTP
from ._pty import Expected, TerminalState
from .errors import WaitTimeout

__all__ = ["Terminal"]

T = TypeVar("T")

#: Seconds to open the socket (the service starts the program first) and get its pid.
OPEN_TIMEOUT = 120.0


class Terminal(_pty.TerminalHandle):
    """A program on a terminal in a sandbox, through one WebSocket: `send` keys, `recv` or
    `expect` its output, `resize`, `close` (the program is hung up on unless it was started
    with `keep=True`). `pid` is its background process: `sb.processes.get(pid)`, or attach
    again with `sb.pty(pid=...)`."""

    @classmethod
    def open(
        cls,
        http: SyncHTTP,
        sandbox_id: str,
        rows: int = 24,
        cols: int = 80,
        command: Optional[str] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        pid: Optional[int] = None,
        offset: Optional[int] = None,
        keep: bool = False,
    ) -> "Terminal":
        """Opens the socket and reads the pid of the program it started or attached to
        (`sb.pty(...)` is this with the sandbox's client)."""
        url, path, headers = _pty.address(
            http.url, http.client.headers, sandbox_id, rows, cols, command, cwd, user, pid, offset, keep
        )
        connect = _pty.sync_connector()
        state = TerminalState(path)
        try:
            connection = connect(url, additional_headers=headers, open_timeout=OPEN_TIMEOUT)
        except Exception as e:
            raise _pty.refused(e, path) from e
        try:
            state.started(connection.recv(timeout=OPEN_TIMEOUT))
        except BaseException:
            connection.close()
            raise
        return cls(connection, state)

    def send(self, data: Union[str, bytes]) -> None:
        """Keys to the program (text as UTF-8; `"\\x03"` is Ctrl-C)."""
        self._connection.send(_pty.keys(data))

    def resize(self, rows: int, cols: int) -> None:
        self._connection.send(_pty.resize_message(rows, cols))

    def _pull(self, timeout: Optional[float]) -> None:
        """Reads one message into the state; `WaitTimeout` when none came in `timeout` s."""
        try:
            message = self._connection.recv(timeout=timeout)
        except TimeoutError as e:
            raise WaitTimeout(f"no output from the terminal (pid {self.pid}) within {timeout} s") from e
        except _pty.closed_errors():
            self._state.closed()
            return
        self._state.receive(message)

    def recv(self, timeout: Optional[float] = None) -> bytes:
        """The output not yet taken (by `recv` or `expect`), as soon as there is some; b""
        once the program ended or the socket closed (`exit_code` is then set). `WaitTimeout`
        when nothing came within `timeout` seconds."""
        return self._read(_pty.receive(self._state, timeout))

    def expect(self, expected: Expected, timeout: Optional[float] = 60.0) -> str:
        """Reads until the output not yet taken shows `expected` (text, or a compiled regular
        expression): that output up to and including it, taken. `WaitTimeout` past `timeout`
        seconds, `EOFError` when the program ends first; both say what was seen."""
        return self._read(_pty.expect(self._state, expected, timeout))

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Reads the output (and drops it) until the program ends: its exit code."""
        return self._read(_pty.wait(self._state, timeout))

    def _read(self, reading: _pty.Reading[T]) -> T:
        """Runs `reading`, pulling each message it needs."""
        with Progress(reading) as progress:
            while not progress.done:
                try:
                    self._pull(progress.effect)
                except WaitTimeout as e:
                    progress.fail(e)
                else:
                    progress.answer(None)
        return cast(T, progress.value)

    def close(self) -> None:
        """Closes the socket: the program is hung up on unless it was started with `keep`."""
        self._connection.close()

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Terminal(pid={self.pid})"
