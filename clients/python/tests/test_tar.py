"""Packing local folders, and extracting downloaded archives without letting them out."""

import io
import os
import stat
import tarfile

import pytest

from farm_sdk import UnsafeArchive
from farm_sdk import _tar
from farm_sdk._tar import extract_tar, pack_dir
from mock_farm import tar_of

FILTERS = [False] + ([True] if hasattr(tarfile, "data_filter") else [])


@pytest.fixture(params=FILTERS, ids=lambda f: "data-filter" if f else "own-checks")
def data_filter(request, monkeypatch):
    """Runs a test with Python's data filter (where it exists) and with the SDK's own checks
    alone, as on a Python without it."""
    monkeypatch.setattr(_tar, "_HAS_DATA_FILTER", request.param)
    return request.param


def info(name, kind=tarfile.REGTYPE, linkname="", mode=0o644):
    entry = tarfile.TarInfo(name)
    entry.type, entry.linkname, entry.mode = kind, linkname, mode
    return entry


def extract(entries, dest):
    extract_tar(io.BytesIO(tar_of(entries)), str(dest))


def listing(root):
    out = []
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            out.append(os.path.relpath(os.path.join(folder, name), root))
    return sorted(out)


def test_pack_dir_for_a_context_is_deterministic_and_plain(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("x")
    (tmp_path / "a.txt").write_text("a")
    os.chmod(tmp_path / "a.txt", 0o600)
    first = pack_dir(str(tmp_path), for_context=True)
    os.utime(tmp_path / "a.txt", (1, 1))
    assert pack_dir(str(tmp_path), for_context=True) == first
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        assert [(m.name, m.type, m.mode, m.uid, m.uname) for m in tar] == [
            ("a.txt", tarfile.REGTYPE, 0o600, 0, ""),
            ("b", tarfile.DIRTYPE, tar.getmember("b").mode, 0, ""),
            ("b/x", tarfile.REGTYPE, tar.getmember("b/x").mode, 0, ""),
        ]


def test_pack_dir_keeps_links_for_folders_but_not_for_contexts(tmp_path):
    (tmp_path / "target").write_text("t")
    os.symlink("target", tmp_path / "link")
    with tarfile.open(fileobj=io.BytesIO(pack_dir(str(tmp_path), for_context=False))) as tar:
        link = tar.getmember("link")
        assert link.issym() and link.linkname == "target" and tar.getmember("target").mtime > 0
    with pytest.raises(ValueError, match="link"):
        pack_dir(str(tmp_path), for_context=True)
    os.unlink(tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ValueError, match="not a regular file"):
        pack_dir(str(tmp_path), for_context=False)
    with pytest.raises(NotADirectoryError):
        pack_dir(str(tmp_path / "target"), for_context=False)


def test_a_safe_archive_is_extracted(tmp_path, data_filter):
    dest = tmp_path / "dest"
    extract(
        [
            (info(".", tarfile.DIRTYPE, mode=0o755), None),
            (info("pkg", tarfile.DIRTYPE, mode=0o755), None),
            (info("pkg/mod.py"), b"x = 1\n"),
            (info("pkg/run", mode=0o4777), b"#!/bin/sh\n"),
            (info("alias.py", tarfile.SYMTYPE, linkname="pkg/mod.py"), None),
            (info("pkg/up", tarfile.SYMTYPE, linkname="../alias.py"), None),
            (info("hard.py", tarfile.LNKTYPE, linkname="pkg/mod.py"), None),
        ],
        dest,
    )
    assert listing(dest) == ["alias.py", "hard.py", "pkg", "pkg/mod.py", "pkg/run", "pkg/up"]
    assert (dest / "alias.py").read_text() == "x = 1\n" and (dest / "pkg" / "up").read_text() == "x = 1\n"
    assert (dest / "hard.py").read_text() == "x = 1\n"
    mode = stat.S_IMODE(os.stat(dest / "pkg" / "run").st_mode)
    assert mode & (stat.S_ISUID | stat.S_IWGRP | stat.S_IWOTH) == 0 and mode & stat.S_IXUSR


@pytest.mark.parametrize(
    "entries, why",
    [
        ([(info("../x"), b"out")], "'..'"),
        ([(info("a/../../x"), b"out")], "'..'"),
        ([(info("/tmp/abs-x"), b"out")], "absolute path"),
        ([(info("l", tarfile.SYMTYPE, linkname="/etc/passwd"), None)], "absolute path"),
        ([(info("l", tarfile.SYMTYPE, linkname="../outside"), None)], "outside"),
        ([(info("d/l", tarfile.SYMTYPE, linkname="../../outside"), None)], "outside"),
        ([(info("h", tarfile.LNKTYPE, linkname="../outside"), None)], "outside"),
        ([(info("dev", tarfile.CHRTYPE), None)], "device"),
        ([(info("blk", tarfile.BLKTYPE), None)], "device"),
        ([(info("fifo", tarfile.FIFOTYPE), None)], "device"),
    ],
)
def test_an_unsafe_archive_is_refused_before_anything_is_extracted(tmp_path, data_filter, entries, why):
    dest = tmp_path / "dest"
    with pytest.raises(UnsafeArchive, match=why):
        extract([(info("first.txt"), b"1")] + entries, dest)
    assert listing(dest) == []
    assert listing(tmp_path) == ["dest"]


def test_a_path_through_an_extracted_link_cannot_leave(tmp_path, data_filter):
    # Each name is harmless alone: "a/b" points to "." seen from "a"... which is the root,
    # and "a/b/c" then points to ".." from the root.
    dest = tmp_path / "dest"
    with pytest.raises(UnsafeArchive):
        extract(
            [
                (info("a", tarfile.DIRTYPE, mode=0o755), None),
                (info("a/b", tarfile.SYMTYPE, linkname=".."), None),
                (info("a/b/c", tarfile.SYMTYPE, linkname=".."), None),
                (info("a/b/c/escaped", tarfile.REGTYPE), b"out"),
            ],
            dest,
        )
    assert listing(tmp_path) == ["dest", "dest/a", "dest/a/b"]


def test_a_file_is_never_written_through_an_existing_link(tmp_path, data_filter):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(str(outside), dest / "f")  # left there before, pointing out
    extract([(info("f"), b"new")], dest)
    assert outside.read_text() == "keep"
    assert not os.path.islink(dest / "f") and (dest / "f").read_text() == "new"
