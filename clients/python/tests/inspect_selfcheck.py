"""inspect_ai's own conformance suite for sandbox providers (`inspect_ai.util._sandbox.
self_check`, from PyPI, unmodified: its 44 checks) against farm's sandbox type on a real
`farm serve`. `farm/tests/inspect.rs` runs it in the inspect venv of scripts/setup.sh:

    FARM_URL=... FARM_SERVE_TOKEN=... FARM_INSPECT_ENV=env-... \\
        python -m pytest -p no:cacheprovider clients/python/tests/inspect_selfcheck.py

Its name keeps it out of a plain `pytest clients/python/tests`. One sandbox serves the
module's checks, as inspect's own runner shares one per provider; it is made and removed
through the provider's own task and sample hooks.
"""

import os

import pytest
from inspect_ai.util._sandbox.self_check import *  # noqa: F401,F403 (the suite's checks)

from farm_sdk.inspectai import FarmSandboxConfig, FarmSandboxEnvironment

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
async def shared_env(anyio_backend):
    config = FarmSandboxConfig(environment=os.environ["FARM_INSPECT_ENV"])
    await FarmSandboxEnvironment.task_init("self_check", config)
    envs = await FarmSandboxEnvironment.sample_init("self_check", config, {"__sample_id__": "self_check"})
    yield envs["default"]
    await FarmSandboxEnvironment.sample_cleanup("self_check", config, envs, interrupted=False)
    await FarmSandboxEnvironment.task_cleanup("self_check", config, cleanup=True)


@pytest.fixture
async def sandbox_env(shared_env):
    return shared_env
