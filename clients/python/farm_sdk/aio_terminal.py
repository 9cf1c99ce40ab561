"""A sandbox's terminal over a WebSocket, for asyncio: `await sb.pty()` gives an
`AsyncTerminal`, the same calls as `terminal.Terminal`, awaited.

    async with await sb.pty() as t:
        await t.send("echo hi\\n")
        await t.expect("hi")

Needs the `websockets` package (`pip install 'farm-sdk[pty]'`).
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional, Union

from . import _pty
from ._http import AsyncHTTP
from ._pty import Expected, TerminalState
from .errors import WaitTimeout

__all__ = ["AsyncTerminal"]

#: Seconds to open the socket (the service starts the program first) and get its pid.
OPEN_TIMEOUT = 120.0


class AsyncTerminal(_pty.TerminalHandle):
    """A program on a terminal in a sandbox, for asyncio (see `terminal.Terminal`)."""

    @classmethod
    async def open(
        cls,
        http: AsyncHTTP,
        sandbox_id: str,
        rows: int = 24,
        cols: int = 80,
        command: Optional[str] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        pid: Optional[int] = None,
        offset: Optional[int] = None,
        keep: bool = False,
    ) -> "AsyncTerminal":
        """See `Terminal.open`."""
        url, path, headers = _pty.address(
            http.url, http.client.headers, sandbox_id, rows, cols, command, cwd, user, pid, offset, keep
        )
        connect = _pty.async_connector()
        state = TerminalState(path)
        try:
            connection = await connect(url, additional_headers=headers, open_timeout=OPEN_TIMEOUT)
        except Exception as e:
            raise _pty.refused(e, path) from e
        try:
            state.started(await asyncio.wait_for(connection.recv(), OPEN_TIMEOUT))
        except BaseException:
            await connection.close()
            raise
        return cls(connection, state)

    async def send(self, data: Union[str, bytes]) -> None:
        await self._connection.send(_pty.keys(data))

    async def resize(self, rows: int, cols: int) -> None:
        await self._connection.send(_pty.resize_message(rows, cols))

    async def _pull(self, timeout: Optional[float]) -> None:
        try:
            message = await asyncio.wait_for(self._connection.recv(), timeout)
        except asyncio.TimeoutError as e:
            raise WaitTimeout(f"no output from the terminal (pid {self.pid}) within {timeout} s") from e
        except _pty.closed_errors():
            self._state.closed()
            return
        self._state.receive(message)

    async def recv(self, timeout: Optional[float] = None) -> bytes:
        """See `Terminal.recv`."""
        deadline = _pty.Deadline(timeout)
        while True:
            text = self._state.take_all()
            if text:
                return text.encode("utf-8")
            if self._state.ended:
                return b""
            await self._pull(deadline.left())

    async def expect(self, expected: Expected, timeout: Optional[float] = 60.0) -> str:
        """See `Terminal.expect`."""
        _pty.compile_expected(expected)
        deadline = _pty.Deadline(timeout)
        while True:
            taken = self._state.take(expected)
            if taken is not None:
                return taken
            if self._state.ended:
                raise EOFError(_pty.unseen(self._state, expected, "the terminal ended before it showed"))
            try:
                await self._pull(deadline.left())
            except WaitTimeout:
                shown = _pty.unseen(self._state, expected, f"after {timeout} s the terminal had not shown")
                raise WaitTimeout(shown) from None

    async def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """See `Terminal.wait`."""
        deadline = _pty.Deadline(timeout)
        while not self._state.ended:
            await self._pull(deadline.left())
            self._state.take_all()
        return self._state.exit_code

    async def close(self) -> None:
        await self._connection.close()

    async def __aenter__(self) -> "AsyncTerminal":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncTerminal(pid={self.pid})"
