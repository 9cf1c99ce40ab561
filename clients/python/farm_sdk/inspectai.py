"""inspect_ai's sandbox on farm: the sandbox type `farm`, registered through the SDK's
`inspect_ai` entry point, so a task that says `sandbox="docker"` runs on farm by saying
`sandbox="farm"` (or `("farm", "compose.yaml")`, `("farm", "Dockerfile")`, `("farm",
"farm.yaml")`), nothing else changed.

- `task_init` builds or finds the task's environment once (farm's environments are
  content-addressed: the same Dockerfile or image is the same environment): from a
  Dockerfile, a single-service compose file (its `build` or `image`, `working_dir`,
  `environment`), a `farm.yaml` (`FarmSandboxConfig`), or the `python` image by default.
- `sample_init` makes a sandbox of it per sample (a fork of its snapshot); `sample_cleanup`
  removes it, interrupted or not; `task_cleanup` removes what is left (or lists it, with
  `--no-sandbox-cleanup`); `inspect sandbox cleanup farm [ID]` removes one sandbox, or every
  sandbox inspect made, found by their metadata.
- exec, read_file and write_file keep inspect's contract: its output limits, its error
  classes, inputs of any size and bytes (carried as a file of the sandbox past what farm's
  exec takes as text), a file read or write refused where its permission bits refuse the
  sandbox's user, 128+N for a signal, `TimeoutError` past the timeout with the command and
  what it started killed.

The service is `$FARM_URL` with the key `$FARM_SERVE_TOKEN`, unless the config names a `url`.
Needs inspect_ai (`pip install inspect-ai`, Python >= 3.10); `import farm_sdk` does not import
it.
"""

from __future__ import annotations

import asyncio
import errno
import os
import posixpath
import uuid
from typing import Any, Dict, List, Optional, Tuple, Union

from ._beside import beside
from ._calls import Call
from .aio import AsyncFarm, AsyncSandbox
from .client import Farm
from .errors import BadRequest, FarmError, NotFound

with beside():
    try:
        import yaml
        from inspect_ai.util import (
            ExecResult,
            OutputLimitExceededError,
            SandboxConnection,
            SandboxEnvironment,
            SandboxEnvironmentConfigType,
            SandboxEnvironmentLimits,
            SandboxUnavailableError,
            sandboxenv,
        )
        from pydantic import BaseModel, ConfigDict
    except ImportError as _e:  # pragma: no cover - only without inspect_ai
        raise ImportError(f"farm_sdk.inspectai needs inspect-ai (pip install inspect-ai): {_e}") from _e

__all__ = ["FarmSandboxEnvironment", "FarmSandboxConfig"]

#: farm's largest exec output (`max_output_bytes`).
_FARM_OUTPUT = 16 << 20
#: Inputs up to this many bytes of UTF-8 go in the exec request; others as a file.
_INLINE_INPUT = 4 << 20
#: The metadata key every sandbox inspect makes carries (`inspect sandbox cleanup farm`).
_MARK = "inspect_ai"
_COMPOSE = ["compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml"]


class FarmSandboxConfig(BaseModel):
    """A `farm.yaml` (or the config object of a `SandboxEnvironmentSpec`): where the
    environment comes from (one of `environment`, `image`, `dockerfile`; default the `python`
    image) and how its sandboxes are made."""

    model_config = ConfigDict(extra="forbid")

    url: Optional[str] = None
    environment: Optional[str] = None
    image: Optional[str] = None
    dockerfile: Optional[str] = None
    workdir: Optional[str] = None
    env: Dict[str, str] = {}
    network: Optional[str] = None
    cpus: Optional[int] = None
    memory_mib: Optional[int] = None
    disk_mib: Optional[int] = None


def _config(config: Optional[SandboxEnvironmentConfigType]) -> FarmSandboxConfig:
    """The task's config as farm's: a model, a `farm.yaml`, a Dockerfile or a compose file."""
    if config is None:
        return FarmSandboxConfig()
    if isinstance(config, FarmSandboxConfig):
        return config
    if isinstance(config, BaseModel):
        return FarmSandboxConfig(**config.model_dump(exclude_none=True))
    path = str(config)
    name = os.path.basename(path)
    if name == "Dockerfile" or name.endswith(".Dockerfile") or name.startswith("Dockerfile."):
        return FarmSandboxConfig(dockerfile=path)
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except OSError as e:
        raise ValueError(f"farm sandbox config {path}: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"farm sandbox config {path}: expected a mapping")
    if "services" in data:
        return _compose(path, data)
    try:
        return FarmSandboxConfig(**data)
    except Exception as e:
        raise ValueError(f"farm sandbox config {path}: {e}") from e


def _compose(path: str, data: Dict[str, Any]) -> FarmSandboxConfig:
    """A single-service compose file as farm's config: its `build` or `image`,
    `working_dir` and `environment`."""
    services = data.get("services") or {}
    if len(services) != 1:
        raise ValueError(f"{path}: farm runs a compose file of one service (this one has {len(services)})")
    (service,) = services.values()
    folder = os.path.dirname(os.path.abspath(path))
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env if "=" in item)
    config = FarmSandboxConfig(workdir=service.get("working_dir"), env={k: str(v) for k, v in env.items()})
    build = service.get("build")
    if build is not None:
        context = build if isinstance(build, str) else build.get("context", ".")
        dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
        config.dockerfile = os.path.join(folder, context, dockerfile)
    elif service.get("image"):
        config.image = service["image"]
    return config


class _Farm:
    """The client of the running loop, and the environments found, shared by the class."""

    clients: Dict[Tuple[Optional[str], int], AsyncFarm] = {}
    environments: Dict[str, str] = {}
    made: Dict[str, AsyncSandbox] = {}

    @classmethod
    def client(cls, url: Optional[str]) -> AsyncFarm:
        key = (url, id(asyncio.get_running_loop()))
        if key not in cls.clients:
            cls.clients[key] = AsyncFarm(url=url)
        return cls.clients[key]

    @classmethod
    async def environment(cls, config: FarmSandboxConfig) -> str:
        if config.environment:
            return config.environment
        key = config.model_dump_json()
        if key not in cls.environments:
            farm = cls.client(config.url)
            sizes = dict(cpus=config.cpus, memory_mib=config.memory_mib, disk_mib=config.disk_mib)
            if config.dockerfile:
                built = await farm.environments.from_dockerfile(
                    os.path.dirname(os.path.abspath(config.dockerfile)), os.path.basename(config.dockerfile), **sizes
                )
            else:
                built = await farm.environments.create(config.image or "python", **sizes)
            cls.environments[key] = built.id
        return cls.environments[key]


@sandboxenv(name="farm")
class FarmSandboxEnvironment(SandboxEnvironment):
    """One sample's farm sandbox (see the module's documentation)."""

    def __init__(self, sandbox: AsyncSandbox, workdir: str) -> None:
        super().__init__()
        self.sandbox = sandbox
        self.workdir = workdir

    # --- the task and its samples.

    @classmethod
    def config_files(cls) -> List[str]:
        return ["farm.yaml", *_COMPOSE, "Dockerfile"]

    @classmethod
    def is_docker_compatible(cls) -> bool:
        return True

    @classmethod
    def config_deserialize(cls, config: Dict[str, Any]) -> BaseModel:
        return FarmSandboxConfig(**config)

    @classmethod
    def default_concurrency(cls) -> Optional[int]:
        """The service's VMs at once (its admission's `max_sessions`)."""
        try:
            with Farm(timeout=10.0, retries=0) as farm:
                return int(farm._http.json(Call("GET", "/v1/capacity"))["max_sessions"]) or None
        except Exception:
            return None

    @classmethod
    async def task_init(cls, task_name: str, config: Optional[SandboxEnvironmentConfigType]) -> None:
        await _Farm.environment(_config(config))

    @classmethod
    async def sample_init(
        cls, task_name: str, config: Optional[SandboxEnvironmentConfigType], metadata: Dict[str, str]
    ) -> Dict[str, SandboxEnvironment]:
        settings = _config(config)
        farm = _Farm.client(settings.url)
        environment = await _Farm.environment(settings)
        marks = {_MARK: "1", "inspect_task": task_name[:200], "inspect_sample": str(metadata.get("__sample_id__", ""))[:200]}
        sandbox = await farm.sandboxes.create(
            environment, env=settings.env or None, workdir=settings.workdir, network=settings.network, metadata=marks
        )
        _Farm.made[sandbox.id] = sandbox
        try:
            workdir = settings.workdir
            if workdir:
                await sandbox.exec(["mkdir", "-p", "--", workdir], cwd="/")
            else:
                workdir = (await sandbox.exec(["pwd"])).stdout.strip() or "/"
        except BaseException:
            await asyncio.shield(cls._remove(sandbox))
            raise
        return {"default": cls(sandbox, workdir)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: Optional[SandboxEnvironmentConfigType],
        environments: Dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for env in environments.values():
            if isinstance(env, FarmSandboxEnvironment):
                await asyncio.shield(cls._remove(env.sandbox))

    @classmethod
    async def task_cleanup(cls, task_name: str, config: Optional[SandboxEnvironmentConfigType], cleanup: bool) -> None:
        left = list(_Farm.made.values())
        if not cleanup:
            if left:
                print(f"farm sandboxes left running ({len(left)}): {' '.join(s.id for s in left)}")
                print("remove them with: inspect sandbox cleanup farm [ID]")
            return
        for sandbox in left:
            await cls._remove(sandbox)

    @classmethod
    async def cli_cleanup(cls, id: Optional[str]) -> None:
        async with AsyncFarm() as farm:
            ids = [id] if id else [s.id for s in await farm.sandboxes.list(metadata={_MARK: "1"})]
            for sandbox_id in ids:
                await AsyncSandbox(farm, sandbox_id).kill()
                print(f"removed farm sandbox {sandbox_id}")

    @classmethod
    async def _remove(cls, sandbox: AsyncSandbox) -> None:
        _Farm.made.pop(sandbox.id, None)
        await sandbox.kill()

    # --- a sample's calls.

    def _path(self, path: str) -> str:
        return path if path.startswith("/") else posixpath.join(self.workdir, path)

    async def exec(
        self,
        cmd: List[str],
        input: Union[str, bytes, None] = None,
        cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        user: Optional[str] = None,
        timeout: Optional[int] = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        argv, stdin, spool = list(cmd), input, None
        if isinstance(input, bytes):
            try:
                stdin = input.decode("utf-8")
            except UnicodeDecodeError:
                stdin = None
        if input is not None and (stdin is None or len(input) > _INLINE_INPUT):
            # Past what farm's exec takes as text: the input as a file of the sandbox,
            # redirected by a shell that then runs the command itself.
            spool = f"/tmp/.farm-inspect-{uuid.uuid4().hex}"
            data = input if isinstance(input, bytes) else input.encode("utf-8")
            await self._call(self.sandbox.files.write(f"{spool}/input", data, 0o644))
            argv, stdin = ["/bin/sh", "-c", 'exec "$@" < "$0"', f"{spool}/input", *argv], None
        try:
            result = await self._call(
                self.sandbox.exec(
                    argv,
                    cwd=self._path(cwd) if cwd else self.workdir,
                    env=env or None,
                    user=user,
                    timeout=timeout,
                    stdin=stdin,
                    max_output_bytes=min(limit + 1, _FARM_OUTPUT),
                ),
                program=cmd[0] if cmd else "",
                user=user,
            )
        finally:
            if spool:
                await asyncio.shield(self._quietly(["rm", "-rf", spool]))
        if isinstance(result, ExecResult):
            return result
        if result.timed_out:
            late = TimeoutError(f"the command timed out after {timeout} s: {' '.join(cmd)[:200]}")
            setattr(late, "truncated_output", result.stdout[-limit:])
            raise late
        if len(result.stdout.encode()) > limit or len(result.stderr.encode()) > limit or (
            result.stdout_truncated or result.stderr_truncated
        ):
            raise OutputLimitExceededError(
                SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR, truncated_output=result.stdout + result.stderr
            )
        code = result.exit_code
        if code is None:
            code = 128 + result.signal if isinstance(result.signal, int) else 1
        return ExecResult(success=code == 0, returncode=code, stdout=result.stdout, stderr=result.stderr)

    async def _call(self, pending: Any, program: str = "", user: Optional[str] = None) -> Any:
        """A call of the sandbox, its failures as inspect's."""
        try:
            return await pending
        except NotFound as e:
            raise SandboxUnavailableError(f"farm sandbox {self.sandbox.id} is gone: {e}") from e
        except BadRequest as e:
            text = str(e)
            if "Permission denied" in text:
                raise PermissionError(errno.EACCES, f"cannot run {program}: permission denied", program) from e
            if user is not None and (e.field == "user" or f'user "{user}"' in text):
                return ExecResult(False, 1, "", f"no user {user} in the sandbox: {text}")
            if "No such file or directory" in text:
                return ExecResult(False, 127, "", f"{program}: not found ({text})")
            raise
        except FarmError as e:
            if e.status == 410:
                raise SandboxUnavailableError(f"farm sandbox {self.sandbox.id} is gone: {e}") from e
            raise

    async def _quietly(self, argv: List[str]) -> None:
        try:
            await self.sandbox.exec(argv, cwd="/", timeout=60)
        except Exception:
            pass

    async def _entry(self, path: str, file: str) -> Any:
        """The path's entry (`FileNotFoundError` when there is none)."""
        try:
            return await self.sandbox.files.stat(path)
        except NotFound as e:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", file) from e
        except BadRequest as e:
            raise FileNotFoundError(errno.ENOENT, f"No such file or directory ({e})", file) from e

    async def write_file(self, file: str, contents: Union[str, bytes]) -> None:
        path = self._path(file)
        try:
            entry = await self._entry(path, file)
        except FileNotFoundError:
            entry = None
        if entry is not None and entry.is_dir:
            raise IsADirectoryError(errno.EISDIR, "Is a directory", file)
        if entry is not None and entry.is_file and not entry.mode & 0o200:
            raise PermissionError(errno.EACCES, "Permission denied", file)
        data = contents.encode("utf-8") if isinstance(contents, str) else contents
        try:  # farm's write makes the file's folders
            await self._call(self.sandbox.files.write(path, data, entry.mode & 0o777 if entry is not None else 0o644))
        except PermissionError as e:
            raise PermissionError(errno.EACCES, "Permission denied", file) from e
        except BadRequest as e:
            if "directory" in str(e).lower():
                raise IsADirectoryError(errno.EISDIR, "Is a directory", file) from e
            raise

    async def read_file(self, file: str, text: bool = True) -> Union[str, bytes]:  # type: ignore[override]
        path = self._path(file)
        entry = await self._entry(path, file)
        if entry.is_dir:
            raise IsADirectoryError(errno.EISDIR, "Is a directory", file)
        if entry.is_file and not entry.mode & 0o400:
            raise PermissionError(errno.EACCES, "Permission denied", file)
        if entry.size > SandboxEnvironmentLimits.MAX_READ_FILE_SIZE:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, truncated_output=None)
        try:
            data = await self._call(self.sandbox.files.read(path))
        except NotFound as e:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", file) from e
        if len(data) > SandboxEnvironmentLimits.MAX_READ_FILE_SIZE:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, truncated_output=None)
        return data.decode("utf-8") if text else data

    async def connection(self, *, user: Optional[str] = None) -> SandboxConnection:
        """A shell a person can paste: farm's SDK's terminal on this sandbox."""
        who = f" --user {user}" if user else ""
        return SandboxConnection(
            type="farm",
            command=f"python3 -m farm_sdk.shell {self.sandbox.id}{who}",
            container=self.sandbox.id,
        )

    def default_polling_interval(self) -> float:
        return 0.2
