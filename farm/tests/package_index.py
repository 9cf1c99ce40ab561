#!/usr/bin/env python3
"""Writes a package index for the network tests: `farmtestpkg` 1.0 (a wheel written here, no
third-party code) under ROOT/simple and ROOT/packages; with --with-pip, also the host Python's
own bundled pip wheel as ROOT/packages/pip.whl.

    package_index.py ROOT [--with-pip]
"""
import base64
import ensurepip
import glob
import hashlib
import os
import shutil
import sys
import zipfile

root = sys.argv[1]
os.makedirs(root + "/simple/farmtestpkg", exist_ok=True)
os.makedirs(root + "/packages", exist_ok=True)
name = "farmtestpkg-1.0-py3-none-any.whl"
files = {
    "farmtestpkg/__init__.py": b"VALUE = 42\n\n\ndef double(x):\n    return 2 * x\n",
    "farmtestpkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: farmtestpkg\nVersion: 1.0\n",
    "farmtestpkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: farm-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = ""
for path, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record += f"{path},sha256={digest},{len(data)}\n"
record += "farmtestpkg-1.0.dist-info/RECORD,,\n"
with zipfile.ZipFile(root + "/packages/" + name, "w") as z:
    for path, data in files.items():
        z.writestr(path, data)
    z.writestr("farmtestpkg-1.0.dist-info/RECORD", record)
open(root + "/simple/farmtestpkg/index.html", "w").write(f'<a href="../../packages/{name}">{name}</a>\n')
if "--with-pip" in sys.argv[2:]:
    bundled = sorted(glob.glob(os.path.join(os.path.dirname(ensurepip.__file__), "_bundled", "pip-*.whl")))[-1]
    shutil.copy(bundled, root + "/packages/pip.whl")
