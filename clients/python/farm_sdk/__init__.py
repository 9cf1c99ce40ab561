"""The Python SDK of farm's `farm serve`: sandboxes (`Farm`, `Sandbox`, and their asyncio
twins `AsyncFarm`, `AsyncSandbox`) with what they host (background processes, open ports, a
terminal), the rollouts API with its fleet (`farm_sdk.fleet`), and backends for agent
frameworks (`farm_sdk.harbor`, `farm_sdk.swerex`, `farm_sdk.minisweagent`: imported on
their own).

    from farm_sdk import Farm

    farm = Farm()                                   # $FARM_URL, $FARM_SERVE_TOKEN
    env = farm.environments.create(image="python:3.12-slim")
    with farm.sandboxes.create(env) as sb:
        result = sb.exec(["python3", "-c", "print(6 * 7)"])
        assert result.ok and result.stdout == "42\\n"
"""

from . import errors as _errors
from . import models as _models
from ._version import __version__
from .aio import AsyncFarm, AsyncFiles, AsyncSandbox, SandboxCreation
from .aio_hosting import AsyncPorts, AsyncProcess, AsyncProcesses
from .aio_terminal import AsyncTerminal
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
from .hosting import Ports, Process, Processes
from .hosting_models import OutputChunk, Port, ProcessInfo
from .models import AsyncEnvironment, Context, EntryInfo, Environment, ExecResult, FolderListing, ResetInfo, SandboxInfo
from .terminal import Terminal
from .workspaces import AsyncWorkspaces, Workspaces

__all__ = [
    "__version__",
    "Farm",
    "AsyncFarm",
    "Workspaces",
    "AsyncWorkspaces",
    "Sandbox",
    "AsyncSandbox",
    "SandboxCreation",
    "Files",
    "AsyncFiles",
    "Processes",
    "AsyncProcesses",
    "Process",
    "AsyncProcess",
    "Ports",
    "AsyncPorts",
    "Terminal",
    "AsyncTerminal",
    "ProcessInfo",
    "OutputChunk",
    "Port",
    # What errors and models export (a page of build log is models' own).
    *(name for name in _errors.__all__ if name != "error_from_answer"),
    *(name for name in _models.__all__ if name != "LogPage"),
]
