"""The SDK's own build backend (build_backend.py): what `pip install ./clients/python` uses.
Its TOML reader (for Python < 3.11) reads pyproject.toml as tomllib does; its wheel carries
the package, the metadata and the entry points (inspect_ai's and NeMo Gym's providers,
`farm-docker`); and pip installs the folder into a fresh venv offline, leaving the checkout
as it was."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import build_backend  # noqa: E402


def test_the_fallback_toml_reader_reads_pyproject_as_tomllib_does():
    tomllib = pytest.importorskip("tomllib")
    text = (ROOT / "pyproject.toml").read_text()
    assert build_backend.read_toml(text)["project"] == tomllib.loads(text)["project"]


def test_the_wheel_has_the_package_its_metadata_and_its_entry_points(tmp_path):
    name = build_backend.build_wheel(str(tmp_path))
    with zipfile.ZipFile(tmp_path / name) as wheel:
        names = set(wheel.namelist())
        info = name.split("-py3")[0] + ".dist-info"
        metadata = wheel.read(f"{info}/METADATA").decode()
        points = wheel.read(f"{info}/entry_points.txt").decode()
        record = wheel.read(f"{info}/RECORD").decode()
    assert {"farm_sdk/__init__.py", "farm_sdk/inspectai.py", "farm_sdk/py.typed"} <= names
    assert "Name: farm-sdk" in metadata and "Requires-Dist: httpx>=0.24" in metadata
    assert 'Requires-Dist: websockets>=13; extra == "pty"' in metadata
    assert "[console_scripts]\nfarm-docker = farm_sdk.docker_cli:main" in points
    assert "[inspect_ai]\nfarm_sdk = farm_sdk.inspectai" in points
    assert "[nemo_gym.sandbox_providers]\nfarm = farm_sdk.nemogym:FarmProvider" in points
    assert all(line.split(",")[0] in names for line in record.splitlines())


def test_pip_installs_the_folder_offline_into_a_fresh_venv_and_leaves_it_clean(tmp_path):
    before = sorted(p.relative_to(ROOT) for p in ROOT.rglob("*") if "cache" not in str(p))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", str(ROOT)],
        capture_output=True, text=True,
    )
    assert installed.returncode == 0, installed.stderr
    found = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('farm-sdk'))"],
        capture_output=True, text=True, check=True,
    )
    assert found.stdout.strip() == build_backend._version()
    assert os.access(venv / "bin" / "farm-docker", os.X_OK)
    after = sorted(p.relative_to(ROOT) for p in ROOT.rglob("*") if "cache" not in str(p))
    assert after == before, "the build wrote into the checkout"
