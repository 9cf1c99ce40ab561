"""NeMo Gym's sandbox provider on farm: `FarmProvider` implements nemo-gym 0.4's
`SandboxProvider` protocol (`nemo_gym/sandbox/providers/base.py`: `create`, `exec`,
`upload_file`, `download_file`, `status`, `close`, `aclose`), and farm's extras besides:
`pause`, `resume`, `branch` (N live copies), `snapshot` (an environment of a sandbox's state,
found again by its id), `endpoint` (a port of the sandbox, with the header that opens it) and
`create_pty`.

The package registers it under the entry point group `nemo_gym.sandbox_providers` as
`farm`, so a Gym config names it as any provider:

    sandbox:
      farm:
        url: http://127.0.0.1:8765   # default $FARM_URL; the key: $FARM_SERVE_TOKEN
        network: pypi                # a network policy of the service (default: none)

A spec's `image` is a farm environment's id (`env-...`) or an image (`python`, a registry
reference), whose environment is built on first use and found by content after; `workdir`,
`env`, `metadata`, `ttl_s` (the sandbox's lifetime) and `resources` (cpu, memory_mib,
disk_gib) are honoured, `files` are written by Gym's facade. `provider_options` may name
`platform` (linux/amd64 only) and `network`.

Needs nemo-gym (`pip install nemo-gym`, Python >= 3.12); `import farm_sdk` does not import
it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

from ._beside import beside
from .aio import AsyncFarm, AsyncSandbox
from .errors import FarmError, NotFound

with beside():
    try:
        from nemo_gym.sandbox.providers.base import (
            SandboxCreateError,
            SandboxExecResult,
            SandboxHandle,
            SandboxSpec,
            SandboxStatus,
        )
    except ImportError as _e:  # pragma: no cover - only without nemo-gym
        raise ImportError(f"farm_sdk.nemogym needs nemo-gym (pip install nemo-gym): {_e}") from _e

__all__ = ["FarmProvider", "FarmCreateError", "Endpoint"]

#: What an exec that did not run to its own end answers as its return code (as Gym's
#: built-in providers do), with `error_type` saying why.
NOT_RUN = 125
_OPTIONS = {"platform", "network"}


class FarmCreateError(SandboxCreateError):
    """A sandbox farm could not make (its environment's build, or the create itself)."""


class Endpoint:
    """A port of a sandbox: its URL, and the headers a request needs to reach it."""

    def __init__(self, endpoint: str, headers: Mapping[str, str]) -> None:
        self.endpoint = endpoint
        self.headers = dict(headers)

    def __repr__(self) -> str:
        return f"Endpoint({self.endpoint!r})"


class FarmProvider:
    """Gym's sandboxes as farm sandboxes (see the module's documentation)."""

    name = "farm"

    def __init__(
        self,
        *,
        url: Optional[str] = None,
        token: Optional[str] = None,
        network: Optional[str] = None,
        idle_timeout_secs: Optional[int] = None,
        build_timeout_s: float = 3600.0,
    ) -> None:
        self._url, self._token = url, token
        self._network = network
        self._idle_timeout_secs = idle_timeout_secs
        self._build_timeout_s = build_timeout_s
        self._farm: Optional[AsyncFarm] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._environments: Dict[str, str] = {}

    def _client(self) -> AsyncFarm:
        """The client of the running loop: made on first use, and again on another loop (Gym
        runs a provider on whichever loop its caller has)."""
        loop = asyncio.get_running_loop()
        if self._farm is None or self._loop is not loop:
            self._farm, self._loop = AsyncFarm(url=self._url, token=self._token), loop
        return self._farm

    def _sandbox(self, handle: SandboxHandle) -> AsyncSandbox:
        return AsyncSandbox(self._client(), handle.sandbox_id)

    async def _environment(self, spec: SandboxSpec) -> str:
        image = spec.image or "python"
        if image.startswith("env-"):
            return image
        resources = spec.resources
        key = repr((image, resources))
        if key not in self._environments:
            disk = getattr(resources, "disk_gib", None)
            cpu = getattr(resources, "cpu", None)
            built = await self._client().environments.create(
                image,
                cpus=max(1, int(cpu)) if cpu else None,
                memory_mib=getattr(resources, "memory_mib", None),
                disk_mib=int(disk * 1024) if disk else None,
                timeout=self._build_timeout_s,
            )
            self._environments[key] = built.id
        return self._environments[key]

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        """A sandbox of the spec's image, ready to run commands when this returns."""
        options = dict(spec.provider_options or {})
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise ValueError(f"farm: provider_options {unknown} are not farm's (it takes {sorted(_OPTIONS)})")
        platform = options.get("platform") or {}
        if (platform.get("os") or "linux") != "linux" or (platform.get("arch") or "amd64") not in ("amd64", "x86_64"):
            raise ValueError(f"farm: provider_options.platform {platform}: farm's guests are linux/amd64")
        if spec.entrypoint:
            raise ValueError("farm: a spec's entrypoint is not run (start it with exec, in the background)")
        try:
            environment = await self._environment(spec)
            sandbox = await self._client().sandboxes.create(
                environment,
                env=dict(spec.env or {}) or None,
                workdir=spec.workdir,
                network=options.get("network", self._network),
                idle_timeout_secs=self._idle_timeout_secs,
                lifetime_secs=int(spec.ttl_s) if spec.ttl_s else None,
                metadata={k: str(v) for k, v in (spec.metadata or {}).items()} or None,
            )
        except FarmError as e:
            raise FarmCreateError(f"farm could not make a sandbox of {spec.image or 'python'!r}: {e}") from e
        try:
            if spec.workdir:  # the spec's working folder is there, as a container's WORKDIR is
                made = await sandbox.exec(["mkdir", "-p", "--", spec.workdir], cwd="/")
                if not made.ok:
                    raise FarmCreateError(f"farm: cannot make the workdir {spec.workdir}: {made.stderr.strip()}")
        except BaseException as e:
            await asyncio.shield(sandbox.kill())  # Gym's facade does not clean up a failed create
            if isinstance(e, FarmError):
                raise FarmCreateError(f"farm: making the workdir {spec.workdir}: {e}") from e
            raise
        return SandboxHandle(sandbox_id=sandbox.id, provider_name=self.name, raw=None)

    async def exec(
        self,
        handle: SandboxHandle,
        command: str,
        *,
        cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        timeout_s: Optional[Union[int, float]] = None,
        user: Optional[Union[str, int]] = None,
    ) -> SandboxExecResult:
        """Runs a shell command; a non-zero exit is a result. Past `timeout_s` it is killed
        with what it started (`error_type` "timeout"); one farm could not run is "sandbox"."""
        try:
            result = await self._sandbox(handle).exec(
                command, cwd=cwd, env=env, user=None if user is None else str(user), timeout=timeout_s
            )
        except FarmError as e:
            return SandboxExecResult(stdout=None, stderr=str(e), return_code=NOT_RUN, error_type="sandbox")
        if result.timed_out:
            return SandboxExecResult(result.stdout, result.stderr, NOT_RUN, "timeout")
        code = result.exit_code
        if code is None:  # killed by a signal: as a shell reports it
            code = 128 + result.signal if isinstance(result.signal, int) else NOT_RUN
        return SandboxExecResult(stdout=result.stdout, stderr=result.stderr, return_code=code)

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        """A local file into the sandbox (its folder made)."""
        sandbox = self._sandbox(handle)
        parent = str(Path(target_path).parent)
        made = await sandbox.exec(["mkdir", "-p", "--", parent], cwd="/")
        if not made.ok:
            raise RuntimeError(f"farm: cannot make {parent} in sandbox {handle.sandbox_id}: {made.stderr.strip()}")
        await sandbox.files.write(target_path, Path(source_path).read_bytes())

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        """A file of the sandbox to a local path (its folder made)."""
        try:
            data = await self._sandbox(handle).files.read(source_path)
        except NotFound as e:
            raise FileNotFoundError(f"{source_path} in sandbox {handle.sandbox_id}: {e}") from e
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        """running, stopped (paused, or gone) or unknown; never raises."""
        try:
            info = await self._sandbox(handle).info()
        except NotFound:
            return SandboxStatus.STOPPED
        except FarmError as e:
            return SandboxStatus.STOPPED if e.status == 410 else SandboxStatus.UNKNOWN
        return SandboxStatus.RUNNING if info.state == "running" else SandboxStatus.STOPPED

    async def close(self, handle: SandboxHandle) -> None:
        """Removes the sandbox; one that is gone already is no error."""
        await self._sandbox(handle).kill()

    async def aclose(self) -> None:
        """Closes the client (a later call makes another): Gym calls it after every sandbox."""
        farm, self._farm, self._loop = self._farm, None, None
        if farm is not None:
            await farm.close()

    # farm's extras.

    async def pause(self, handle: SandboxHandle) -> None:
        """Its memory and disk to the service's disk, its VM stopped."""
        await self._sandbox(handle).pause()

    async def resume(self, handle: SandboxHandle) -> None:
        await self._sandbox(handle).resume()

    async def branch(self, handle: SandboxHandle, count: int) -> List[SandboxHandle]:
        """`count` live copies of the sandbox (memory, processes, files), all or none."""
        copies = await self._sandbox(handle).branch(count)
        return [SandboxHandle(sandbox_id=c.id, provider_name=self.name, raw=None) for c in copies]

    async def snapshot(self, handle: SandboxHandle) -> str:
        """An environment of the sandbox's state: its id is an `image` later specs may name."""
        return (await self._sandbox(handle).snapshot()).id

    async def endpoint(self, handle: SandboxHandle, port: int) -> Endpoint:
        """Opens `port` of the sandbox to clients: its URL and the header that reaches it."""
        opened = await self._sandbox(handle).ports.open(port)
        return Endpoint(opened.base_url, opened.headers)

    async def create_pty(self, handle: SandboxHandle, rows: int = 24, cols: int = 80) -> Any:
        """A terminal of the sandbox (farm's `AsyncTerminal`: send, read, resize, close)."""
        return await self._sandbox(handle).pty(rows=rows, cols=cols)
