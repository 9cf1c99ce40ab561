"""Sandboxes a framework's object made, removed when the object is collected or the
interpreter exits, whoever forgot to call its `cleanup()` or `stop()`: the frameworks'
own runners (mini-swe-agent's `mini`, `mini-extra swebench`) never call them, and their
Docker environments release what they hold the same way.

`weakref.finalize` holds what the removal needs (never the object itself) and runs at
collection or at exit, once; an explicit cleanup detaches it first. A removal at exit may
find the service gone: it never raises.
"""

from __future__ import annotations

import weakref
from typing import Optional

from .client import Farm, Sandbox


def _kill_quietly(sandbox: Sandbox, close: bool) -> None:
    try:
        sandbox.kill()
    except BaseException:  # at exit the service, or the interpreter, may be going
        pass
    finally:
        if close:
            try:
                sandbox.farm.close()
            except BaseException:
                pass


def _kill_by_id(url: str, token: Optional[str], sandbox_id: str) -> None:
    try:
        with Farm(url=url, token=token, timeout=30.0, retries=0) as farm:
            Sandbox(farm, sandbox_id).kill()
    except BaseException:
        pass


def release_with(owner: object, sandbox: Sandbox, *, close: bool) -> weakref.finalize:
    """Removes `sandbox` (and closes its client when `close`) when `owner` is collected or
    at exit, unless the returned finalizer is detached first."""
    return weakref.finalize(owner, _kill_quietly, sandbox, close)


def release_by_id(owner: object, url: str, token: Optional[str], sandbox_id: str) -> weakref.finalize:
    """Removes sandbox `sandbox_id` with a client of its own (an async client cannot run in
    a finalizer) when `owner` is collected or at exit, unless detached first."""
    return weakref.finalize(owner, _kill_by_id, url, token, sandbox_id)
