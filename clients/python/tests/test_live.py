"""Against a real `farm serve` with the sandbox API: skipped unless FARM_TEST_URL names one and
FARM_TEST_ENV a ready environment of it (FARM_SERVE_TOKEN is sent when set).

    FARM_TEST_URL=http://127.0.0.1:8765 FARM_TEST_ENV=env-... python3 -m pytest clients/python/tests/test_live.py

The service's own integration test (farm/tests) is the thorough one; these check the SDK end
to end on a few verbs.
"""

import asyncio
import os

import pytest

from farm_sdk import AsyncFarm, Farm, NotFound, Sandbox

URL = os.environ.get("FARM_TEST_URL")
ENV = os.environ.get("FARM_TEST_ENV")

pytestmark = pytest.mark.skipif(not (URL and ENV), reason="FARM_TEST_URL and FARM_TEST_ENV name no live service")


@pytest.fixture
def farm():
    with Farm(URL) as farm:
        yield farm


def test_create_exec_and_kill(farm):
    env = farm.environments.get(ENV)
    assert env.ready
    with farm.sandboxes.create(env, env={"GREETING": "hi"}) as sb:
        assert sb.info().environment == env.id
        result = sb.exec("echo $GREETING; echo oops >&2; exit 3")
        assert (result.exit_code, result.stdout, result.stderr) == (3, "hi\n", "oops\n")
        assert sb.exec(["printf", "%s", "a b"]).stdout == "a b"
        assert sb.exec("cat", stdin="piped").stdout == "piped"
        late = sb.exec("sleep 30", timeout=1)
        assert late.timed_out and not late.ok
        out = []
        streamed = sb.exec_stream("for i in 1 2 3; do echo $i; done", on_stdout=out.append)
        assert streamed.ok and "".join(out) == "1\n2\n3\n" == streamed.stdout
    with pytest.raises(NotFound):
        farm.sandboxes.get(sb.id)
    sb.kill()  # gone already: no error


def test_files_round_trip(farm, tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("x = 1\n")
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    os.chmod(src / "run.sh", 0o755)
    with Sandbox.create(ENV, farm=farm) as sb:
        sb.files.write("/tmp/farm-sdk/a.bin", bytes(range(256)))
        assert sb.files.read("/tmp/farm-sdk/a.bin") == bytes(range(256))
        with pytest.raises(NotFound):
            sb.files.read("/tmp/farm-sdk/missing")
        sb.files.upload_dir(str(src), "/tmp/farm-sdk/src")
        assert sb.exec("/tmp/farm-sdk/src/run.sh").stdout == "ran\n"
        sb.files.download_dir("/tmp/farm-sdk/src", str(tmp_path / "back"))
        assert (tmp_path / "back" / "pkg" / "mod.py").read_text() == "x = 1\n"
        sb.files.download_file("/tmp/farm-sdk/a.bin", str(tmp_path / "a.bin"))
        assert (tmp_path / "a.bin").read_bytes() == bytes(range(256))


def test_branches_go_on_apart(farm):
    with farm.sandboxes.create(ENV) as sb:
        sb.exec("echo base > /tmp/state")
        with sb.branch() as other:
            assert other.id != sb.id
            other.exec("echo branch > /tmp/state")
            assert sb.exec("cat /tmp/state").stdout == "base\n"
            assert other.exec("cat /tmp/state").stdout == "branch\n"


def test_the_async_client():
    async def main():
        async with AsyncFarm(URL) as farm:
            async with farm.sandboxes.create(ENV) as sb:
                assert (await sb.exec("echo async")).stdout == "async\n"
                await sb.files.write("/tmp/x", "y")
                assert await sb.files.read("/tmp/x") == b"y"

    asyncio.run(main())
