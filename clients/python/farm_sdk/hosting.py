"""What a sandbox hosts, for the sync client: `sb.processes` (background processes, each a
`Process` handle) and `sb.ports` (open ports).

    server = sb.processes.start("python3 -m http.server 8000", cwd="/srv")
    port = sb.ports.open(8000)
    print(port.request("GET", "/").status_code)
    for chunk in server.follow():                  # its output as it comes, to its end
        print(chunk.stream, chunk.data, end="")
"""

from __future__ import annotations

from typing import Iterator, List, Mapping, Optional, Tuple, Union

from . import _hosting as hosting
from ._calls import Command
from ._effects import iterate, run
from ._hosting import Signal
from ._http import SyncHTTP
from .hosting_models import OutputChunk, Port, ProcessInfo

__all__ = ["Processes", "Process", "Ports"]


class Processes:
    """`sb.processes`: programs that run in the background of a sandbox, past the request
    that started them (servers, watchers, long jobs). They live in the guest: a branch, a
    pause and a resume keep them, pids and output included."""

    def __init__(self, http: SyncHTTP, sandbox_id: str) -> None:
        self._http = http
        self._sandbox_id = sandbox_id

    def start(
        self,
        command: Command,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        ring_bytes: Optional[int] = None,
        pty: Optional[Tuple[int, int]] = None,
    ) -> "Process":
        """Starts `command` (a shell string, or an argv list) and returns its handle at once.
        Each output stream keeps its last `ring_bytes` (default 1 MiB, at most 16 MiB).
        `pty=(rows, cols)` runs it on a terminal (one output stream, `stdout`; attach with
        `sb.pty(pid=...)`)."""
        call = hosting.start_call(self._sandbox_id, command, cwd, env, user, ring_bytes, pty)
        return Process(self._http, self._sandbox_id, run(self._http, hosting.start_process(call)))

    def list(self) -> List["Process"]:
        """The sandbox's processes, running and recently ended."""
        infos = run(self._http, hosting.list_processes(self._sandbox_id))
        return [Process(self._http, self._sandbox_id, info) for info in infos]

    def get(self, pid: int) -> "Process":
        """The handle of process `pid`, started by anyone (`NotFound` when there is none)."""
        info = run(self._http, hosting.get_process(self._sandbox_id, pid))
        return Process(self._http, self._sandbox_id, info)


class Process(hosting.ProcessHandle):
    """A background process of a sandbox. `info` is what the service said last (each call
    updates it); `pid` stays its handle after a branch, a pause and a resume."""

    _http: SyncHTTP

    def refresh(self) -> ProcessInfo:
        """Asks the service how the process is now."""
        return self._update(run(self._http, hosting.get_process(self.sandbox_id, self.pid)))

    def wait(self, timeout: Optional[float] = None) -> ProcessInfo:
        """Waits for the process to end (for ever when `timeout` is None): how it ended.
        `WaitTimeout` when it still runs after `timeout` seconds."""
        return self._update(run(self._http, hosting.wait_process(self.sandbox_id, self.pid, timeout)))

    def output(
        self, stream: str = "stdout", offset: int = 0, max_bytes: Optional[int] = None, wait: float = 0
    ) -> OutputChunk:
        """Output of `stream` from byte `offset` (up to `max_bytes`, default 1 MiB), waiting up
        to `wait` seconds (at most 300) for a byte past it. Read on from `chunk.next`."""
        operation = hosting.process_output(self.sandbox_id, self.pid, stream, offset, max_bytes, wait)
        return run(self._http, operation)

    def follow(self, stdout: int = 0, stderr: int = 0) -> Iterator[OutputChunk]:
        """The output of both streams as it comes, from these offsets, until the process ends
        (`info` then says how). Leaving the loop early closes the stream."""
        for item in iterate(self._http, hosting.follow_output(self.sandbox_id, self.pid, stdout, stderr)):
            if isinstance(item, ProcessInfo):
                self._update(item)
            else:
                yield item

    def send_stdin(self, data: Union[str, bytes], close: bool = False) -> ProcessInfo:
        """Writes `data` (text; bytes must be UTF-8) to its standard input, then closes it
        when `close`. A write after the close is a `Conflict`."""
        return self._update(run(self._http, hosting.send_stdin(self.sandbox_id, self.pid, data, close)))

    def close_stdin(self) -> ProcessInfo:
        return self.send_stdin("", close=True)

    def signal(self, signal: Signal) -> ProcessInfo:
        """Sends its process group `signal`: a name (`"TERM"`, `"SIGINT"`), a number, or a
        `signal.Signals`."""
        return self._update(run(self._http, hosting.signal_process(self.sandbox_id, self.pid, signal)))

    def kill(self) -> ProcessInfo:
        """SIGKILL to its process group."""
        return self.signal("KILL")

    def resize(self, rows: int, cols: int) -> ProcessInfo:
        """A new size for the terminal of a process started with `pty`."""
        return self._update(run(self._http, hosting.resize(self.sandbox_id, self.pid, rows, cols)))

    def __repr__(self) -> str:
        return f"Process({self.pid}, {self.info.state!r}, {self.info.command!r})"


class Ports:
    """`sb.ports`: the sandbox's services on its own `127.0.0.1:PORT`, reached from outside
    through the service's port listener with a token per port."""

    def __init__(self, http: SyncHTTP, sandbox_id: str) -> None:
        self._http = http
        self._sandbox_id = sandbox_id

    def open(self, port: int) -> Port:
        """Opens `port` (the same token again when it is open): its `url`, `token`, `address`
        and `headers`. Nothing needs to listen yet; until something does, requests get 502."""
        return run(self._http, hosting.open_port(self._sandbox_id, port))

    def list(self) -> List[Port]:
        return run(self._http, hosting.list_ports(self._sandbox_id))

    def close(self, port: int) -> None:
        """Closes `port`: its token stops working (`NotFound` when it was not open)."""
        run(self._http, hosting.close_port(self._sandbox_id, port))
