"""What a sandbox hosts, for asyncio: `sb.processes` and `sb.ports` of an `AsyncSandbox`,
the same calls as `hosting`'s, awaited.

    server = await sb.processes.start("python3 -m http.server 8000", cwd="/srv")
    port = await sb.ports.open(8000)
    async with port.async_client() as client:
        print((await client.get("/")).status_code)
    async for chunk in server.follow():
        print(chunk.stream, chunk.data, end="")
"""

from __future__ import annotations

from typing import AsyncIterator, List, Mapping, Optional, Tuple, Union

from . import _hosting as hosting
from ._calls import Command
from ._effects import aiterate, arun
from ._hosting import Signal
from ._http import AsyncHTTP
from .hosting_models import OutputChunk, Port, ProcessInfo

__all__ = ["AsyncProcesses", "AsyncProcess", "AsyncPorts"]


class AsyncProcesses:
    """`sb.processes`: programs that run in the background of a sandbox, past the request
    that started them (servers, watchers, long jobs). They live in the guest: a branch, a
    pause and a resume keep them, pids and output included."""

    def __init__(self, http: AsyncHTTP, sandbox_id: str) -> None:
        self._http = http
        self._sandbox_id = sandbox_id

    async def start(
        self,
        command: Command,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        ring_bytes: Optional[int] = None,
        pty: Optional[Tuple[int, int]] = None,
    ) -> "AsyncProcess":
        """Starts `command` (a shell string, or an argv list) and returns its handle at once.
        Each output stream keeps its last `ring_bytes` (default 1 MiB, at most 16 MiB).
        `pty=(rows, cols)` runs it on a terminal (one output stream, `stdout`; attach with
        `sb.pty(pid=...)`)."""
        call = hosting.start_call(self._sandbox_id, command, cwd, env, user, ring_bytes, pty)
        return AsyncProcess(self._http, self._sandbox_id, await arun(self._http, hosting.start_process(call)))

    async def list(self) -> List["AsyncProcess"]:
        """The sandbox's processes, running and recently ended."""
        infos = await arun(self._http, hosting.list_processes(self._sandbox_id))
        return [AsyncProcess(self._http, self._sandbox_id, info) for info in infos]

    async def get(self, pid: int) -> "AsyncProcess":
        """The handle of process `pid`, started by anyone (`NotFound` when there is none)."""
        info = await arun(self._http, hosting.get_process(self._sandbox_id, pid))
        return AsyncProcess(self._http, self._sandbox_id, info)


class AsyncProcess(hosting.ProcessHandle):
    """A background process of a sandbox. `info` is what the service said last (each call
    updates it); `pid` stays its handle after a branch, a pause and a resume."""

    _http: AsyncHTTP

    async def refresh(self) -> ProcessInfo:
        """Asks the service how the process is now."""
        return self._update(await arun(self._http, hosting.get_process(self.sandbox_id, self.pid)))

    async def wait(self, timeout: Optional[float] = None) -> ProcessInfo:
        """Waits for the process to end (for ever when `timeout` is None): how it ended.
        `WaitTimeout` when it still runs after `timeout` seconds."""
        return self._update(await arun(self._http, hosting.wait_process(self.sandbox_id, self.pid, timeout)))

    async def output(
        self, stream: str = "stdout", offset: int = 0, max_bytes: Optional[int] = None, wait: float = 0
    ) -> OutputChunk:
        """Output of `stream` from byte `offset` (up to `max_bytes`, default 1 MiB), waiting up
        to `wait` seconds (at most 300) for a byte past it. Read on from `chunk.next`."""
        operation = hosting.process_output(self.sandbox_id, self.pid, stream, offset, max_bytes, wait)
        return await arun(self._http, operation)

    async def follow(self, stdout: int = 0, stderr: int = 0) -> AsyncIterator[OutputChunk]:
        """The output of both streams as it comes, from these offsets, until the process ends
        (`info` then says how). Leaving the loop early closes the stream."""
        async for item in aiterate(self._http, hosting.follow_output(self.sandbox_id, self.pid, stdout, stderr)):
            if isinstance(item, ProcessInfo):
                self._update(item)
            else:
                yield item

    async def send_stdin(self, data: Union[str, bytes], close: bool = False) -> ProcessInfo:
        """Writes `data` (text; bytes must be UTF-8) to its standard input, then closes it
        when `close`. A write after the close is a `Conflict`."""
        return self._update(await arun(self._http, hosting.send_stdin(self.sandbox_id, self.pid, data, close)))

    async def close_stdin(self) -> ProcessInfo:
        return await self.send_stdin("", close=True)

    async def signal(self, signal: Signal) -> ProcessInfo:
        """Sends its process group `signal`: a name (`"TERM"`, `"SIGINT"`), a number, or a
        `signal.Signals`."""
        return self._update(await arun(self._http, hosting.signal_process(self.sandbox_id, self.pid, signal)))

    async def kill(self) -> ProcessInfo:
        """SIGKILL to its process group."""
        return await self.signal("KILL")

    async def resize(self, rows: int, cols: int) -> ProcessInfo:
        """A new size for the terminal of a process started with `pty`."""
        return self._update(await arun(self._http, hosting.resize(self.sandbox_id, self.pid, rows, cols)))

    def __repr__(self) -> str:
        return f"AsyncProcess({self.pid}, {self.info.state!r}, {self.info.command!r})"


class AsyncPorts:
    """`sb.ports`: the sandbox's services on its own `127.0.0.1:PORT`, reached from outside
    through the service's port listener with a token per port."""

    def __init__(self, http: AsyncHTTP, sandbox_id: str) -> None:
        self._http = http
        self._sandbox_id = sandbox_id

    async def open(self, port: int) -> Port:
        """Opens `port` (the same token again when it is open): its `url`, `token`, `address`
        and `headers`. Nothing needs to listen yet; until something does, requests get 502."""
        return await arun(self._http, hosting.open_port(self._sandbox_id, port))

    async def list(self) -> List[Port]:
        return await arun(self._http, hosting.list_ports(self._sandbox_id))

    async def close(self, port: int) -> None:
        """Closes `port`: its token stops working (`NotFound` when it was not open)."""
        await arun(self._http, hosting.close_port(self._sandbox_id, port))
