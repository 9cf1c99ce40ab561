"""mini-swe-agent's environment on farm: `FarmEnvironment` runs each action of the agent as a
command in a farm sandbox (mini-swe-agent 2.x's `Environment` protocol: `config`,
`execute`, `get_template_vars`, `serialize`).

    from minisweagent.agents.default import DefaultAgent
    from farm_sdk.minisweagent import FarmEnvironment

    env = FarmEnvironment(environment="env-...", url="http://127.0.0.1:8765", cwd="/testbed")
    try:
        result = DefaultAgent(model, env, **agent_config).run("Fix the bug in ...")
    finally:
        env.cleanup()                      # removes the sandbox

As mini-swe-agent's Docker environment does: each action runs in a new shell (`bash -lc`
unless `interpreter` says otherwise) in `cwd` with `env`, its stderr merged into its
stdout in order, killed (process group and all) past `timeout` seconds; an action whose
output's first line is `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` and that exits 0 submits
the rest of its output (`Submitted`). The template variables `system`, `release`, `version`
and `machine` are the sandbox's own (`uname`), not the host's.

Needs mini-swe-agent (`pip install mini-swe-agent`, Python >= 3.10); `import farm_sdk` does
not import it.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Optional

from ._beside import beside
from ._release import release_with
from .docker_cli import environment_of
from .client import Farm, Sandbox
from .errors import FarmError

with beside():
    try:
        from minisweagent.exceptions import Submitted
        from minisweagent.utils.serialize import recursive_merge
        from pydantic import BaseModel, Field
    except ImportError as _e:  # pragma: no cover - only without mini-swe-agent
        raise ImportError(f"farm_sdk.minisweagent needs mini-swe-agent (pip install mini-swe-agent): {_e}") from _e

__all__ = ["FarmEnvironment", "FarmEnvironmentConfig"]

#: What an action prints first to submit (mini-swe-agent's word for it).
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
#: Runs the interpreter and its command with stderr merged into stdout, in order.
_MERGED = ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh"]


class FarmEnvironmentConfig(BaseModel):
    """The options of `FarmEnvironment`."""

    environment: Optional[str] = None
    """The farm environment (its id) the sandbox is made from: a ready one (unless a
    `sandbox` or an `image` is given)."""
    image: Optional[str] = None
    """An image instead (a built-in or registry image, `dockerfile:PATH`, or an environment's
    id), as mini-swe-agent's Docker environment takes one: its environment is built on first
    use and found by content after."""
    url: Optional[str] = None
    """farm serve's URL (default $FARM_URL, else http://127.0.0.1:8765)."""
    token: Optional[str] = Field(default=None, exclude=True)
    """Its bearer token (default $FARM_SERVE_TOKEN); never serialized."""
    cwd: str = "/"
    """Folder each action runs in."""
    env: Dict[str, str] = {}
    """Variables set for each action."""
    forward_env: List[str] = []
    """Variables of this process passed on to each action when set (`env` wins)."""
    timeout: int = 30
    """Seconds an action may run; past it, it is killed with its process group."""
    interpreter: List[str] = ["bash", "-lc"]
    """What runs an action: the command is its last argument."""
    network: Optional[str] = None
    """The farm network policy of the sandbox (default: no network)."""
    sandbox_options: Dict[str, Any] = {}
    """More of `farm.sandboxes.create`'s options (`user`, `idle_timeout_secs`, `metadata`...)."""
    max_output_bytes: Optional[int] = None
    """Cap of an action's output (default farm's, 1 MiB); cut output says so at its end."""


class FarmEnvironment:
    """mini-swe-agent's environment in a farm sandbox (see the module's documentation). The
    sandbox is made at once; `cleanup()` (also on leaving a `with` block) removes it, and so
    does the object's collection or the interpreter's exit when nobody called it. An
    existing `sandbox` may be given instead (then it is left alone)."""

    def __init__(
        self,
        *,
        config_class: type = FarmEnvironmentConfig,
        logger: Optional[logging.Logger] = None,
        sandbox: Optional[Sandbox] = None,
        **kwargs: Any,
    ) -> None:
        self.logger = logger or logging.getLogger("minisweagent.environment")
        self.config = config_class(**kwargs)
        self._uname: Optional[Dict[str, str]] = None
        self._owned = sandbox is None
        self._release = None
        if sandbox is None:
            if not self.config.environment and not self.config.image:
                raise ValueError("FarmEnvironment needs environment= (a farm environment's id), image= or sandbox=")
            farm = Farm(url=self.config.url, token=self.config.token)
            try:
                environment = self.config.environment or environment_of(farm, self.config.image or "")
                options = dict(self.config.sandbox_options, network=self.config.network)
                sandbox = farm.sandboxes.create(environment, **options)
            except BaseException:
                farm.close()
                raise
            self.logger.info("made farm sandbox %s of %s", sandbox.id, environment)
            # Removed when this object is collected or the interpreter exits, if cleanup()
            # was not called: mini-swe-agent's runners never call it.
            self._release = release_with(self, sandbox, close=True)
        self.sandbox: Optional[Sandbox] = sandbox

    def _live(self) -> Sandbox:
        if self.sandbox is None:
            raise RuntimeError("the farm sandbox was removed (cleanup() ran): make a new FarmEnvironment")
        return self.sandbox

    def _variables(self) -> Dict[str, str]:
        forwarded = {k: os.environ[k] for k in self.config.forward_env if k in os.environ}
        return {**forwarded, **self.config.env}

    def execute(self, action: dict, cwd: str = "", *, timeout: Optional[int] = None) -> Dict[str, Any]:
        """Runs `action["command"]` in the sandbox: `{"output", "returncode",
        "exception_info"}` (and `extra` when it failed to run). Raises `Submitted` when the
        action submits."""
        command = action.get("command", "")
        limit = timeout or self.config.timeout
        sandbox = self._live()  # a removed sandbox is the caller's error, not the action's
        try:
            result = sandbox.exec(
                [*_MERGED, *self.config.interpreter, command],
                cwd=cwd or self.config.cwd,
                env=self._variables() or None,
                timeout=limit,
                max_output_bytes=self.config.max_output_bytes,
            )
            output = _output(result, command, limit)
        except (FarmError, RuntimeError, ValueError) as e:
            output = {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {e}",
                "extra": {"exception_type": type(e).__name__, "exception": str(e)},
            }
        self._check_finished(output)
        return output

    def _check_finished(self, output: Dict[str, Any]) -> None:
        """Raises `Submitted` when the output's first line is the submit word and the action
        exited 0: the rest of the output is the submission."""
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def uname(self) -> Dict[str, str]:
        """The sandbox's `system`, `node`, `release`, `version` and `machine` (asked once)."""
        if self._uname is None:
            names = ("system", "node", "release", "version", "machine")
            result = self._live().exec(["/bin/sh", "-c", "uname -s; uname -n; uname -r; uname -v; uname -m"], timeout=60)
            lines = result.stdout.splitlines()
            if not result.ok or len(lines) != len(names):
                raise FarmError(None, f"uname failed in sandbox {self._live().id}: {result.stderr or result.stdout}")
            self._uname = dict(zip(names, lines))
        return self._uname

    def get_template_vars(self, **kwargs: Any) -> Dict[str, Any]:
        return recursive_merge(self.config.model_dump(), self.uname(), kwargs)

    def serialize(self) -> Dict[str, Any]:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
                },
                "farm": {"sandbox": self.sandbox.id if self.sandbox is not None else None},
            }
        }

    def cleanup(self) -> None:
        """Removes the sandbox this environment made (and closes its client)."""
        sandbox, self.sandbox = self.sandbox, None
        if self._release is not None:
            self._release.detach()
        if sandbox is None or not self._owned:
            return
        try:
            sandbox.kill()
        finally:
            sandbox.farm.close()

    def __enter__(self) -> "FarmEnvironment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _output(result: Any, command: str, limit: int) -> Dict[str, Any]:
    """An exec's result as mini-swe-agent's environments give it."""
    if result.timed_out:
        message = f"Command '{command}' timed out after {limit} seconds"
        return {
            "output": result.stdout,
            "returncode": -1,
            "exception_info": f"An error occurred while executing the command: {message}",
            "extra": {"exception_type": "TimeoutExpired", "exception": message},
        }
    text = result.stdout
    if result.stdout_truncated:
        text += f"\n[output cut at {result.output_cap_bytes} bytes]\n"
    code = result.exit_code
    if code is None:  # ended by a signal: as a shell reports it
        code = 128 + result.signal if isinstance(result.signal, int) else -1
    return {"output": text, "returncode": code, "exception_info": ""}
