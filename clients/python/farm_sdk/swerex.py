"""SWE-ReX's deployment on farm: `FarmDeployment` runs SWE-ReX's server in a farm sandbox
and gives SWE-ReX's own `RemoteRuntime` reaching it through the sandbox's open port.

    from farm_sdk.swerex import FarmDeployment
    from swerex.runtime.abstract import BashAction, CreateBashSessionRequest

    deployment = FarmDeployment(environment="env-...", url="http://127.0.0.1:8765")
    await deployment.start()
    await deployment.runtime.create_session(CreateBashSessionRequest())
    print((await deployment.runtime.run_in_session(BashAction(command="ls"))).output)
    await deployment.stop()

The environment's image must have SWE-ReX installed (`swerex-remote` on the PATH; a farm
environment from a Dockerfile that pip-installs `swe-rex`). `start()` makes a sandbox of
it, starts `swerex-remote --auth-token TOKEN --port PORT` there as a background process
(the token is random, made per deployment), opens the port, and waits until the server
answers. `stop()` closes the runtime and removes the sandbox; so does the deployment's
collection, or the interpreter's exit, when nobody awaited `stop()`.

Why a subclass of `RemoteRuntime`: the runtime sends only its `X-API-Key` header and builds
every URL as `{host}:{port}/{endpoint}` from its config, while farm's port listener needs the
port's token. `FarmRemoteRuntime` adds the `Farm-Port-Token` header to the headers the
runtime sends (its `_headers` property, which every request reads), and its host is the
listener's address. Nothing else of SWE-ReX is changed.

Needs SWE-ReX (`pip install swe-rex`, Python >= 3.10); `import farm_sdk` does not import it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any, Dict, Mapping, Optional, Union

from ._beside import beside
from ._release import release_by_id
from .aio import AsyncFarm, AsyncSandbox
from .aio_hosting import AsyncProcess
from .hosting_models import Port
from .models import Environment

with beside():
    try:
        from swerex.deployment.abstract import AbstractDeployment
        from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook
        from swerex.exceptions import DeploymentNotStartedError
        from swerex.runtime.abstract import IsAliveResponse
        from swerex.runtime.remote import RemoteRuntime
        from swerex.utils.log import get_logger
    except ImportError as _e:  # pragma: no cover - only without SWE-ReX
        raise ImportError(f"farm_sdk.swerex needs SWE-ReX (pip install swe-rex): {_e}") from _e

__all__ = ["FarmDeployment", "FarmRemoteRuntime"]

#: The guest port SWE-ReX's server listens on, unless told otherwise.
DEFAULT_PORT = 8000


class FarmRemoteRuntime(RemoteRuntime):
    """SWE-ReX's `RemoteRuntime`, with the header farm's port listener reads the port's token
    from (see the module's documentation)."""

    def __init__(self, *, port_header: Mapping[str, str], logger: Optional[logging.Logger] = None, **kwargs: Any):
        """`port_header` is the open port's `{"Farm-Port-Token": TOKEN}` (`Port.headers`);
        `kwargs` are `RemoteRuntimeConfig`'s (`auth_token`, `host`, `port`, `timeout`)."""
        super().__init__(logger=logger, **kwargs)
        self._port_header = dict(port_header)

    @property
    def _headers(self) -> Dict[str, str]:
        return {**super()._headers, **self._port_header}


class FarmDeployment(AbstractDeployment):
    """A SWE-ReX deployment whose runtime runs in a farm sandbox.

    `environment` is a ready farm environment (an `Environment` or its id) whose image has
    SWE-ReX; `url` and `token` name the service (default `$FARM_URL`, `$FARM_SERVE_TOKEN`),
    or `farm` is an `AsyncFarm` to use (not closed by `stop`). `sandbox_options` go to
    `farm.sandboxes.create` (`env`, `workdir`, `network`, `idle_timeout_secs`, ...).
    `startup_timeout` is how long the server may take to answer once started;
    `runtime_timeout` each liveness check's.
    """

    def __init__(
        self,
        *,
        environment: Union[Environment, str],
        url: Optional[str] = None,
        token: Optional[str] = None,
        farm: Optional[AsyncFarm] = None,
        port: int = DEFAULT_PORT,
        executable: str = "swerex-remote",
        sandbox_options: Optional[Mapping[str, Any]] = None,
        startup_timeout: float = 300.0,
        runtime_timeout: float = 30.0,
        logger: Optional[logging.Logger] = None,
    ) -> None:
        self.logger = logger or get_logger("rex-deploy")
        self._environment = environment
        self._farm = farm
        self._owns_farm = farm is None
        self._url, self._token = url, token
        self._port = port
        self._executable = executable
        self._sandbox_options = dict(sandbox_options or {})
        self._startup_timeout = startup_timeout
        self._runtime_timeout = runtime_timeout
        self._hooks = CombinedDeploymentHook()
        self._sandbox: Optional[AsyncSandbox] = None
        self._server: Optional[AsyncProcess] = None
        self._runtime: Optional[FarmRemoteRuntime] = None
        self._release = None

    def __del__(self) -> None:
        # SWE-ReX's own __del__ schedules stop() on the running loop, whose client may be
        # closed by the time it runs, or cannot run it: the sandbox is removed here, at once,
        # by id with a client of its own (and the finalizer is spent: it runs once).
        release = getattr(self, "_release", None)  # a half-made object has none
        if release is not None:
            self._release, self._sandbox, self._server = None, None, None
            release()

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    @property
    def runtime(self) -> FarmRemoteRuntime:
        """The runtime (`DeploymentNotStartedError` before `start` and after `stop`)."""
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return self._runtime

    @property
    def sandbox(self) -> AsyncSandbox:
        """The farm sandbox the runtime runs in (`DeploymentNotStartedError` when there is none)."""
        if self._sandbox is None:
            raise DeploymentNotStartedError()
        return self._sandbox

    @property
    def server(self) -> AsyncProcess:
        """SWE-ReX's server, a background process of the sandbox: its output is its log."""
        if self._server is None:
            raise DeploymentNotStartedError()
        return self._server

    async def is_alive(self, *, timeout: Optional[float] = None) -> IsAliveResponse:
        return await self.runtime.is_alive(timeout=timeout)

    async def start(self) -> None:
        """Makes the sandbox, starts SWE-ReX's server in it, opens its port and waits until it
        answers. A failure removes the sandbox again."""
        if self._runtime is not None:
            self.logger.warning("the deployment is started already: start() ignored")
            return
        if self._farm is None:
            self._farm = AsyncFarm(url=self._url, token=self._token)
        self._hooks.on_custom_step("Starting farm sandbox")
        started = time.monotonic()
        self._sandbox = await self._farm.sandboxes.create(self._environment, **self._sandbox_options)
        # Removed when this object is collected or the interpreter exits, if stop() was not
        # awaited.
        self._release = release_by_id(self, self._farm.url, self._farm._http.token, self._sandbox.id)
        self.logger.info("farm sandbox %s made in %.1f s", self._sandbox.id, time.monotonic() - started)
        try:
            await self._start_server()
        except BaseException:
            await asyncio.shield(self._remove_sandbox())
            raise

    async def _start_server(self) -> None:
        sandbox = self.sandbox
        auth_token = secrets.token_hex(16)
        argv = [self._executable, "--auth-token", auth_token, "--port", str(self._port)]
        self._hooks.on_custom_step("Starting runtime")
        server = self._server = await sandbox.processes.start(argv)
        port: Port = await sandbox.ports.open(self._port)
        self._runtime = FarmRemoteRuntime(
            port_header=port.headers,
            host=port.base_url,
            port=None,
            auth_token=auth_token,
            timeout=self._runtime_timeout,
            logger=self.logger,
        )
        await self._wait_until_alive(server)

    async def _wait_until_alive(self, server: AsyncProcess) -> None:
        """Until the runtime answers; a server that ended instead is an error with its output."""
        deadline = time.monotonic() + self._startup_timeout
        answer = IsAliveResponse(is_alive=False, message="not asked yet")
        while time.monotonic() < deadline:
            answer = await self.runtime.is_alive(timeout=self._runtime_timeout)
            if answer:
                self.logger.info("SWE-ReX answers in sandbox %s (pid %s)", self.sandbox.id, server.pid)
                return
            info = await server.refresh()
            if not info.running:
                out = await server.output("stdout")
                err = await server.output("stderr")
                raise RuntimeError(
                    f"SWE-ReX's server ({self._executable}) ended in sandbox {self.sandbox.id} before it answered "
                    f"(exit code {info.exit_code}, signal {info.signal}):\n{err.data[-4000:]}{out.data[-2000:]}"
                )
            await asyncio.sleep(0.5)
        raise TimeoutError(
            f"SWE-ReX's server in sandbox {self.sandbox.id} did not answer within {self._startup_timeout} s: "
            f"{answer.message[-2000:]}"
        )

    async def stop(self) -> None:
        """Closes the runtime and removes the sandbox (a deployment not started is no error)."""
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            try:
                await runtime.close()
            except Exception as e:  # the sandbox goes anyway
                self.logger.debug("closing the runtime: %s", e)
        await self._remove_sandbox()
        if self._owns_farm and self._farm is not None:
            farm, self._farm = self._farm, None
            await farm.close()

    async def _remove_sandbox(self) -> None:
        sandbox, self._sandbox, self._server = self._sandbox, None, None
        if self._release is not None:
            self._release.detach()
            self._release = None
        if sandbox is not None:
            await sandbox.kill()
