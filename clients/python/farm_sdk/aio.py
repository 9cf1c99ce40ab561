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

import inspect
import logging
import os
import tempfile
from types import TracebackType
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
)

import httpx

from . import _calls as calls
from ._calls import Command, EnvironmentRef
from ._http import AsyncHTTP, Call
from ._sse import ExecStream
from ._tar import extract_tar, pack_dir
from .errors import BuildError, FarmError, NotFound
from .models import AsyncEnvironment, Context, ExecResult, LogPage, SandboxInfo

__all__ = ["AsyncFarm", "AsyncEnvironments", "AsyncSandboxes", "AsyncSandbox", "AsyncFiles"]

log = logging.getLogger("farm_sdk")

#: A callback: a function, or a coroutine function.
Callback = Callable[[str], Any]
#: What `iter_exec` yields: output chunks, then the result.
ExecItem = Union[Tuple[str, str], ExecResult]


async def _call_back(callback: Optional[Callback], text: str) -> None:
    if callback is not None:
        result = callback(text)
        if inspect.isawaitable(result):
            await result


class AsyncFarm:
    """One `farm serve` service, for asyncio (see `Farm` for the arguments; `transport` is
    an `httpx.AsyncBaseTransport`)."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        timeout: float = 600.0,
        retries: int = 3,
        *,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self._http = AsyncHTTP(url, token, timeout, retries, transport)
        self.environments = AsyncEnvironments(self._http)
        self.sandboxes = AsyncSandboxes(self)

    @property
    def url(self) -> str:
        return self._http.url

    async def close(self) -> None:
        """Closes its connections."""
        await self._http.close()

    async def __aenter__(self) -> "AsyncFarm":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncFarm({self.url!r})"


class AsyncEnvironments:
    """`farm.environments` of an `AsyncFarm` (see `Environments`)."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    def _environment(self, answer: object) -> AsyncEnvironment:
        return AsyncEnvironment.from_json(answer, self)

    async def _settle(
        self, env: AsyncEnvironment, wait: bool, on_log: Optional[Callback], timeout: Optional[float]
    ) -> AsyncEnvironment:
        if wait and env.building:
            return await env.wait(on_log=on_log, timeout=timeout)
        if wait and env.failed:
            raise BuildError.of(env)
        return env

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
        call = calls.create_environment(
            image=image, cpus=cpus, memory_mib=memory_mib, disk_mib=disk_mib, setup=setup, force=force
        )
        return await self._settle(self._environment(await self._http.json(call)), wait, on_log, timeout)

    async def upload_context(self, context_dir: str) -> Context:
        """See `Environments.upload_context`."""
        archive = pack_dir(context_dir, for_context=True)
        return Context.from_json(await self._http.json(calls.create_context(archive)))

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
        path = calls.dockerfile_path(context_dir, dockerfile)
        context = await self.upload_context(context_dir)
        spec = calls.dockerfile_spec(context.id, path, build_args, target)
        call = calls.create_environment(
            dockerfile=spec, cpus=cpus, memory_mib=memory_mib, disk_mib=disk_mib, setup=setup, force=force
        )
        return await self._settle(self._environment(await self._http.json(call)), wait, on_log, timeout)

    async def get(self, environment_id: str) -> AsyncEnvironment:
        return self._environment(await self._http.json(calls.get_environment(environment_id)))

    async def list(self) -> List[AsyncEnvironment]:
        answer = await self._http.json(calls.list_environments())
        return [self._environment(e) for e in calls.listed(answer, "environments")]

    async def delete(self, environment_id: str) -> None:
        await self._http.send(calls.delete_environment(environment_id))

    async def logs(self, environment_id: str, offset: int = 0, wait: float = 0) -> LogPage:
        return calls.log_page(await self._http.json(calls.environment_logs(environment_id, offset, wait)))

    async def wait(
        self, environment_id: str, on_log: Optional[Callback] = None, timeout: Optional[float] = None
    ) -> AsyncEnvironment:
        """See `Environments.wait`."""
        waiting = calls.BuildWait(environment_id, timeout)
        while True:
            lines, offset, state = await self.logs(environment_id, waiting.offset, waiting.poll_secs())
            for line in lines:
                await _call_back(on_log, line)
            if waiting.done(lines, offset, state):
                break
        env = await self.get(environment_id)
        if env.failed:
            raise BuildError.of(env)
        return env


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
    ) -> "SandboxCreation":
        """A new sandbox: `sb = await farm.sandboxes.create(...)`, or
        `async with farm.sandboxes.create(...) as sb` to kill it on leaving."""
        options = calls.sandbox_options(
            env, workdir, user, network, disk_mib, idle_timeout_secs, lifetime_secs, cpus, memory_mib, metadata
        )
        return SandboxCreation(self._create(calls.create_sandbox(environment, options)))

    async def _create(self, call: Call) -> "AsyncSandbox":
        answer = await self._farm._http.json(call)
        return AsyncSandbox(self._farm, SandboxInfo.from_json(answer).id)

    async def get(self, sandbox_id: str) -> "AsyncSandbox":
        answer = await self._farm._http.json(calls.get_sandbox(sandbox_id))
        return AsyncSandbox(self._farm, SandboxInfo.from_json(answer).id)

    async def list(self) -> List[SandboxInfo]:
        answer = await self._farm._http.json(calls.list_sandboxes())
        return [SandboxInfo.from_json(s) for s in calls.listed(answer, "sandboxes")]


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
    ) -> "AsyncSandbox":
        """`await farm.sandboxes.create(...)`, with `farm` defaulting to `AsyncFarm()`."""
        owner = farm or AsyncFarm()
        try:
            return await owner.sandboxes.create(
                environment,
                env=env,
                workdir=workdir,
                user=user,
                network=network,
                disk_mib=disk_mib,
                idle_timeout_secs=idle_timeout_secs,
                lifetime_secs=lifetime_secs,
                cpus=cpus,
                memory_mib=memory_mib,
                metadata=metadata,
            )
        except BaseException:
            if farm is None:
                await owner.close()
            raise

    @property
    def _http(self) -> AsyncHTTP:
        return self.farm._http

    async def info(self) -> SandboxInfo:
        return SandboxInfo.from_json(await self._http.json(calls.get_sandbox(self.id)))

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
        call = calls.exec_call(
            self.id,
            command,
            cwd=cwd,
            env=env,
            user=user,
            timeout=timeout,
            stdin=stdin,
            max_output_bytes=max_output_bytes,
            stream=False,
        )
        return ExecResult.from_json(await self._http.json(call))

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
        call = calls.exec_call(
            self.id,
            command,
            cwd=cwd,
            env=env,
            user=user,
            timeout=timeout,
            stdin=stdin,
            max_output_bytes=max_output_bytes,
            stream=True,
        )
        events = ExecStream(call.method, call.path)
        async for chunk in self._chunks(call, events):
            yield chunk
        yield events.finish()

    async def _chunks(self, call: Call, events: ExecStream) -> AsyncIterator[Tuple[str, str]]:
        async with self._http.stream(call) as response:
            async for text in response.aiter_text():
                for chunk in events.feed(text):
                    yield chunk
                if events.ended:
                    return

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
        call = calls.exec_call(
            self.id,
            command,
            cwd=cwd,
            env=env,
            user=user,
            timeout=timeout,
            stdin=stdin,
            max_output_bytes=max_output_bytes,
            stream=True,
        )
        events = ExecStream(call.method, call.path)
        async for stream, text in self._chunks(call, events):
            await _call_back(on_stdout if stream == "stdout" else on_stderr, text)
        return events.finish()

    async def branch(self) -> "AsyncSandbox":
        answer = await self._http.json(calls.sandbox_action(self.id, "branch"))
        return AsyncSandbox(self.farm, SandboxInfo.from_json(answer).id)

    async def pause(self) -> SandboxInfo:
        return SandboxInfo.from_json(await self._http.json(calls.sandbox_action(self.id, "pause")))

    async def resume(self) -> SandboxInfo:
        return SandboxInfo.from_json(await self._http.json(calls.sandbox_action(self.id, "resume")))

    async def snapshot(self) -> AsyncEnvironment:
        answer = await self._http.json(calls.sandbox_action(self.id, "snapshot"))
        return self.farm.environments._environment(answer)

    async def kill(self) -> None:
        """See `Sandbox.kill`: a sandbox that is gone is no error."""
        try:
            await self._http.send(calls.delete_sandbox(self.id))
        except NotFound:
            pass

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(
        self, kind: Optional[Type[BaseException]], error: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        try:
            await self.kill()
        except FarmError as e:
            if error is None:
                raise
            log.warning("killing sandbox %s after %r failed: %s", self.id, error, e)

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
        content = data.encode("utf-8") if isinstance(data, str) else data
        await self._http.send(calls.write_file(self._sandbox.id, path, content, mode))

    async def read(self, path: str) -> bytes:
        return (await self._http.send(calls.read_file(self._sandbox.id, path))).content

    async def upload_file(self, local_path: str, remote_path: str, mode: Optional[int] = None) -> None:
        with open(local_path, "rb") as f:
            content = f.read()
        call = calls.write_file(self._sandbox.id, remote_path, content, calls.local_mode(local_path, mode))
        await self._http.send(call)

    async def download_file(self, remote_path: str, local_path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(local_path)), exist_ok=True)
        part = f"{local_path}.part"
        try:
            with open(part, "wb") as f:
                async with self._http.stream(calls.read_file(self._sandbox.id, remote_path)) as response:
                    async for chunk in response.aiter_bytes():
                        f.write(chunk)
            os.replace(part, local_path)
        except BaseException:
            if os.path.exists(part):
                os.unlink(part)
            raise

    async def upload_dir(self, local_dir: str, remote_dir: str) -> None:
        archive = pack_dir(local_dir, for_context=False)
        await self._http.send(calls.put_folder(self._sandbox.id, remote_dir, archive))

    async def download_dir(self, remote_dir: str, local_dir: str) -> None:
        with tempfile.TemporaryFile() as archive:
            async with self._http.stream(calls.get_folder(self._sandbox.id, remote_dir)) as response:
                async for chunk in response.aiter_bytes():
                    archive.write(chunk)
            archive.seek(0)
            extract_tar(archive, local_dir)
