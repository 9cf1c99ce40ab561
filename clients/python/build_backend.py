"""The SDK's own build backend (PEP 517, in the tree: `backend-path = ["."]`), so that
`pip install ./clients/python` needs nothing it does not have: no setuptools (a fresh venv
of Python 3.12 or later has none, and offline none can be fetched), and nothing is written
into the checkout (the wheel is made in the folder pip names).

It reads `pyproject.toml`'s `[project]` (with `tomllib`, or on Python < 3.11 with
`read_toml` below, which reads the forms that file uses) and packs `farm_sdk/` and its
metadata (PEP 621 to core metadata 2.1, entry points, console scripts) into a wheel; an
sdist is the same files in a tarball; an editable install (`pip install -e`) is a wheel whose
`.pth` names this folder.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "farm_sdk"
TAG = "py3-none-any"


def read_toml(text: str) -> Dict[str, Any]:
    """The TOML forms `pyproject.toml` uses: `[table]` headers (dotted, quoted parts), and
    `key = ` a string, an array of strings (over lines), or an inline table of strings."""
    data: Dict[str, Any] = {}
    table = data
    lines = iter(text.splitlines())
    for raw in lines:
        line = raw.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            table = data
            for part in re.findall(r'"([^"]*)"|([^.\[\]\s"]+)', line.strip("[]")):
                table = table.setdefault(part[0] or part[1], {})
            continue
        key, _, value = (s.strip() for s in line.partition("="))
        key = key.strip('"')
        while value.startswith("[") and not value.rstrip(",").endswith("]"):
            value += " " + next(lines).split(" #")[0].strip()
        table[key] = _value(value)
    return data


def _value(value: str) -> Any:
    if value.startswith("["):
        return re.findall(r'"((?:[^"\\]|\\.)*)"', value)
    if value.startswith("{"):
        return dict(re.findall(r'([\w-]+)\s*=\s*"([^"]*)"', value))
    if value.startswith('"'):
        return value[1:-1]
    return {"true": True, "false": False}.get(value, value)


def _project() -> Dict[str, Any]:
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        raw = f.read()
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        return read_toml(raw.decode("utf-8"))["project"]
    return tomllib.loads(raw.decode("utf-8"))["project"]


def _version() -> str:
    with open(os.path.join(HERE, PACKAGE, "_version.py")) as f:
        found = re.search(r'__version__\s*=\s*"([^"]+)"', f.read())
    if not found:
        raise RuntimeError(f"{PACKAGE}/_version.py names no __version__")
    return found.group(1)


def _metadata(project: Dict[str, Any]) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {_version()}",
        f"Summary: {project.get('description', '')}",
        f"Requires-Python: {project.get('requires-python', '')}",
    ]
    lines += [f"Classifier: {c}" for c in project.get("classifiers", [])]
    lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
    for extra, needs in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in needs]
    with open(os.path.join(HERE, project.get("readme", "README.md")), encoding="utf-8") as f:
        readme = f.read()
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + readme


def _entry_points(project: Dict[str, Any]) -> str:
    groups = dict(project.get("entry-points", {}))
    if project.get("scripts"):
        groups = {"console_scripts": project["scripts"], **groups}
    return "".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items()) + "\n"
        for group, points in groups.items()
    )


def _dist_info(project: Dict[str, Any]) -> Tuple[str, Dict[str, bytes]]:
    name = project["name"].replace("-", "_")
    folder = f"{name}-{_version()}.dist-info"
    files = {
        f"{folder}/METADATA": _metadata(project).encode("utf-8"),
        f"{folder}/WHEEL": f"Wheel-Version: 1.0\nGenerator: farm-sdk build_backend\nRoot-Is-Purelib: true\nTag: {TAG}\n".encode(),
        f"{folder}/entry_points.txt": _entry_points(project).encode("utf-8"),
        f"{folder}/top_level.txt": f"{PACKAGE}\n".encode(),
    }
    return folder, files


def _package_files() -> Dict[str, bytes]:
    files = {}
    folder = os.path.join(HERE, PACKAGE)
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py") or name == "py.typed":
            with open(os.path.join(folder, name), "rb") as f:
                files[f"{PACKAGE}/{name}"] = f.read()
    return files


def _wheel(wheel_directory: str, files: Dict[str, bytes]) -> str:
    project = _project()
    folder, meta = _dist_info(project)
    files = {**files, **meta}
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{folder}/RECORD,,")
    files[f"{folder}/RECORD"] = ("\n".join(record) + "\n").encode()
    name = f"{project['name'].replace('-', '_')}-{_version()}-{TAG}.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            wheel.writestr(info, data, zipfile.ZIP_DEFLATED)
    return name


# --- PEP 517 and PEP 660 hooks.


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    folder, files = _dist_info(_project())
    for path, data in files.items():
        target = os.path.join(metadata_directory, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(data)
    return folder


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    return _wheel(wheel_directory, _package_files())


def build_editable(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    return _wheel(wheel_directory, {f"_{PACKAGE}_editable.pth": (HERE + "\n").encode()})


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    project = _project()
    base = f"{project['name'].replace('-', '_')}-{_version()}"
    files = {name: open(os.path.join(HERE, name), "rb").read() for name in ("pyproject.toml", "README.md", "build_backend.py")}
    files.update(_package_files())
    files["PKG-INFO"] = _metadata(project).encode("utf-8")
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(f"{base}/{path}")
            info.size, info.mode, info.mtime = len(data), 0o644, 1577836800
            tar.addfile(info, io.BytesIO(data))
    return name
