"""The synchronous client of the sandbox API: `Farm`, its `environments` and `sandboxes`, and
`Sandbox`.

    with Farm() as farm:
        env = farm.environments.create(image="python:3.12-slim")
        with farm.sandboxes.create(env) as sb:
            print(sb.exec("python3 -V").stdout)
"""

from __future__ import annotations

import logging
import os
import tempfile
from types import TracebackType
from typing import Callable, Iterator, List, Mapping, Optional, Sequence, Tuple, Type, Union

import httpx

from . import _calls as calls
from ._calls import Command, EnvironmentRef
from ._http import Call, SyncHTTP
from ._sse import ExecStream
from ._tar import extract_tar, pack_dir
from .errors import BuildError, FarmError, NotFound
from .models import Context, Environment, ExecResult, LogPage, SandboxInfo

__all__ = ["Farm", "Environments", "Sandboxes", "Sandbox", "Files"]

log = logging.getLogger("farm_sdk")

#: What `iter_exec` yields: output chunks, then the result.
ExecItem = Union[Tuple[str, str], ExecResult]


class Farm:
    """One `farm serve` service.

    `url` defaults to `$FARM_URL`, else `http://127.0.0.1:8765`; `token` to
    `$FARM_SERVE_TOKEN` (sent as the bearer token). `timeout` is the seconds an answer may
    take, on top of what a call waits for on purpose (a command's run, a long poll).
    `retries` is how many times a failed call is tried again (see the README's Retries).
    `transport` replaces httpx's (a proxy, a test's `httpx.MockTransport`).
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        timeout: float = 600.0,
        retries: int = 3,
        *,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self._http = SyncHTTP(url, token, timeout, retries, transport)
        self.environments = Environments(self._http)
        self.sandboxes = Sandboxes(self)

    @property
    def url(self) -> str:
        return self._http.url

    def close(self) -> None:
        """Closes its connections."""
        self._http.close()

    def __enter__(self) -> "Farm":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Farm({self.url!r})"


class Environments:
    """`farm.environments`: template snapshots made from images or Dockerfiles."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def _environment(self, answer: object) -> Environment:
        return Environment.from_json(answer, self)

    def _settle(
        self, env: Environment, wait: bool, on_log: Optional[Callable[[str], None]], timeout: Optional[float]
    ) -> Environment:
        if wait and env.building:
            return env.wait(on_log=on_log, timeout=timeout)
        if wait and env.failed:
            raise BuildError.of(env)
        return env

    def create(
        self,
        image: str,
        cpus: Optional[int] = None,
        memory_mib: Optional[int] = None,
        disk_mib: Optional[int] = None,
        setup: Optional[Sequence[str]] = None,
        force: bool = False,
        wait: bool = True,
        on_log: Optional[Callable[[str], None]] = None,
        timeout: Optional[float] = None,
    ) -> Environment:
        """The environment of `image` (`minimal`, `python` or a registry reference), built
        unless it exists. With `wait`, returns once it is ready (each build log line goes to
        `on_log`), raising `BuildError` when it failed and `WaitTimeout` past `timeout`."""
        call = calls.create_environment(
            image=image, cpus=cpus, memory_mib=memory_mib, disk_mib=disk_mib, setup=setup, force=force
        )
        return self._settle(self._environment(self._http.json(call)), wait, on_log, timeout)

    def upload_context(self, context_dir: str) -> Context:
        """Uploads the folder `context_dir` as a Dockerfile build context (regular files and
        folders only; the whole folder, with no `.dockerignore` applied)."""
        return Context.from_json(self._http.json(calls.create_context(pack_dir(context_dir, for_context=True))))

    def from_dockerfile(
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
        on_log: Optional[Callable[[str], None]] = None,
        timeout: Optional[float] = None,
    ) -> Environment:
        """The environment a Dockerfile builds: `context_dir` is uploaded as its build
        context and `dockerfile` is its path there. Otherwise as `create`."""
        path = calls.dockerfile_path(context_dir, dockerfile)
        context = self.upload_context(context_dir)
        spec = calls.dockerfile_spec(context.id, path, build_args, target)
        call = calls.create_environment(
            dockerfile=spec, cpus=cpus, memory_mib=memory_mib, disk_mib=disk_mib, setup=setup, force=force
        )
        return self._settle(self._environment(self._http.json(call)), wait, on_log, timeout)

    def get(self, environment_id: str) -> Environment:
        return self._environment(self._http.json(calls.get_environment(environment_id)))

    def list(self) -> List[Environment]:
        answer = self._http.json(calls.list_environments())
        return [self._environment(e) for e in calls.listed(answer, "environments")]

    def delete(self, environment_id: str) -> None:
        """Forgets an environment (409 while it builds or a sandbox made from it lives)."""
        self._http.send(calls.delete_environment(environment_id))

    def logs(self, environment_id: str, offset: int = 0, wait: float = 0) -> LogPage:
        """Build log lines from `offset` on, held up to `wait` seconds for a new one:
        `(lines, next_offset, state)`."""
        return calls.log_page(self._http.json(calls.environment_logs(environment_id, offset, wait)))

    def wait(
        self, environment_id: str, on_log: Optional[Callable[[str], None]] = None, timeout: Optional[float] = None
    ) -> Environment:
        """The environment once its build ended, ready; see `create`."""
        waiting = calls.BuildWait(environment_id, timeout)
        while True:
            lines, offset, state = self.logs(environment_id, waiting.offset, waiting.poll_secs())
            if on_log is not None:
                for line in lines:
                    on_log(line)
            if waiting.done(lines, offset, state):
                break
        env = self.get(environment_id)
        if env.failed:
            raise BuildError.of(env)
        return env


class Sandboxes:
    """`farm.sandboxes`: live forks of environments."""

    def __init__(self, farm: Farm) -> None:
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
    ) -> "Sandbox":
        """A new sandbox of a ready environment (an `Environment` or its id). Use it as a
        context manager to kill it on leaving, whatever happens."""
        options = calls.sandbox_options(
            env, workdir, user, network, disk_mib, idle_timeout_secs, lifetime_secs, cpus, memory_mib, metadata
        )
        answer = self._farm._http.json(calls.create_sandbox(environment, options))
        return Sandbox(self._farm, SandboxInfo.from_json(answer).id)

    def get(self, sandbox_id: str) -> "Sandbox":
        """The sandbox `sandbox_id` (`NotFound` when there is none)."""
        return Sandbox(self._farm, SandboxInfo.from_json(self._farm._http.json(calls.get_sandbox(sandbox_id))).id)

    def list(self) -> List[SandboxInfo]:
        answer = self._farm._http.json(calls.list_sandboxes())
        return [SandboxInfo.from_json(s) for s in calls.listed(answer, "sandboxes")]


class Sandbox:
    """A live sandbox: run commands, move files, branch, pause, snapshot, kill."""

    def __init__(self, farm: Farm, sandbox_id: str) -> None:
        self.farm = farm
        self.id = sandbox_id
        self.files = Files(self)

    @classmethod
    def create(
        cls,
        environment: EnvironmentRef,
        farm: Optional[Farm] = None,
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
    ) -> "Sandbox":
        """`farm.sandboxes.create(...)`, with `farm` defaulting to `Farm()` (from
        `$FARM_URL` and `$FARM_SERVE_TOKEN`)."""
        owner = farm or Farm()
        try:
            return owner.sandboxes.create(
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
                owner.close()
            raise

    @property
    def _http(self) -> SyncHTTP:
        return self.farm._http

    def info(self) -> SandboxInfo:
        return SandboxInfo.from_json(self._http.json(calls.get_sandbox(self.id)))

    def exec(
        self,
        command: Command,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Union[str, bytes, None] = None,
        max_output_bytes: Optional[int] = None,
    ) -> ExecResult:
        """Runs `command` (a shell string, or an argv list) and returns how it ended. A
        command past `timeout` seconds (default 600) is killed: `timed_out` is true."""
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
        return ExecResult.from_json(self._http.json(call))

    def iter_exec(
        self,
        command: Command,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Union[str, bytes, None] = None,
        max_output_bytes: Optional[int] = None,
    ) -> Iterator[ExecItem]:
        """Runs `command` with its output streamed: yields `("stdout" | "stderr", text)` as it
        comes, then the `ExecResult` (holding all the output). Leaving the loop early closes
        the stream."""
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
        yield from self._chunks(call, events)
        yield events.finish()

    def _chunks(self, call: Call, events: ExecStream) -> Iterator[Tuple[str, str]]:
        with self._http.stream(call) as response:
            for text in response.iter_text():
                yield from events.feed(text)
                if events.ended:
                    return

    def exec_stream(
        self,
        command: Command,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Union[str, bytes, None] = None,
        max_output_bytes: Optional[int] = None,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
    ) -> ExecResult:
        """Runs `command` with its output streamed to `on_stdout` and `on_stderr` (text
        chunks as they come); returns the `ExecResult`."""
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
        for stream, text in self._chunks(call, events):
            callback = on_stdout if stream == "stdout" else on_stderr
            if callback is not None:
                callback(text)
        return events.finish()

    def branch(self) -> "Sandbox":
        """A new sandbox continuing from this one's exact state; the two go on apart."""
        answer = self._http.json(calls.sandbox_action(self.id, "branch"))
        return Sandbox(self.farm, SandboxInfo.from_json(answer).id)

    def pause(self) -> SandboxInfo:
        """Saves it to disk and stops its VM (no slot, no idle timer)."""
        return SandboxInfo.from_json(self._http.json(calls.sandbox_action(self.id, "pause")))

    def resume(self) -> SandboxInfo:
        """Runs a paused sandbox again from its saved state, processes and all."""
        return SandboxInfo.from_json(self._http.json(calls.sandbox_action(self.id, "resume")))

    def snapshot(self) -> Environment:
        """A new ready environment of this sandbox's state, to fork many from."""
        answer = self._http.json(calls.sandbox_action(self.id, "snapshot"))
        return Environment.from_json(answer, self.farm.environments)

    def kill(self) -> None:
        """Removes it (its VM stops at once). Killing a sandbox that is gone is no error."""
        try:
            self._http.send(calls.delete_sandbox(self.id))
        except NotFound:
            pass

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(
        self, kind: Optional[Type[BaseException]], error: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        try:
            self.kill()
        except FarmError as e:
            if error is None:
                raise
            log.warning("killing sandbox %s after %r failed: %s", self.id, error, e)

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r})"


class Files:
    """`sb.files`: files and folders of a sandbox (absolute guest paths)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    @property
    def _http(self) -> SyncHTTP:
        return self._sandbox.farm._http

    def write(self, path: str, data: Union[bytes, str], mode: int = 0o644) -> None:
        """Writes a file (at most 64 MiB; `str` as UTF-8), making its parent folders."""
        content = data.encode("utf-8") if isinstance(data, str) else data
        self._http.send(calls.write_file(self._sandbox.id, path, content, mode))

    def read(self, path: str) -> bytes:
        """A file's bytes (`NotFound` when absent, `PayloadTooLarge` past 64 MiB)."""
        return self._http.send(calls.read_file(self._sandbox.id, path)).content

    def upload_file(self, local_path: str, remote_path: str, mode: Optional[int] = None) -> None:
        """Copies a local file in; `mode` defaults to the local file's permissions."""
        with open(local_path, "rb") as f:
            content = f.read()
        self._http.send(calls.write_file(self._sandbox.id, remote_path, content, calls.local_mode(local_path, mode)))

    def download_file(self, remote_path: str, local_path: str) -> None:
        """Copies a file out to `local_path` (written whole or not at all)."""
        os.makedirs(os.path.dirname(os.path.abspath(local_path)), exist_ok=True)
        part = f"{local_path}.part"
        try:
            with open(part, "wb") as f, self._http.stream(calls.read_file(self._sandbox.id, remote_path)) as response:
                for chunk in response.iter_bytes():
                    f.write(chunk)
            os.replace(part, local_path)
        except BaseException:
            if os.path.exists(part):
                os.unlink(part)
            raise

    def upload_dir(self, local_dir: str, remote_dir: str) -> None:
        """Copies the local folder's content into `remote_dir` (made if needed), links as
        links."""
        self._http.send(calls.put_folder(self._sandbox.id, remote_dir, pack_dir(local_dir, for_context=False)))

    def download_dir(self, remote_dir: str, local_dir: str) -> None:
        """Copies the folder's content into `local_dir` (made if needed), refusing any entry
        that would land outside it (`UnsafeArchive`)."""
        with tempfile.TemporaryFile() as archive:
            with self._http.stream(calls.get_folder(self._sandbox.id, remote_dir)) as response:
                for chunk in response.iter_bytes():
                    archive.write(chunk)
            archive.seek(0)
            extract_tar(archive, local_dir)
