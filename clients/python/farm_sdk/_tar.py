"""Tar archives of local folders (to upload), and safe extraction of downloaded ones.

A downloaded archive comes from a sandbox, so it is not trusted: `extract_tar` refuses an
absolute path, a `..`, a link pointing outside the destination (checked against what is
already on disk, so a path through an earlier link cannot leave it either), a device or
fifo, and drops owners and set-id bits. Where Python's tarfile has the `data` filter
(3.12, and 3.8.17/3.9.17/3.10.12/3.11.4 on), it is applied as well.
"""

from __future__ import annotations

import copy
import io
import os
import posixpath
import stat
import tarfile
from typing import IO, List

from .errors import UnsafeArchive

__all__ = ["pack_dir", "extract_tar"]

_HAS_DATA_FILTER = hasattr(tarfile, "data_filter")


def pack_dir(root: str, *, for_context: bool) -> bytes:
    """A tar archive of the folder `root`'s content, names relative to it, in sorted order.

    For a build context (`for_context`) it holds regular files and folders only (the service
    refuses anything else, so a link is an error here, named) and no times, so the same
    content gives the same archive. Otherwise symbolic links are kept as links and
    modification times are kept. Either way owners are not kept, and a fifo, socket or
    device is an error.
    """
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        raise NotADirectoryError(f"{root} is not a folder")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(dirs + files):
                path = os.path.join(folder, name)
                info = tarfile.TarInfo(os.path.relpath(path, root).replace(os.sep, "/"))
                st = os.lstat(path)
                info.mode = stat.S_IMODE(st.st_mode)
                info.mtime = 0 if for_context else int(st.st_mtime)
                if stat.S_ISDIR(st.st_mode):
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif stat.S_ISREG(st.st_mode):
                    info.size = st.st_size
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                elif stat.S_ISLNK(st.st_mode) and not for_context:
                    info.type = tarfile.SYMTYPE
                    info.linkname = os.readlink(path)
                    tar.addfile(info)
                elif stat.S_ISLNK(st.st_mode):
                    raise ValueError(f"{path} is a link: a build context holds regular files and folders only")
                else:
                    raise ValueError(f"{path} is not a regular file, folder or link")
    return buffer.getvalue()


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _escapes(name: str) -> bool:
    """Whether a relative archive name, made normal, climbs out of the archive's root."""
    normal = posixpath.normpath(name)
    return normal == ".." or normal.startswith("../")


def _check_names(member: tarfile.TarInfo) -> None:
    """What can be refused from the entry alone, before anything is extracted."""
    name = member.name
    if name.startswith("/") or os.path.isabs(name):
        raise UnsafeArchive(f"archive entry {name!r}: an absolute path")
    if ".." in name.replace("\\", "/").split("/"):
        raise UnsafeArchive(f"archive entry {name!r}: a '..' in its path")
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise UnsafeArchive(f"archive entry {name!r}: a device, fifo or other special file")
    if member.issym() or member.islnk():
        target = member.linkname
        if target.startswith("/") or os.path.isabs(target):
            raise UnsafeArchive(f"archive entry {name!r}: a link to the absolute path {target!r}")
        base = posixpath.dirname(name) if member.issym() else ""
        if _escapes(posixpath.join(base, target)):
            raise UnsafeArchive(f"archive entry {name!r}: a link to {target!r}, outside the folder")


def _check_on_disk(member: tarfile.TarInfo, root: str) -> str:
    """Checks `member` against what is extracted so far; its destination path."""
    name = member.name
    parent = os.path.realpath(os.path.join(root, os.path.dirname(name)))
    if not _within(parent, root):
        raise UnsafeArchive(f"archive entry {name!r}: its folder is a link leading outside")
    dest = os.path.join(parent, os.path.basename(name)) if os.path.basename(name) not in ("", ".") else parent
    if member.issym():
        target = os.path.realpath(os.path.join(parent, member.linkname))
    elif member.islnk():
        target = os.path.realpath(os.path.join(root, member.linkname))
    else:
        target = dest
    if not _within(target, root):
        raise UnsafeArchive(f"archive entry {name!r}: a link to {member.linkname!r}, outside the folder")
    return dest


def _tame(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """A copy owned by this process, without set-id bits or write access for others."""
    tame = copy.copy(member)
    tame.uid, tame.gid, tame.uname, tame.gname = os.getuid(), os.getgid(), "", ""
    if member.isreg():
        tame.mode = (member.mode & 0o755) | 0o600
    elif member.isdir():
        tame.mode = (member.mode & 0o755) | 0o700
    return tame


def extract_tar(archive: IO[bytes], dest: str) -> None:
    """Extracts the tar archive `archive` (seekable) into the folder `dest` (made if needed).
    Raises `UnsafeArchive` on the first entry that is not safe; every entry is checked by
    name before any is extracted."""
    os.makedirs(dest, exist_ok=True)
    root = os.path.realpath(dest)
    with tarfile.open(fileobj=archive, mode="r:*") as tar:
        members: List[tarfile.TarInfo] = tar.getmembers()
        for member in members:
            _check_names(member)
        for member in members:
            path = _check_on_disk(member, root)
            if os.path.islink(path):
                os.unlink(path)  # replaced, never written through
            tame = _tame(member)
            try:
                if _HAS_DATA_FILTER:
                    tar.extract(tame, root, numeric_owner=True, filter="data")
                else:
                    tar.extract(tame, root, numeric_owner=True)
            except tarfile.TarError as e:
                raise UnsafeArchive(f"archive entry {member.name!r}: {e}") from e
