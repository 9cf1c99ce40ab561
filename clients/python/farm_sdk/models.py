"""What the service answers, as dataclasses built from its JSON.

Each keeps the whole answer in `raw`, and fields the server adds later are simply ignored
(they stay readable in `raw`). An `Environment` a `Farm` returned can wait for its own build
(`env.wait()`); one an `AsyncFarm` returned is an `AsyncEnvironment`, whose `wait` and `logs`
are awaited.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Protocol, Tuple, Type, TypeVar

from .errors import FarmError

__all__ = [
    "Environment",
    "AsyncEnvironment",
    "SandboxInfo",
    "ResetInfo",
    "ExecResult",
    "Context",
    "LogPage",
    "EntryInfo",
    "FolderListing",
]

#: A page of build log: its lines, the offset to ask for next, and the build's state.
LogPage = Tuple[List[str], int, str]

_Env = TypeVar("_Env", bound="Environment")


def _object(data: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(data, dict):
        raise FarmError(None, f"the service answered {type(data).__name__} where {what} was expected")
    return data


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def _strings(value: Any) -> Dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


# What an environment asks of the `farm.environments` that returned it. The clients import
# the models, so the models name them by what they ask, not by their classes.


class _Environments(Protocol):
    def logs(self, environment_id: str, offset: int = ..., wait: float = ...) -> LogPage: ...

    def wait(
        self, environment_id: str, on_log: Optional[Callable[[str], None]] = ..., timeout: Optional[float] = ...
    ) -> Environment: ...


class _AsyncEnvironments(Protocol):
    async def logs(self, environment_id: str, offset: int = ..., wait: float = ...) -> LogPage: ...

    async def wait(
        self, environment_id: str, on_log: Optional[Callable[[str], Any]] = ..., timeout: Optional[float] = ...
    ) -> AsyncEnvironment: ...


@dataclass
class Environment:
    """A template snapshot sandboxes are forked from, made from an image or a Dockerfile.

    `state` is `building`, `ready` or `failed`; a failed one's `error` is the server's object
    (`message`, and for a Dockerfile `dockerfile_line`, `instruction`, `output_tail`). `warm`
    counts the forks its pool holds ready; `pool` (the operator's alone, else None) is what
    the pool holds and did: `ready`, `spares`, `target`, `started`, `reset`, `reset_failed`,
    `missed`.
    """

    id: str
    state: str
    spec: Dict[str, Any] = field(default_factory=dict)
    created_at_ms: Optional[int] = None
    log_lines: int = 0
    snapshot: Optional[str] = None
    error: Optional[Dict[str, Any]] = None
    sandboxes: int = 0
    cpus: Optional[int] = None
    memory_mib: Optional[int] = None
    warm: int = 0
    pool: Optional[Dict[str, int]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    _api: Optional[_Environments] = field(default=None, repr=False, compare=False)

    @classmethod
    def from_json(cls: Type[_Env], data: Any, api: Any = None) -> _Env:
        """An environment from the service's JSON object (extra fields are kept in `raw`)."""
        d = _object(data, "an environment")
        error = d.get("error")
        return cls(
            id=str(d.get("id", "")),
            state=str(d.get("state", "")),
            spec=dict(d["spec"]) if isinstance(d.get("spec"), dict) else {},
            created_at_ms=_int(d.get("created_at_ms")),
            log_lines=_int(d.get("log_lines")) or 0,
            snapshot=_str(d.get("snapshot")),
            error=dict(error) if isinstance(error, dict) else ({"message": error} if isinstance(error, str) else None),
            sandboxes=_int(d.get("sandboxes")) or 0,
            cpus=_int(d.get("cpus")),
            memory_mib=_int(d.get("memory_mib")),
            warm=_int(d.get("warm")) or 0,
            pool=dict(d["pool"]) if isinstance(d.get("pool"), dict) else None,
            raw=dict(d),
            _api=api,
        )

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def building(self) -> bool:
        return self.state == "building"

    @property
    def failed(self) -> bool:
        return self.state == "failed"

    def _update(self, other: "Environment") -> None:
        for f in fields(self):
            if f.name != "_api":
                setattr(self, f.name, getattr(other, f.name))

    def _bound(self) -> _Environments:
        if self._api is None:
            raise FarmError(None, f"environment {self.id} is not bound to a Farm: use farm.environments.get(id)")
        return self._api

    def logs(self, offset: int = 0, wait: float = 0) -> LogPage:
        """Build log lines from `offset` on, holding the answer up to `wait` seconds for a new
        line: `(lines, next_offset, state)`."""
        return self._bound().logs(self.id, offset=offset, wait=wait)

    def wait(self, on_log: Optional[Callable[[str], None]] = None, timeout: Optional[float] = None) -> "Environment":
        """Waits for the build to end, passing each log line to `on_log`; updates this object
        and returns it. Raises `BuildError` when the build failed, `WaitTimeout` past
        `timeout` seconds."""
        self._update(self._bound().wait(self.id, on_log=on_log, timeout=timeout))
        return self


@dataclass
class AsyncEnvironment(Environment):
    """An `Environment` from an `AsyncFarm`: `await env.wait()`, `await env.logs()`."""

    _api: Optional[_AsyncEnvironments] = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def _bound(self) -> _AsyncEnvironments:  # type: ignore[override]
        if self._api is None:
            raise FarmError(None, f"environment {self.id} is not bound to an AsyncFarm: use farm.environments.get(id)")
        return self._api

    async def logs(self, offset: int = 0, wait: float = 0) -> LogPage:  # type: ignore[override]
        """Build log lines from `offset` on (see `Environment.logs`)."""
        return await self._bound().logs(self.id, offset=offset, wait=wait)

    async def wait(  # type: ignore[override]
        self, on_log: Optional[Callable[[str], Any]] = None, timeout: Optional[float] = None
    ) -> "AsyncEnvironment":
        """Waits for the build to end (see `Environment.wait`); `on_log` may be a coroutine
        function."""
        self._update(await self._bound().wait(self.id, on_log=on_log, timeout=timeout))
        return self


@dataclass
class SandboxInfo:
    """A sandbox as the service describes it."""

    id: str
    environment: str
    state: str
    cpus: Optional[int] = None
    memory_mib: Optional[int] = None
    network: Optional[str] = None
    workdir: Optional[str] = None
    user: Optional[str] = None
    created_at_ms: Optional[int] = None
    expires_at_ms: Optional[int] = None
    idle_timeout_secs: Optional[int] = None
    metadata: Dict[str, str] = field(default_factory=dict)
    #: The sandbox it was branched from.
    parent: Optional[str] = None
    #: When its last checkpoint was made (what a restart after a crash brings back).
    checkpoint_at_ms: Optional[int] = None
    #: The workspaces it mounted: `{"name", "path", "mode", "generation"}` each (`mode`:
    #: `writable`, `read_only`, or a branch's `copy`).
    workspaces: List[Dict[str, Any]] = field(default_factory=list)
    #: How its running VM came to be in its environment's snapshot: `fork` (a new QEMU
    #: process), `reset` (a VM its tenant was done with, reset in place) or `reset_failed`
    #: (such a reset failed; a new process instead). None while paused.
    start: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> "SandboxInfo":
        """A sandbox from the service's JSON object (extra fields are kept in `raw`)."""
        d = _object(data, "a sandbox")
        return cls(
            id=str(d.get("id", "")),
            environment=str(d.get("environment", "")),
            state=str(d.get("state", "")),
            cpus=_int(d.get("cpus")),
            memory_mib=_int(d.get("memory_mib")),
            network=_str(d.get("network")),
            workdir=_str(d.get("workdir")),
            user=_str(d.get("user")),
            created_at_ms=_int(d.get("created_at_ms")),
            expires_at_ms=_int(d.get("expires_at_ms")),
            idle_timeout_secs=_int(d.get("idle_timeout_secs")),
            metadata=_strings(d.get("metadata")),
            parent=_str(d.get("parent")),
            checkpoint_at_ms=_int(d.get("checkpoint_at_ms")),
            workspaces=[dict(w) for w in d.get("workspaces") or [] if isinstance(w, dict)],
            start=_str(d.get("start")),
            raw=dict(d),
        )


@dataclass
class ResetInfo:
    """What `Sandbox.reset` did: the sandbox afterwards, and whether its VM was put back in
    place (the same VM, exactly as its environment's snapshot) or replaced by a new fork of
    its environment (then `why` says why)."""

    sandbox: SandboxInfo
    in_place: bool
    why: Optional[str] = None
    took_ms: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> "ResetInfo":
        d = _object(data, "a reset")
        return cls(
            sandbox=SandboxInfo.from_json(d.get("sandbox")),
            in_place=d.get("in_place") is True,
            why=_str(d.get("why")),
            took_ms=_int(d.get("took_ms")),
            raw=dict(d),
        )


@dataclass
class ExecResult:
    """How a command ended, and its output (text; invalid UTF-8 replaced).

    `exit_code` is None when the command was killed: past its timeout (`timed_out`) or by a
    signal (`signal`). `ok` is true when it exited 0.
    """

    exit_code: Optional[int]
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    signal: Optional[Any] = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    output_cap_bytes: Optional[int] = None
    duration_ms: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_json(cls, data: Any, stdout: Optional[str] = None, stderr: Optional[str] = None) -> "ExecResult":
        """A result from the service's JSON object; `stdout` and `stderr`, when given, are the
        output a stream collected (a stream's `exit` event has none)."""
        d = _object(data, "an exec result")
        return cls(
            exit_code=_int(d.get("exit_code")),
            stdout=stdout if stdout is not None else str(d.get("stdout") or ""),
            stderr=stderr if stderr is not None else str(d.get("stderr") or ""),
            timed_out=bool(d.get("timed_out")),
            signal=d.get("signal"),
            stdout_truncated=bool(d.get("stdout_truncated")),
            stderr_truncated=bool(d.get("stderr_truncated")),
            output_cap_bytes=_int(d.get("output_cap_bytes")),
            duration_ms=_int(d.get("duration_ms")),
            raw=dict(d),
        )


@dataclass
class Context:
    """An uploaded Dockerfile build context: its content-addressed id, files and bytes."""

    id: str
    files: int = 0
    bytes: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> "Context":
        d = _object(data, "a build context")
        return cls(
            id=str(d.get("context", "")),
            files=_int(d.get("files")) or 0,
            bytes=_int(d.get("bytes")) or 0,
            raw=dict(d),
        )


@dataclass
class EntryInfo:
    """A path in a sandbox, as `lstat` sees it (links are never followed): `type` is `file`,
    `dir`, `symlink` or `other`; `mode` the permission bits (`0o644`); `target` a link's
    target. `name` is its name in its folder (for `files.stat`, the path asked for)."""

    name: str
    type: str = ""
    size: int = 0
    mode: int = 0
    uid: int = 0
    gid: int = 0
    modified_at_ms: Optional[int] = None
    target: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @classmethod
    def from_json(cls, data: Any) -> "EntryInfo":
        d = _object(data, "a folder entry")
        return cls(
            name=str(d.get("name") or ""),
            type=str(d.get("type") or ""),
            size=_int(d.get("size")) or 0,
            mode=_int(d.get("mode")) or 0,
            uid=_int(d.get("uid")) or 0,
            gid=_int(d.get("gid")) or 0,
            modified_at_ms=_int(d.get("modified_at_ms")),
            target=_str(d.get("target")),
            raw=dict(d),
        )


@dataclass
class FolderListing:
    """A folder's entries, sorted by name; `truncated` when it held more than were asked for.
    Iterating it gives the entries."""

    path: str
    entries: List[EntryInfo] = field(default_factory=list)
    truncated: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    def __iter__(self) -> Iterator[EntryInfo]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def names(self) -> List[str]:
        return [entry.name for entry in self.entries]

    @classmethod
    def from_json(cls, data: Any) -> "FolderListing":
        d = _object(data, "a folder listing")
        entries = d.get("entries")
        return cls(
            path=str(d.get("path") or ""),
            entries=[EntryInfo.from_json(e) for e in entries] if isinstance(entries, list) else [],
            truncated=bool(d.get("truncated")),
            raw=dict(d),
        )
