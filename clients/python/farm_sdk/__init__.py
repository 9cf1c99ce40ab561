"""The Python SDK of farm's `farm serve`: sandboxes (`Farm`, `Sandbox`, and their asyncio
twins `AsyncFarm`, `AsyncSandbox`) and the rollouts API with its fleet (`farm_sdk.fleet`).

    from farm_sdk import Farm

    farm = Farm()                                   # $FARM_URL, $FARM_SERVE_TOKEN
    env = farm.environments.create(image="python:3.12-slim")
    with farm.sandboxes.create(env) as sb:
        result = sb.exec(["python3", "-c", "print(6 * 7)"])
        assert result.ok and result.stdout == "42\\n"
"""

from ._version import __version__
from .aio import AsyncFarm, AsyncFiles, AsyncSandbox, SandboxCreation
from .client import Farm, Files, Sandbox
from .errors import (
    BadRequest,
    BuildError,
    Busy,
    Conflict,
    ConnectionFailed,
    FarmError,
    NotFound,
    PayloadTooLarge,
    ServerError,
    Unauthorized,
    UnsafeArchive,
    WaitTimeout,
)
from .models import AsyncEnvironment, Context, Environment, ExecResult, SandboxInfo

__all__ = [
    "__version__",
    "Farm",
    "AsyncFarm",
    "Sandbox",
    "AsyncSandbox",
    "SandboxCreation",
    "Files",
    "AsyncFiles",
    "Environment",
    "AsyncEnvironment",
    "SandboxInfo",
    "ExecResult",
    "Context",
    "FarmError",
    "BadRequest",
    "Unauthorized",
    "NotFound",
    "Conflict",
    "PayloadTooLarge",
    "Busy",
    "ServerError",
    "ConnectionFailed",
    "BuildError",
    "WaitTimeout",
    "UnsafeArchive",
]
