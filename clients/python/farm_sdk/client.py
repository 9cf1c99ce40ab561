"""The synchronous client of the sandbox API: `Farm`, its `environments` and `sandboxes`, and
`Sandbox` (with its `files`, `processes`, `ports` and terminal, `pty()`).

    with Farm() as farm:
        env = farm.environments.create(image="python:3.12-slim")
        with farm.sandboxes.create(env) as sb:
            print(sb.exec("python3 -V").stdout)
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Type, Union, overload


from . import _calls as calls
from . import _core as core
from . import _events as events
from . import _workspaces as workspaces_ops
from . import _hosting as hosting
from ._calls import Command, EnvironmentRef
from ._core import ExecItem
from ._effects import iterate as _iterate
from ._effects import run as _run
from ._http import SyncClient, SyncHTTP
from .hosting import Ports, Processes
from .models import Context, EntryInfo, Environment, ExecResult, FolderListing, LogPage, ResetInfo, SandboxInfo
from .terminal import Terminal
from .workspaces import Workspaces

__all__ = ["Farm", "Environments", "Sandboxes", "Sandbox", "Files", "Workspaces"]


class Farm(SyncClient):
    """One `farm serve` service.

    `url` defaults to `$FARM_URL`, else `http://127.0.0.1:8765`; `token` to
    `$FARM_SERVE_TOKEN` (sent as the bearer token). `timeout` is the seconds an answer may
    take, on top of what a call waits for on purpose (a command's run, a long poll).
    `retries` is how many times a failed call is tried again (see the README's Retries).
    `transport` replaces httpx's (a proxy, a test's `httpx.MockTransport`).
    """

    environments: "Environments"
    sandboxes: "Sandboxes"
    workspaces: "Workspaces"

    def _opened(self) -> None:
        self.environments = Environments(self._http)
        self.sandboxes = Sandboxes(self)
        self.workspaces = Workspaces(self._http)

    def events(self, after: int = 0, sandbox: Optional[str] = None, limit: int = 100) -> Dict[str, Any]:
        """The caller's lifecycle events after the id `after`, oldest first (of one sandbox
        or session when `sandbox` is given): `{"events": [...], "next_after": id}`."""
        return _run(self._http, events.list_events(after, sandbox, limit))

    def follow_events(self, after: Optional[int] = None, sandbox: Optional[str] = None) -> Iterator[Dict[str, Any]]:
        """The caller's events as they happen (after the id `after`; from now on without
        it), for as long as the loop goes on. Pass the last `id` seen to go on after a break."""
        for item in _iterate(self._http, events.follow_events(after, sandbox)):
            if isinstance(item, dict):
                yield item

    def add_webhook(self, url: str) -> Dict[str, Any]:
        """A webhook sent every later event of the caller's, signed; the answer's `secret`
        is shown this once."""
        return _run(self._http, events.add_webhook(url))

    def webhooks(self) -> List[Dict[str, Any]]:
        return _run(self._http, events.webhooks())

    def delete_webhook(self, webhook_id: str) -> None:
        _run(self._http, events.delete_webhook(webhook_id))


class Environments:
    """`farm.environments`: template snapshots made from images or Dockerfiles."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def _environment(self, answer: object) -> Environment:
        return Environment.from_json(answer, self)

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
        options = calls.environment_options(cpus, memory_mib, disk_mib, setup, force)
        return _run(self._http, core.create_environment(self._environment, image, options, wait, on_log, timeout))

    def upload_context(self, context_dir: str) -> Context:
        """Uploads the folder `context_dir` as a Dockerfile build context (regular files and
        folders only; the whole folder, with no `.dockerignore` applied)."""
        return _run(self._http, core.upload_context(context_dir))

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
        options = calls.environment_options(cpus, memory_mib, disk_mib, setup, force)
        return _run(self._http, core.environment_from_dockerfile(
            self._environment, context_dir, dockerfile, build_args, target, options, wait, on_log, timeout
        ))

    def get(self, environment_id: str) -> Environment:
        return _run(self._http, core.get_environment(self._environment, environment_id))

    def list(self) -> List[Environment]:
        return _run(self._http, core.list_environments(self._environment))

    def delete(self, environment_id: str) -> None:
        """Forgets an environment (409 while it builds or a sandbox made from it lives)."""
        _run(self._http, core.delete_environment(environment_id))

    def logs(self, environment_id: str, offset: int = 0, wait: float = 0) -> LogPage:
        """Build log lines from `offset` on, held up to `wait` seconds for a new one:
        `(lines, next_offset, state)`."""
        return _run(self._http, core.environment_logs(environment_id, offset, wait))

    def wait(
        self, environment_id: str, on_log: Optional[Callable[[str], None]] = None, timeout: Optional[float] = None
    ) -> Environment:
        """The environment once its build ended, ready; see `create`."""
        return _run(self._http, core.wait_for_build(self._environment, environment_id, on_log, timeout))


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
        keep: Optional[Mapping[str, Any]] = None,
        on_timeout: Optional[str] = None,
        workspaces: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> "Sandbox":
        """A new sandbox of a ready environment (an `Environment` or its id). Use it as a
        context manager to kill it on leaving, whatever happens."""
        options = calls.sandbox_options(
            env, workdir, user, network, disk_mib, idle_timeout_secs, lifetime_secs, cpus, memory_mib, metadata,
            keep, on_timeout, workspaces,
        )
        return Sandbox(self._farm, _run(self._farm._http, core.create_sandbox(environment, options)))

    def get(self, sandbox_id: str) -> "Sandbox":
        """The sandbox `sandbox_id` (`NotFound` when there is none)."""
        return Sandbox(self._farm, _run(self._farm._http, core.get_sandbox(sandbox_id)))

    def list(self, state: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None) -> List[SandboxInfo]:
        """The sandboxes, oldest first; only those in `state` (`running` or `paused`) and
        whose metadata has every key of `metadata` with its value, when given."""
        return _run(self._farm._http, hosting.list_sandboxes(state, metadata))


class Sandbox:
    """A live sandbox: run commands, move files, branch, pause, snapshot, kill."""

    def __init__(self, farm: Farm, sandbox_id: str) -> None:
        self.farm = farm
        self.id = sandbox_id
        self.files = Files(self)
        self.processes = Processes(farm._http, sandbox_id)
        self.ports = Ports(farm._http, sandbox_id)

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
        keep: Optional[Mapping[str, Any]] = None,
        on_timeout: Optional[str] = None,
        workspaces: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> "Sandbox":
        """`farm.sandboxes.create(...)`, with `farm` defaulting to `Farm()` (from
        `$FARM_URL` and `$FARM_SERVE_TOKEN`)."""
        owner = farm or Farm()
        try:
            return owner.sandboxes.create(
                environment, env, workdir, user, network, disk_mib, idle_timeout_secs, lifetime_secs, cpus,
                memory_mib, metadata, keep, on_timeout, workspaces,
            )
        except BaseException:
            if farm is None:
                owner.close()
            raise

    @property
    def _http(self) -> SyncHTTP:
        return self.farm._http

    def info(self) -> SandboxInfo:
        return _run(self._http, core.sandbox_info(self.id))

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
        call = calls.exec_call(self.id, command, cwd, env, user, timeout, stdin, max_output_bytes, stream=False)
        return _run(self._http, core.exec_result(call))

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
        call = calls.exec_call(self.id, command, cwd, env, user, timeout, stdin, max_output_bytes, stream=True)
        yield from _iterate(self._http, core.exec_streamed(call, core.Emit))

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
        call = calls.exec_call(self.id, command, cwd, env, user, timeout, stdin, max_output_bytes, stream=True)
        return _run(self._http, core.exec_streamed(call, core.to_callbacks(on_stdout, on_stderr)))

    @overload
    def branch(self, count: None = None) -> "Sandbox": ...

    @overload
    def branch(self, count: int) -> List["Sandbox"]: ...

    def branch(self, count: Optional[int] = None) -> Union["Sandbox", List["Sandbox"]]:
        """A new sandbox continuing from this one's exact state; the two go on apart. With a
        `count` (1-32), that many made at once (all or none), as a list."""
        if count is None:
            return Sandbox(self.farm, _run(self._http, core.branch(self.id)))
        return [Sandbox(self.farm, i) for i in _run(self._http, hosting.branch_many(self.id, count))]

    def set_timeout(
        self, seconds: Optional[float] = None, *, idle: Optional[float] = None, lifetime: Optional[float] = None
    ) -> SandboxInfo:
        """Moves its timers, within the service's caps: it ends `seconds` from now, or
        `lifetime` seconds after it was made; `idle` is its idle timeout from now on."""
        return _run(self._http, hosting.set_timeout(self.id, seconds, idle, lifetime))

    def set_network(self, network: Optional[str]) -> SandboxInfo:
        """Moves it, live, to a stricter named policy of the service's (one
        `serve.sandboxes.tighten` lists after its present one), or to no network (`None`):
        its connections the new policy would not open are cut. Never looser (`Conflict`)."""
        return _run(self._http, hosting.set_network(self.id, network))

    def pty(
        self,
        rows: int = 24,
        cols: int = 80,
        command: Optional[str] = None,
        pid: Optional[int] = None,
        keep: bool = False,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        offset: Optional[int] = None,
    ) -> Terminal:
        """A terminal over a WebSocket (needs `farm-sdk[pty]`): a login shell, or `command`,
        on a `rows` x `cols` terminal, hung up on when it is closed unless `keep`; or, with
        `pid`, the terminal of a background process started with `pty`, its output replayed
        from `offset` (default 0). Use it as a context manager."""
        return Terminal.open(self._http, self.id, rows, cols, command, cwd, user, pid, offset, keep)

    def pause(self) -> SandboxInfo:
        """Saves it to disk and stops its VM (no slot, no idle timer)."""
        return _run(self._http, core.sandbox_action(self.id, "pause"))

    def resume(self, keep: Optional[Mapping[str, Any]] = None) -> SandboxInfo:
        """Runs a paused sandbox again from its saved state, processes and all, once the new
        VM has what `keep` names (`{"files": [{"path", "size"}], "processes": [pid], "ports":
        [port]}`; else what it was created with): otherwise a `Conflict` naming what is
        missing, and it stays paused (`resume_failed`)."""
        return SandboxInfo.from_json(_run(self._http, events.resume(self.id, keep)))

    def sync_workspaces(self) -> List[Dict[str, Any]]:
        """Keeps what it wrote to the workspaces it holds writable (a `Conflict` once it was
        fenced); each workspace as now kept."""
        return _run(self._http, workspaces_ops.sync(self.id))

    def metrics(self) -> Dict[str, Any]:
        """What it uses now (`now`: CPU seconds, memory, disk and network bytes) and over its
        life (`life`), as the host measures its VMs."""
        return _run(self._http, events.metrics(self.id))

    def events(self, after: int = 0, limit: int = 100) -> List[Dict[str, Any]]:
        """Its lifecycle events after the id `after`, oldest first."""
        return _run(self._http, events.list_events(after, self.id, limit))["events"]

    def checkpoint(self) -> SandboxInfo:
        """Saves its state (memory, processes, disk) for a restart of the service to bring
        back; it runs on. `checkpoint_at_ms` says when."""
        return _run(self._http, core.sandbox_action(self.id, "checkpoint"))

    def reset(self) -> ResetInfo:
        """Back to its environment's snapshot, same id: files, processes, memory and disk as
        the environment made them, with a new identity. In place (the same VM, put back
        exactly) where it can be; a branch or a resumed sandbox gets a new fork of its
        environment instead, and `why` says so."""
        return _run(self._http, core.reset(self.id))

    def snapshot(self) -> Environment:
        """A new ready environment of this sandbox's state, to fork many from."""
        return _run(self._http, core.snapshot(self.farm.environments._environment, self.id))

    def kill(self) -> None:
        """Removes it (its VM stops at once). Killing a sandbox that is gone is no error."""
        _run(self._http, core.kill(self.id))

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(
        self, kind: Optional[Type[BaseException]], error: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        _run(self._http, core.leave(self.id, error))

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
        _run(self._http, core.write_file(self._sandbox.id, path, data, mode))

    def read(self, path: str) -> bytes:
        """A file's bytes (`NotFound` when absent, `PayloadTooLarge` past 64 MiB)."""
        return _run(self._http, core.read_file(self._sandbox.id, path))

    def upload_file(self, local_path: str, remote_path: str, mode: Optional[int] = None) -> None:
        """Copies a local file in; `mode` defaults to the local file's permissions."""
        _run(self._http, core.upload_file(self._sandbox.id, local_path, remote_path, mode))

    def download_file(self, remote_path: str, local_path: str) -> None:
        """Copies a file out to `local_path` (written whole or not at all)."""
        _run(self._http, core.download_file(self._sandbox.id, remote_path, local_path))

    def upload_dir(self, local_dir: str, remote_dir: str) -> None:
        """Copies the local folder's content into `remote_dir` (made if needed), links as
        links."""
        _run(self._http, core.upload_dir(self._sandbox.id, local_dir, remote_dir))

    def download_dir(self, remote_dir: str, local_dir: str) -> None:
        """Copies the folder's content into `local_dir` (made if needed), refusing any entry
        that would land outside it (`UnsafeArchive`)."""
        _run(self._http, core.download_dir(self._sandbox.id, remote_dir, local_dir))

    def list(self, path: str, max_entries: Optional[int] = None) -> FolderListing:
        """A folder's entries, sorted by name (at most `max_entries`; `truncated` when there
        were more), without running a command. A path that is no folder is a `BadRequest`."""
        return _run(self._http, hosting.list_folder(self._sandbox.id, path, max_entries))

    def stat(self, path: str) -> EntryInfo:
        """What is at `path` (a link as a link), without running a command; `NotFound` when
        nothing is."""
        return _run(self._http, hosting.stat(self._sandbox.id, path))

    def exists(self, path: str) -> bool:
        return _run(self._http, hosting.exists(self._sandbox.id, path))
