"""What `farm_sdk.harbor` makes of a Harbor task: the backend's `--ek` options, what it
refuses (with the reason), and the farm network policy a task's network becomes.

Harbor's classes are imported here for `farm_sdk.harbor` too, so that the guard on sys.path
below stands in one place.
"""

from __future__ import annotations

import os
import sys
from typing import Dict, List, Literal, Optional

# farm_sdk's folder holds harbor.py: with that folder on sys.path (python run from inside
# farm_sdk/), "harbor" would be that file. Harbor is imported with the folder left out.
_here = os.path.dirname(os.path.abspath(__file__))
_saved_path = list(sys.path)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
try:
    from harbor.environments.base import BaseEnvironment, ExecResult
    from harbor.environments.capabilities import (
        EnvironmentCapabilities,
        EnvironmentResourceCapabilities,
    )
    from harbor.environments.definition import (
        COMPOSE_FILE_NAME,
        DOCKERFILE_NAME,
        require_agent_environment_definition,
        should_use_prebuilt_docker_image,
    )
    from harbor.environments.options import EnvironmentOptions
    from harbor.models.task.config import NetworkMode, TaskOS
    from harbor.models.trial.paths import EnvironmentPaths
    from pydantic import Field
except ImportError as _e:  # pragma: no cover - only without Harbor
    raise ImportError(
        "farm_sdk.harbor is Harbor's environment backend and needs Harbor "
        "(pip install 'harbor==0.26.*', which needs Python >= 3.12): " + str(_e)
    ) from _e
finally:
    sys.path[:] = _saved_path

# What farm_sdk.harbor takes from here, Harbor's classes among them.
__all__ = [
    "BaseEnvironment",
    "ExecResult",
    "EnvironmentCapabilities",
    "EnvironmentResourceCapabilities",
    "DOCKERFILE_NAME",
    "require_agent_environment_definition",
    "should_use_prebuilt_docker_image",
    "EnvironmentPaths",
    "FARM_MAX_EXEC_SECS",
    "FarmRefusal",
    "FarmOptions",
    "refusals",
    "sandbox_network",
]

FARM_MAX_EXEC_SECS = 86400
FARM_MAX_OUTPUT = 16 << 20


class FarmRefusal(RuntimeError):
    """The task asks for something farm cannot honour; the message names it."""


class FarmOptions(EnvironmentOptions):
    """The `--ek` options of `farm_sdk.harbor:FarmEnvironment`."""

    url: Optional[str] = Field(default=None, description="farm serve's URL (default $FARM_URL or http://127.0.0.1:8765).")
    token: Optional[str] = Field(default=None, description="Bearer token (default $FARM_SERVE_TOKEN).")
    network: Optional[str] = Field(
        default=None,
        description="farm network policy given to sandboxes of tasks whose network mode is public "
        "(Harbor's default; allow_internet = true). Unset: such tasks are refused unless offline_ok.",
    )
    offline_ok: bool = Field(
        default=False,
        description="Run tasks that ask for public internet with no network instead of refusing them.",
    )
    allowlist_network: Optional[str] = Field(
        default=None,
        description="farm network policy for tasks with network_mode = 'allowlist'; the operator "
        "vouches that it enforces their allowed_hosts. Unset: such tasks are refused at start.",
    )
    build_args: Dict[str, str] = Field(default_factory=dict, description="ARG values for every Dockerfile.")
    setup: List[str] = Field(default_factory=list, description="Commands run once in each environment before its snapshot.")
    delete_environments: bool = Field(
        default=False,
        description="With Harbor's --delete, forget the farm environments this process built fresh "
        "(when no sandbox uses them). Default: keep them, they are a shared cache.",
    )
    idle_timeout_secs: Optional[int] = Field(default=None, ge=1)
    lifetime_secs: Optional[int] = Field(default=None, ge=1)
    exec_timeout_secs: int = Field(
        default=FARM_MAX_EXEC_SECS, ge=1, le=FARM_MAX_EXEC_SECS,
        description="A command's limit when Harbor gives none.",
    )
    max_output_bytes: int = Field(default=FARM_MAX_OUTPUT, ge=1, le=FARM_MAX_OUTPUT)
    shell: Literal["auto", "bash", "sh"] = Field(default="auto")
    request_timeout_secs: float = Field(default=600.0, gt=0)
    retries: int = Field(default=3, ge=0)


def refusals(environment: BaseEnvironment) -> List[str]:
    """What the task of `environment` asks that farm cannot honour, each with its reason."""
    reasons: List[str] = []
    cfg = environment.task_env_config
    if environment._effective_gpus > 0 or cfg.gpu_types:
        reasons.append(
            f"the task asks for {environment._effective_gpus} GPU(s)"
            + (f" of type {', '.join(cfg.gpu_types)}" if cfg.gpu_types else "")
            + ": farm's sandboxes are CPU-only VMs"
        )
    if cfg.tpu is not None:
        reasons.append(f"the task asks for a TPU slice ({cfg.tpu.type}, {cfg.tpu.topology}): farm has none")
    if cfg.os != TaskOS.LINUX:
        reasons.append(f"the task targets {cfg.os.value} ([environment] os): farm's sandboxes are Linux VMs")
    if (environment.environment_dir / COMPOSE_FILE_NAME).exists():
        reasons.append(
            f"the task's environment is a Docker Compose project ({environment.environment_dir.name}/"
            f"{COMPOSE_FILE_NAME}): farm runs one VM per environment, not compose services"
        )
    if environment._host_mounts:
        targets = ", ".join(str(m.get("target")) for m in environment._host_mounts)
        reasons.append(f"host folders are to be mounted ({targets}): farm cannot mount host folders into a sandbox")
    return reasons


def sandbox_network(environment: BaseEnvironment, options: FarmOptions) -> Optional[str]:
    """The farm network policy for `environment`'s (static) Harbor network policy."""
    policy = environment.network_policy
    mode = policy.network_mode
    if mode == NetworkMode.NO_NETWORK:
        return None
    if mode == NetworkMode.ALLOWLIST:
        if not options.allowlist_network:
            raise FarmRefusal(
                "the task's network is an allowlist (" + ", ".join(policy.allowed_hosts)
                + "): farm takes no client egress rules, only its own named policies "
                "(set --ek allowlist_network=NAME to a [serve.sandboxes.networks.NAME] policy that enforces them)"
            )
        environment.logger.debug(
            "farm network policy %r stands for the allowlist %s",
            options.allowlist_network,
            policy.allowed_hosts,
        )
        return options.allowlist_network
    # Public: Harbor's default, and what allow_internet = true means.
    if options.network:
        return options.network
    if options.offline_ok:
        environment.logger.warning(
            "the task asks for internet access; running it with no network (offline_ok)"
        )
        return None
    raise FarmRefusal(
        "the task asks for internet access (network_mode = 'public', Harbor's default, or "
        "allow_internet = true) and no farm network policy is configured for it: set --ek "
        "network=NAME to a [serve.sandboxes.networks.NAME] policy of the service, or --ek "
        "offline_ok=true to run such tasks with no network"
    )
