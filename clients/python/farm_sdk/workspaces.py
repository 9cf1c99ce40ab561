"""`farm.workspaces` of both faces: named volumes of the caller's that outlive every sandbox,
mounted with `sandboxes.create(..., workspaces=[{"name", "path", "read_only"}])` and kept by
`sandbox.sync_workspaces()` (see `docs/sandbox-api.md`, "Workspaces")."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from . import _workspaces as workspaces_ops
from ._effects import arun, run
from ._http import AsyncHTTP, SyncHTTP

__all__ = ["Workspaces", "AsyncWorkspaces"]


class Workspaces:
    """`farm.workspaces`: named volumes of the caller's that outlive every sandbox, mounted
    with `sandboxes.create(..., workspaces=[{"name", "path", "read_only"}])`."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def create(self, name: str, size_mib: int, keep_days: Optional[int] = None) -> Dict[str, Any]:
        return run(self._http, workspaces_ops.create(name, size_mib, keep_days))

    def get(self, name: str) -> Dict[str, Any]:
        return run(self._http, workspaces_ops.get(name))

    def list(self) -> List[Dict[str, Any]]:
        return run(self._http, workspaces_ops.listing())

    def delete(self, name: str) -> None:
        run(self._http, workspaces_ops.delete(name))

    def fence(self, name: str) -> Dict[str, Any]:
        """Takes it from its writable holder: that holder's later syncs are refused."""
        return run(self._http, workspaces_ops.fence(name))


class AsyncWorkspaces:
    """`farm.workspaces`: named volumes of the caller's that outlive every sandbox, mounted
    with `sandboxes.create(..., workspaces=[{"name", "path", "read_only"}])`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    async def create(self, name: str, size_mib: int, keep_days: Optional[int] = None) -> Dict[str, Any]:
        return await arun(self._http, workspaces_ops.create(name, size_mib, keep_days))

    async def get(self, name: str) -> Dict[str, Any]:
        return await arun(self._http, workspaces_ops.get(name))

    async def list(self) -> List[Dict[str, Any]]:
        return await arun(self._http, workspaces_ops.listing())

    async def delete(self, name: str) -> None:
        await arun(self._http, workspaces_ops.delete(name))

    async def fence(self, name: str) -> Dict[str, Any]:
        """Takes it from its writable holder: that holder's later syncs are refused."""
        return await arun(self._http, workspaces_ops.fence(name))
