"""The asyncio client of the sandbox API: `AsyncFarm` and `AsyncSandbox`, the same calls as
`Farm` and `Sandbox`, awaited.

    async with AsyncFarm() as farm:
        env = await farm.environments.create(image="python:3.12-slim")
        async with farm.sandboxes.create(env) as sb:
            print((await sb.exec("python3 -V")).stdout)

`farm.sandboxes.create(...)` can be awaited (`sb = await ...`) or entered directly
(`async with farm.sandboxes.create(...) as sb`); either way an `AsyncSandbox` used with
`async with` is killed on leaving. Callbacks (`on_log`, `on_stdout`, `on_stderr`) may be
plain functions or coroutine functions.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, AsyncIterator, Awaitable, Dict, Generator, List, Mapping, Optional, Sequence, Type, Union, overload


from . import _calls as calls
from . import _core as core
from . import _events as events
from . import _workspaces as workspaces_ops
from . import _hosting as hosting
from ._calls import Command, EnvironmentRef
from ._core import Callback, ExecItem
from ._effects import aiterate as _iterate
from ._effects import arun as _run
from ._http import AsyncClient, AsyncHTTP
from .aio_hosting import AsyncPorts, AsyncProcesses
from .aio_terminal import AsyncTerminal
from .workspaces import AsyncWorkspaces
from .models import AsyncEnvironment, Context, EntryInfo, ExecResult, FolderListing, LogPage, ResetInfo, SandboxInfo

__all__ = ["AsyncFarm", "AsyncEnvironments", "AsyncSandboxes", "AsyncSandbox", "AsyncFiles", "AsyncWorkspaces"]


class AsyncFarm(AsyncClient):
    """One `farm serve` service, for asyncio (see `Farm` for the arguments; `transport` is
    an `httpx.AsyncBaseTransport`)."""

    environments: "AsyncEnvironments"
    sandboxes: "AsyncSandboxes"
    workspaces: "AsyncWorkspaces"

    def _opened(self) -> None:
        self.environments = AsyncEnvironments(self._http)
        self.sandboxes = AsyncSandboxes(self)
        self.workspaces = AsyncWorkspaces(self._http)

    async def events(self, after: int = 0, sandbox: Optional[str] = None, limit: int = 100) -> Dict[str, Any]:
        """See `Farm.events`."""
        return await _run(self._http, events.list_events(after, sandbox, limit))

    async def follow_events(
        self, after: Optional[int] = None, sandbox: Optional[str] = None
    ) -> AsyncIterator[Dict[str, Any]]:
        """See `Farm.follow_events`."""
        async for item in _iterate(self._http, events.follow_events(after, sandbox)):
            if isinstance(item, dict):
                yield item

    async def add_webhook(self, url: str) -> Dict[str, Any]:
        return await _run(self._http, events.add_webhook(url))

    async def webhooks(self) -> List[Dict[str, Any]]:
        return await _run(self._http, events.webhooks())

    async def delete_webhook(self, webhook_id: str) -> None:
        await _run(self._http, events.delete_webhook(webhook_id))


class AsyncEnvironments:
    """`farm.environments` of an `AsyncFarm` (see `Environments`)."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    def _environment(self, answer: object) -> AsyncEnvironment:
        return AsyncEnvironment.from_json(answer, self)

    async def create(
        self,
        image: str,
        cpus: Optional[int] = None,
        memory_mib: Optional[int] = None,
        disk_mib: Optional[int] = None,
        setup: Optional[Sequence[str]] = None,
        force: bool = False,
        wait: bool = True,
        on_log: Optional[Callback] = None,
        timeout: Optional[float] = None,
    ) -> AsyncEnvironment:
        """See `Environments.create`."""
        options = calls.environment_options(cpus, memory_mib, disk_mib, setup, force)
        return await _run(self._http, core.create_environment(self._environment, image, options, wait, on_log, timeout))

    async def upload_context(self, context_dir: str) -> Context:
        """See `Environments.upload_context`."""
        return await _run(self._http, core.upload_context(context_dir))

    async def from_dockerfile(
        self,
        context_dir: str,
        dockerfile: str = "Dockerfile",
        build_args: Optional[Mapping[str, str]] = None,
        target: Optional[str] = None,
        cpus: Optional[int] = None,
        memory_mib: Optional[int] = None,
        disk_mib: Optional[int] = None,
        setup: Optional[Sequence[str]] = None,
        force: bool = False,
        wait: bool = True,
        on_log: Optional[Callback] = None,
        timeout: Optional[float] = None,
    ) -> AsyncEnvironment:
        """See `Environments.from_dockerfile`."""
        options = calls.environment_options(cpus, memory_mib, disk_mib, setup, force)
        return await _run(self._http, core.environment_from_dockerfile(
            self._environment, context_dir, dockerfile, build_args, target, options, wait, on_log, timeout
        ))

    async def get(self, environment_id: str) -> AsyncEnvironment:
        return await _run(self._http, core.get_environment(self._environment, environment_id))

    async def list(self) -> List[AsyncEnvironment]:
        return await _run(self._http, core.list_environments(self._environment))

    async def delete(self, environment_id: str) -> None:
        await _run(self._http, core.delete_environment(environment_id))

    async def logs(self, environment_id: str, offset: int = 0, wait: float = 0) -> LogPage:
        return await _run(self._http, core.environment_logs(environment_id, offset, wait))

    async def wait(
        self, environment_id: str, on_log: Optional[Callback] = None, timeout: Optional[float] = None
    ) -> AsyncEnvironment:
        """See `Environments.wait`."""
        return await _run(self._http, core.wait_for_build(self._environment, environment_id, on_log, timeout))


class AsyncSandboxes:
    """`farm.sandboxes` of an `AsyncFarm` (see `Sandboxes`)."""

    def __init__(self, farm: AsyncFarm) -> None:
        self._farm = farm

    def create(
        self,
        environment: EnvironmentRef,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        user: Optional[str] = None,
        network: Optional[str] = None,
        disk_mib: Optional[int] = None,
        idle_timeout_secs: Optional[int] = None,
        lifetime_secs: Optional[int] = None,
        cpus: Optional[int] = None,
        memory_mib: Optional[int] = None,
        metadata: Optional[Mapping[str, str]] = None,
        keep: Optional[Mapping[str, Any]] = None,
        on_timeout: Optional[str] = None,
        workspaces: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> "SandboxCreation":
        """A new sandbox: `sb = await farm.sandboxes.create(...)`, or
        `async with farm.sandboxes.create(...) as sb` to kill it on leaving."""
        options = calls.sandbox_options(
            env, workdir, user, network, disk_mib, idle_timeout_secs, lifetime_secs, cpus, memory_mib, metadata,
            keep, on_timeout, workspaces,
        )
        return SandboxCreation(self._sandbox(core.create_sandbox(environment, options)))

    async def _sandbox(self, operation: core.Operation[str]) -> "AsyncSandbox":
        """The sandbox whose id `operation` gives."""
        return AsyncSandbox(self._farm, await _run(self._farm._http, operation))

    async def get(self, sandbox_id: str) -> "AsyncSandbox":
        return await self._sandbox(core.get_sandbox(sandbox_id))

    async def list(
        self, state: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None
    ) -> List[SandboxInfo]:
        """See `Sandboxes.list`."""
        return await _run(self._farm._http, hosting.list_sandboxes(state, metadata))


class SandboxCreation:
    """A sandbox being created: await it for the `AsyncSandbox`, or use it with `async with`
    (the sandbox is killed on leaving)."""

    def __init__(self, creating: Awaitable["AsyncSandbox"]) -> None:
        self._creating = creating
        self._sandbox: Optional[AsyncSandbox] = None

    def __await__(self) -> Generator[Any, None, "AsyncSandbox"]:
        return self._creating.__await__()

    async def __aenter__(self) -> "AsyncSandbox":
        self._sandbox = await self._creating
        return self._sandbox

    async def __aexit__(
        self, kind: Optional[Type[BaseException]], error: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        if self._sandbox is not None:
            await self._sandbox.__aexit__(kind, error, tb)


class AsyncSandbox:
    """A live sandbox, for asyncio (see `Sandbox`)."""

    def __init__(self, farm: AsyncFarm, sandbox_id: str) -> None:
        self.farm = farm
        self.id = sandbox_id
        self.files = AsyncFiles(self)
        self.processes = AsyncProcesses(farm._http, sandbox_id)
        self.ports = AsyncPorts(farm._http, sandbox_id)

    @classmethod
    async def create(
        cls,
        environment: EnvironmentRef,
        farm: Optional[AsyncFarm] = None,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        user: Optional[str] = None,
        network: Optional[str] = None,
        disk_mib: Optional[int] = None,
        idle_timeout_secs: Optional[int] = None,
        lifetime_secs: Optional[int] = None,
        cpus: Optional[int] = None,
        memory_mib: Optional[int] = None,
        metadata: Optional[Mapping[str, str]] = None,
        keep: Optional[Mapping[str, Any]] = None,
        on_timeout: Optional[str] = None,
        workspaces: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> "AsyncSandbox":
        """`await farm.sandboxes.create(...)`, with `farm` defaulting to `AsyncFarm()`."""
        owner = farm or AsyncFarm()
        try:
            return await owner.sandboxes.create(
                environment, env, workdir, user, network, disk_mib, idle_timeout_secs, lifetime_secs, cpus,
                memory_mib, metadata, keep, on_timeout, workspaces,
            )
        except BaseException:
            if farm is None:
                await owner.close()
            raise

    @property
    def _http(self) -> AsyncHTTP:
        return self.farm._http

    async def info(self) -> SandboxInfo:
        return await _run(self._http, core.sandbox_info(self.id))

    async def exec(
        self,
        command: Command,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Union[str, bytes, None] = None,
        max_output_bytes: Optional[int] = None,
    ) -> ExecResult:
        """See `Sandbox.exec`."""
        call = calls.exec_call(self.id, command, cwd, env, user, timeout, stdin, max_output_bytes, stream=False)
        return await _run(self._http, core.exec_result(call))

    async def iter_exec(
        self,
        command: Command,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Union[str, bytes, None] = None,
        max_output_bytes: Optional[int] = None,
    ) -> AsyncIterator[ExecItem]:
        """See `Sandbox.iter_exec`: `async for item in sb.iter_exec(...)`."""
        call = calls.exec_call(self.id, command, cwd, env, user, timeout, stdin, max_output_bytes, stream=True)
        async for item in _iterate(self._http, core.exec_streamed(call, core.Emit)):
            yield item

    async def exec_stream(
        self,
        command: Command,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Union[str, bytes, None] = None,
        max_output_bytes: Optional[int] = None,
        on_stdout: Optional[Callback] = None,
        on_stderr: Optional[Callback] = None,
    ) -> ExecResult:
        """See `Sandbox.exec_stream`."""
        call = calls.exec_call(self.id, command, cwd, env, user, timeout, stdin, max_output_bytes, stream=True)
        return await _run(self._http, core.exec_streamed(call, core.to_callbacks(on_stdout, on_stderr)))

    @overload
    async def branch(self, count: None = None) -> "AsyncSandbox": ...

    @overload
    async def branch(self, count: int) -> List["AsyncSandbox"]: ...

    async def branch(self, count: Optional[int] = None) -> Union["AsyncSandbox", List["AsyncSandbox"]]:
        """See `Sandbox.branch`."""
        if count is None:
            return AsyncSandbox(self.farm, await _run(self._http, core.branch(self.id)))
        return [AsyncSandbox(self.farm, i) for i in await _run(self._http, hosting.branch_many(self.id, count))]

    async def set_network(self, network: Optional[str]) -> SandboxInfo:
        """See `Sandbox.set_network`."""
        return await _run(self._http, hosting.set_network(self.id, network))

    async def set_timeout(
        self, seconds: Optional[float] = None, *, idle: Optional[float] = None, lifetime: Optional[float] = None
    ) -> SandboxInfo:
        """See `Sandbox.set_timeout`."""
        return await _run(self._http, hosting.set_timeout(self.id, seconds, idle, lifetime))

    async def pty(
        self,
        rows: int = 24,
        cols: int = 80,
        command: Optional[str] = None,
        pid: Optional[int] = None,
        keep: bool = False,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        offset: Optional[int] = None,
    ) -> AsyncTerminal:
        """See `Sandbox.pty`: `async with await sb.pty() as t`."""
        return await AsyncTerminal.open(self._http, self.id, rows, cols, command, cwd, user, pid, offset, keep)

    async def pause(self) -> SandboxInfo:
        return await _run(self._http, core.sandbox_action(self.id, "pause"))

    async def resume(self, keep: Optional[Mapping[str, Any]] = None) -> SandboxInfo:
        """See `Sandbox.resume`."""
        return SandboxInfo.from_json(await _run(self._http, events.resume(self.id, keep)))

    async def sync_workspaces(self) -> List[Dict[str, Any]]:
        """Keeps what it wrote to the workspaces it holds writable (a `Conflict` once it was
        fenced); each workspace as now kept."""
        return await _run(self._http, workspaces_ops.sync(self.id))

    async def metrics(self) -> Dict[str, Any]:
        return await _run(self._http, events.metrics(self.id))

    async def events(self, after: int = 0, limit: int = 100) -> List[Dict[str, Any]]:
        return (await _run(self._http, events.list_events(after, self.id, limit)))["events"]

    async def checkpoint(self) -> SandboxInfo:
        """See `Sandbox.checkpoint`."""
        return await _run(self._http, core.sandbox_action(self.id, "checkpoint"))

    async def reset(self) -> ResetInfo:
        """See `Sandbox.reset`."""
        return await _run(self._http, core.reset(self.id))

    async def snapshot(self) -> AsyncEnvironment:
        return await _run(self._http, core.snapshot(self.farm.environments._environment, self.id))

    async def kill(self) -> None:
        """See `Sandbox.kill`: a sandbox that is gone is no error."""
        await _run(self._http, core.kill(self.id))

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(
        self, kind: Optional[Type[BaseException]], error: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        await _run(self._http, core.leave(self.id, error))

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r})"


class AsyncFiles:
    """`sb.files` of an `AsyncSandbox` (see `Files`). Local files are read and written with
    blocking calls: they are local, and at most a few hundred MiB."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    @property
    def _http(self) -> AsyncHTTP:
        return self._sandbox.farm._http

    async def write(self, path: str, data: Union[bytes, str], mode: int = 0o644) -> None:
        await _run(self._http, core.write_file(self._sandbox.id, path, data, mode))

    async def read(self, path: str) -> bytes:
        return await _run(self._http, core.read_file(self._sandbox.id, path))

    async def upload_file(self, local_path: str, remote_path: str, mode: Optional[int] = None) -> None:
        await _run(self._http, core.upload_file(self._sandbox.id, local_path, remote_path, mode))

    async def download_file(self, remote_path: str, local_path: str) -> None:
        await _run(self._http, core.download_file(self._sandbox.id, remote_path, local_path))

    async def upload_dir(self, local_dir: str, remote_dir: str) -> None:
        await _run(self._http, core.upload_dir(self._sandbox.id, local_dir, remote_dir))

    async def download_dir(self, remote_dir: str, local_dir: str) -> None:
        await _run(self._http, core.download_dir(self._sandbox.id, remote_dir, local_dir))

    async def list(self, path: str, max_entries: Optional[int] = None) -> FolderListing:
        return await _run(self._http, hosting.list_folder(self._sandbox.id, path, max_entries))

    async def stat(self, path: str) -> EntryInfo:
        return await _run(self._http, hosting.stat(self._sandbox.id, path))

    async def exists(self, path: str) -> bool:
        return await _run(self._http, hosting.exists(self._sandbox.id, path))
