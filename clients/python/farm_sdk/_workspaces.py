"""Workspaces as calls and operations both faces run: named volumes of the caller's that
outlive every sandbox (see `docs/sandbox-api.md`, "Workspaces"). Each is the service's JSON
as it is (`name`, `id`, `size_mib`, `bytes`, `generation`, `holder`, `created_at_ms`,
`synced_at_ms`, `keep_days`)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ._calls import _given, _id
from ._core import Operation, _json
from ._http import Call


def create(name: str, size_mib: int, keep_days: Optional[int]) -> Operation[Dict[str, Any]]:
    body = _given(name=name, size_mib=int(size_mib), keep_days=keep_days)
    return (yield from _json(Call("POST", "/v1/workspaces", json=body)))


def get(name: str) -> Operation[Dict[str, Any]]:
    return (yield from _json(Call("GET", f"/v1/workspaces/{_id(name)}")))


def listing() -> Operation[List[Dict[str, Any]]]:
    return (yield from _json(Call("GET", "/v1/workspaces")))["workspaces"]


def delete(name: str) -> Operation[None]:
    yield Call("DELETE", f"/v1/workspaces/{_id(name)}")


def fence(name: str) -> Operation[Dict[str, Any]]:
    return (yield from _json(Call("POST", f"/v1/workspaces/{_id(name)}/fence", json={})))


def sync(sandbox_id: str) -> Operation[List[Dict[str, Any]]]:
    call = Call("POST", f"/v1/sandboxes/{_id(sandbox_id)}/workspaces/sync", json={}, resend=False)
    return (yield from _json(call))["workspaces"]
