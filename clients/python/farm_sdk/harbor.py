"""Harbor's environment backend on farm's sandbox API.

    harbor run --env farm_sdk.harbor:FarmEnvironment --path TASKS --agent oracle \\
        --ek url=http://127.0.0.1:8765 --ek network=harbor

Each trial's environment is a farm environment (built once from the task's
`environment/Dockerfile`, or from its `docker_image`, then reused: farm environments are
content-addressed) and a sandbox forked from it. Harbor's commands, uploads and downloads go
to that sandbox; nothing is mounted from the host, so Harbor downloads `/logs/agent` and
`/logs/verifier` itself, as it does for its other remote backends.

What Harbor may ask that farm cannot honour is refused with the reason, never run
differently: GPUs, Docker Compose environments, host mounts, a network allowlist (unless
`allowlist_network` names a farm policy for it), internet access when no farm network policy
is configured (`network`). Every failure of the farm service reaches Harbor as an exception
carrying farm's message (the SDK's `FarmError` and its subclasses).

Options (`--ek key=value`), all optional:

    url, token               the service (default $FARM_URL or http://127.0.0.1:8765; $FARM_SERVE_TOKEN)
    network                  farm network policy ([serve.sandboxes.networks.NAME]) for tasks
                             whose network mode is public (Harbor's default, allow_internet = true)
    offline_ok               run such tasks with no network instead of refusing them (default false)
    allowlist_network        farm policy for tasks with network_mode = "allowlist" (the operator
                             vouches it enforces their allowed_hosts); unset: they are refused
    build_args               {"NAME": "value"}: ARG values for every task's Dockerfile
    setup                    ["cmd", ...]: run once in each environment before its snapshot
    delete_environments      with Harbor's --delete: forget the farm environments this process
                             built fresh, when no sandbox uses them (default false: keep them)
    idle_timeout_secs, lifetime_secs   the sandboxes' (at most the service's: more is refused)
    exec_timeout_secs        a command's limit when Harbor gives none (default 86400, farm's most)
    max_output_bytes         cap of each command's stdout and stderr (default 16 MiB, farm's most)
    shell                    "auto" (bash when the image has it, else sh), "bash" or "sh"
    request_timeout_secs, retries      the SDK client's

This module needs Harbor (Python >= 3.12); `import farm_sdk` does not import it.
"""

from __future__ import annotations

import asyncio
import math
import signal as _signal
import stat
from pathlib import Path
from typing import Any, ClassVar, Dict, Optional, Set

from ._harbor_task import (
    DOCKERFILE_NAME,
    FARM_MAX_EXEC_SECS,
    BaseEnvironment,
    EnvironmentCapabilities,
    EnvironmentPaths,
    EnvironmentResourceCapabilities,
    ExecResult,
    FarmOptions,
    FarmRefusal,
    refusals,
    require_agent_environment_definition,
    sandbox_network,
    should_use_prebuilt_docker_image,
)
from .aio import AsyncFarm
from .errors import BuildError, Conflict, FarmError, NotFound

__all__ = ["FarmEnvironment", "FarmOptions", "FarmRefusal", "FarmCommandTimeout"]

# Harbor's output folders in the environment (EnvironmentPaths), made at start for whoever
# the agent and the verifier run as.
_LOG_DIRS = (
    EnvironmentPaths.agent_dir,
    EnvironmentPaths.verifier_dir,
    EnvironmentPaths.artifacts_dir,
)


class FarmCommandTimeout(RuntimeError):
    """A command ran past its timeout: farm killed its process group (as Harbor's Docker
    backend, a timed-out command is an error, not a result)."""


class FarmEnvironment(BaseEnvironment):
    """A Harbor environment that is a farm sandbox (see the module's documentation)."""

    options_model: ClassVar[type] = FarmOptions
    options: FarmOptions

    # Environments this process has force-built (Harbor's --force-build builds once per
    # process, not once per trial), and locks so concurrent trials of one environment wait for
    # one build.
    _forced: ClassVar[Set[str]] = set()
    _build_locks: ClassVar[Dict[str, asyncio.Lock]] = {}
    # Environments this process built fresh (for delete_environments).
    _built_fresh: ClassVar[Set[str]] = set()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._farm: Any = None
        self._environment: Any = None
        self._sandbox: Any = None
        self._shell = "bash"
        super().__init__(*args, **kwargs)

    # ---- what Harbor asks of an environment type -------------------------------------------

    @staticmethod
    def type() -> str:
        return "farm"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # An allowlist is declared supported so that Harbor lets the trial reach start(),
        # which maps it to the allowlist_network policy or refuses that one trial with the
        # reason (Harbor refuses an unsupported policy while making the trial, which ends the
        # whole job).
        return EnvironmentCapabilities(
            disable_internet=True,  # a sandbox has no network unless given a policy
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_wildcard_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv6_addresses=True,
            network_allowlist_ipv4_cidrs=True,
            network_allowlist_ipv6_cidrs=True,
            # No gpus, tpus, windows, mounted, docker_compose, stream; a sandbox's network is
            # fixed when it is made (dynamic_network_policy False).
        )

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        # A VM with exactly the task's vCPUs and memory: both what it gets and its ceiling.
        # Whole vCPUs only (fractional cpus are refused by Harbor before a trial is made).
        return EnvironmentResourceCapabilities(
            cpu_limit=True, cpu_request=True, memory_limit=True, memory_request=True
        )

    def _validate_definition(self) -> None:
        require_agent_environment_definition(
            self.environment_dir, docker_image=self.task_env_config.docker_image
        )

    # GPUs, TPUs and Windows are refused in start() instead of while Harbor makes the trial,
    # so such a task fails its own trial, with the reason, rather than ending the whole job.
    def _validate_gpu_support(self) -> None:
        return

    def _validate_tpu_support(self) -> None:
        return

    def _validate_windows_support(self) -> None:
        return

    # ---- start and stop ---------------------------------------------------------------------


    def _resources(self) -> Dict[str, Optional[int]]:
        cpus = self._effective_cpus
        return {
            "cpus": None if cpus is None else max(1, int(math.ceil(cpus))),
            "memory_mib": self._effective_memory_mb,
            "disk_mib": self._effective_storage_mb,
        }

    def _client(self) -> Any:
        if self._farm is None:
            self._farm = AsyncFarm(
                url=self.options.url,
                token=self.options.token,
                timeout=self.options.request_timeout_secs,
                retries=self.options.retries,
            )
        return self._farm

    def _on_build_log(self, line: str) -> None:
        self.logger.debug("farm build %s: %s", self.environment_name, line)

    async def _create_environment(self, *, source: str, force: bool) -> Any:
        """A ready farm environment from the task's image (source "image") or Dockerfile."""
        farm = self._client()
        common: Dict[str, Any] = dict(self._resources())
        common["setup"] = list(self.options.setup) or None
        common["on_log"] = self._on_build_log
        if source == "image":
            reference = self.task_env_config.docker_image or ""
            # farm reads "minimal" and "python" as its own templates; a Harbor image is a
            # registry reference, always.
            image = reference if reference.startswith("registry:") else "registry:" + reference

            def make(force_: bool, wait: bool) -> Any:
                return farm.environments.create(image=image, force=force_, wait=wait, **common)
        else:

            def make(force_: bool, wait: bool) -> Any:
                return farm.environments.from_dockerfile(
                    str(self.environment_dir),
                    dockerfile=DOCKERFILE_NAME,
                    build_args=dict(self.options.build_args) or None,
                    force=force_,
                    wait=wait,
                    **common,
                )

        if not self.options.delete_environments:
            return await make(force, True)
        # Know whether this request builds it (202, "building"): only those are forgotten later.
        first = await make(force, False)
        if first.state == "ready":
            return first
        if first.state == "failed":
            raise BuildError.of(first)
        self._built_fresh.add(first.id)
        return await farm.environments.wait(first.id, on_log=self._on_build_log)

    async def _environment_for(self, force_build: bool) -> Any:
        cfg = self.task_env_config
        has_dockerfile = (self.environment_dir / DOCKERFILE_NAME).exists()
        use_image = should_use_prebuilt_docker_image(
            self.environment_dir, docker_image=cfg.docker_image, force_build=force_build
        )
        source = "image" if use_image else "dockerfile"
        key = "\n".join(
            [source, self.environment_id, str(cfg.docker_image), repr(sorted(self._resources().items())),
             repr(sorted(self.options.build_args.items())), repr(self.options.setup)]
        )
        lock = self._build_locks.setdefault(key, asyncio.Lock())
        async with lock:
            force = force_build and key not in self._forced
            try:
                environment = await self._create_environment(source=source, force=force)
            except BuildError as e:
                if source != "image" or not has_dockerfile:
                    raise
                # As Harbor: a prebuilt image that cannot be had gives way to the Dockerfile.
                self.logger.warning(
                    "docker_image %s could not be had (%s); building %s/%s instead",
                    cfg.docker_image, e, self.environment_dir.name, DOCKERFILE_NAME,
                )
                environment = await self._create_environment(source="dockerfile", force=force)
            if force:
                self._forced.add(key)
        return environment

    async def start(self, force_build: bool) -> None:
        reasons = refusals(self)
        if reasons:
            raise FarmRefusal("farm cannot run this task: " + "; ".join(reasons))
        network = sandbox_network(self, self.options)
        self._environment = await self._environment_for(force_build)

        metadata = {
            "harbor.session_id": self.session_id,
            "harbor.environment_name": self.environment_name,
            "harbor.environment_id": self.environment_id,
            "harbor.trial_name": self.trial_paths.trial_dir.name,
        }
        if self.context_id is not None:
            metadata["harbor.context_id"] = str(self.context_id)
        self._sandbox = await self._client().sandboxes.create(
            self._environment,
            env=self._startup_env() or None,
            network=network,
            idle_timeout_secs=self.options.idle_timeout_secs,
            lifetime_secs=self.options.lifetime_secs,
            metadata=metadata,
        )
        try:
            await self._prepare_sandbox()
        except BaseException:
            # Harbor stops the environment after a failed start too; this covers other callers.
            await asyncio.shield(self._kill_sandbox())
            raise

    async def _prepare_sandbox(self) -> None:
        if self.options.shell == "auto":
            probe = await self._sandbox.exec(
                ["/bin/sh", "-c", "command -v bash"], cwd="/", user="root", timeout=60
            )
            self._shell = "bash" if probe.exit_code == 0 else "sh"
            if self._shell == "sh":
                self.logger.debug("no bash in the image: commands run with /bin/sh -c")
        else:
            self._shell = self.options.shell
        # As Docker does for a service's working_dir: the task's workdir exists.
        workdir = self.task_env_config.workdir
        if workdir:
            made = await self._sandbox.exec(["mkdir", "-p", workdir], cwd="/", user="root", timeout=60)
            if made.exit_code != 0:
                raise RuntimeError(f"cannot make the task's workdir {workdir}: {made.stderr or made.stdout}")
        dirs = self._mount_targets(writable_only=True) or [str(d) for d in _LOG_DIRS]
        result = await self.ensure_dirs(dirs)
        if result is not None and result.return_code != 0:
            raise RuntimeError(
                f"cannot make Harbor's folders {', '.join(map(str, dirs))}: {result.stderr or result.stdout}"
            )
        await self._upload_environment_dir_after_start()

    async def _kill_sandbox(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is None:
            return
        try:
            await sandbox.kill()
        except NotFound:
            pass  # already gone (idle timeout, lifetime, a restart of the service)
        except Exception as e:
            # The trial's result stands; farm removes the sandbox at its idle timeout.
            self.logger.warning(
                "could not remove farm sandbox %s (%s): %s; the service removes it at its idle timeout",
                getattr(sandbox, "id", "?"), self.session_id, e,
            )

    async def stop(self, delete: bool) -> None:
        """Removes the sandbox (a sandbox is never kept: a paused one would not outlive the
        service). The environment is a content-addressed cache shared with every other trial
        and user of the service, so it is kept, whatever `delete` says, unless
        delete_environments is set: then the environments this process built fresh are
        forgotten when no sandbox uses them."""
        await self._kill_sandbox()
        environment, self._environment = self._environment, None
        try:
            if delete and self.options.delete_environments and environment is not None:
                if environment.id in self._built_fresh:
                    try:
                        await self._client().environments.delete(environment.id)
                        self._built_fresh.discard(environment.id)
                    except (Conflict, NotFound) as e:
                        self.logger.debug("farm environment %s kept: %s", environment.id, e)
                    except Exception as e:
                        self.logger.warning("could not forget farm environment %s: %s", environment.id, e)
        finally:
            farm, self._farm = self._farm, None
            if farm is not None:
                try:
                    await farm.close()
                except Exception as e:
                    self.logger.debug("closing the farm client: %s", e)

    # ---- commands ---------------------------------------------------------------------------

    def _live(self) -> Any:
        if self._sandbox is None:
            raise RuntimeError("the farm sandbox is not running: start the environment first")
        return self._sandbox

    async def exec(
        self,
        command: str,
        cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        timeout_sec: Optional[int] = None,
        user: Optional[Any] = None,
    ) -> ExecResult:
        sandbox = self._live()
        user = self._resolve_user(user)
        timeout = (
            self.options.exec_timeout_secs
            if not timeout_sec
            else min(FARM_MAX_EXEC_SECS, max(1, int(math.ceil(timeout_sec))))
        )
        result = await sandbox.exec(
            [self._shell, "-c", command],
            cwd=cwd or self.task_env_config.workdir,
            env=self._merge_env(env),
            user=None if user is None else str(user),
            timeout=timeout,
            max_output_bytes=self.options.max_output_bytes,
        )
        if result.timed_out:
            raise FarmCommandTimeout(
                f"command timed out after {timeout} seconds in farm sandbox "
                f"{getattr(sandbox, 'id', '?')}: {command[:200]!r}"
            )
        if result.stdout_truncated or result.stderr_truncated:
            self.logger.warning(
                "output of %r cut at %s bytes per stream (farm's cap)", command[:200], result.output_cap_bytes
            )
        return ExecResult(
            stdout=result.stdout,
            stderr=result.stderr,
            return_code=_return_code(result, command),
        )

    # ---- files ------------------------------------------------------------------------------
    # Transfers run as the guest agent does (root), as `docker cp` does: Harbor writes
    # root-owned places such as /tests, /solution and /logs whatever the image's user.

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        source = Path(source_path)
        data = await asyncio.to_thread(source.read_bytes)
        await self._live().files.write(target_path, data, mode=stat.S_IMODE(source.stat().st_mode))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        source = Path(source_dir)
        if not source.is_dir():
            raise FileNotFoundError(f"source directory {source} does not exist")
        await self._live().files.upload_dir(str(source), target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        await self._live().files.download_file(source_path, str(target))

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        await self._live().files.download_dir(source_dir, str(target))


def _return_code(result: Any, command: str) -> int:
    """A shell's exit status: the code, or 128 + the signal that ended the command."""
    if result.exit_code is not None:
        return int(result.exit_code)
    sig = result.signal
    if sig is not None:
        if isinstance(sig, int):
            return 128 + sig
        name = str(sig).upper()
        if name.isdigit():
            return 128 + int(name)
        try:
            return 128 + int(_signal.Signals[name if name.startswith("SIG") else "SIG" + name])
        except KeyError:
            pass
    raise FarmError(None, f"farm gave no exit status for {command[:200]!r} (signal {sig!r})")