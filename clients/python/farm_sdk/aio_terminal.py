"""A sandbox's terminal over a WebSocket, for asyncio: `await sb.pty()` gives an
`AsyncTerminal`, the same calls as `terminal.Terminal`, awaited.

    async with await sb.pty() as t:
        await t.send("echo hi\\n")
        await t.expect("hi")

Needs the `websockets` package (`pip install 'farm-sdk[pty]'`).
"""

from __future__ import annotations

import asyncio
from typing import Optional, TypeVar, Union, cast

from . import _pty
from ._core import Progress
from ._http import AsyncHTTP
from ._pty import Expected, TerminalState
from .errors import WaitTimeout

__all__ = ["AsyncTerminal"]

T = TypeVar("T")

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
        return await self._read(_pty.receive(self._state, timeout))

    async def expect(self, expected: Expected, timeout: Optional[float] = 60.0) -> str:
        """See `Terminal.expect`."""
        return await self._read(_pty.expect(self._state, expected, timeout))

    async def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """See `Terminal.wait`."""
        return await self._read(_pty.wait(self._state, timeout))

    async def _read(self, reading: _pty.Reading[T]) -> T:
        """See `Terminal._read`."""
        with Progress(reading) as progress:
            while not progress.done:
                try:
                    await self._pull(progress.effect)
                except WaitTimeout as e:
                    progress.fail(e)
                else:
                    progress.answer(None)
        return cast(T, progress.value)

    async def close(self) -> None:
        await self._connection.close()

    async def __aenter__(self) -> "AsyncTerminal":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncTerminal(pid={self.pid})"
