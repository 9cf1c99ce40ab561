"""Lifecycle events, webhooks and usage, as calls and operations both faces run: the caller's
events (listed after an id, or followed as they happen, resumable from the last id seen), a
sandbox's metrics, its resume with checks, and the tenant's webhooks.

An event is the service's JSON as it is (`id`, `at_ms`, `tenant`, `sandbox`, `kind`,
`type`, `state`, and `cause`, `reason`, `related`, `ends_at_ms` when they apply); see
`docs/sandbox-api.md`, "Events, usage and long tasks".
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional
from ._calls import _id
from ._core import Emit, Operation, _json, read_events
from ._http import Call
from ._sse import SSEParser
from .errors import FarmError

__all__ = ["EventFollow"]


def events_call(after: int, sandbox: Optional[str], limit: int) -> Call:
    params: Dict[str, Any] = {"after": int(after), "limit": int(limit)}
    if sandbox is not None:
        params["sandbox"] = sandbox
    return Call("GET", "/v1/events", params=params)


def follow_call(after: Optional[int], sandbox: Optional[str]) -> Call:
    params: Dict[str, Any] = {}
    if after is not None:
        params["after"] = int(after)
    if sandbox is not None:
        params["sandbox"] = sandbox
    return Call("GET", "/v1/events/stream", params=params or None, accept="text/event-stream")


def resume_call(sandbox_id: str, keep: Optional[Mapping[str, Any]]) -> Call:
    body: Dict[str, Any] = {} if keep is None else {"keep": dict(keep)}
    return Call("POST", f"/v1/sandboxes/{_id(sandbox_id)}/resume", json=body)


def metrics_call(sandbox_id: str) -> Call:
    return Call("GET", f"/v1/sandboxes/{_id(sandbox_id)}/metrics")


class EventFollow:
    """The events of `GET /v1/events/stream` as they come, each a dict; `last_id` is the id
    to follow again from after a break. The stream has no end of its own: an `error` event
    (the key was revoked) ends it with a `FarmError`."""

    def __init__(self, method: str, path: str, after: Optional[int] = None) -> None:
        self._parser = SSEParser()
        self._method, self._path = method, path
        self.last_id = after
        self._error: Optional[FarmError] = None

    @property
    def ended(self) -> bool:
        return self._error is not None

    def feed(self, text: str) -> List[Dict[str, Any]]:
        events: List[Dict[str, Any]] = []
        for event in self._parser.feed(text):
            if self.ended:
                break
            if event.event == "event":
                data = json.loads(event.data)
                self.last_id = data.get("id", self.last_id)
                events.append(data)
            elif event.event == "error":
                try:
                    message = json.loads(event.data).get("error", event.data)
                except ValueError:
                    message = event.data
                self._error = FarmError(None, f"the event stream ended: {message}", method=self._method, path=self._path)
        return events

    def finish(self) -> None:
        if self._error is not None:
            raise self._error


def list_events(after: int, sandbox: Optional[str], limit: int) -> Operation[Dict[str, Any]]:
    return (yield from _json(events_call(after, sandbox, limit)))


def follow_events(after: Optional[int], sandbox: Optional[str]) -> Operation[None]:
    """Emits each event as it comes, for as long as the caller reads."""
    call = follow_call(after, sandbox)
    return (yield from read_events(call, EventFollow(call.method, call.path, after), Emit))


def resume(sandbox_id: str, keep: Optional[Mapping[str, Any]]) -> Operation[Any]:
    return (yield from _json(resume_call(sandbox_id, keep)))


def metrics(sandbox_id: str) -> Operation[Dict[str, Any]]:
    return (yield from _json(metrics_call(sandbox_id)))


def add_webhook(url: str) -> Operation[Dict[str, Any]]:
    return (yield from _json(Call("POST", "/v1/webhooks", json={"url": url})))


def webhooks() -> Operation[List[Dict[str, Any]]]:
    return (yield from _json(Call("GET", "/v1/webhooks")))["webhooks"]


def delete_webhook(webhook_id: str) -> Operation[None]:
    yield Call("DELETE", f"/v1/webhooks/{_id(webhook_id)}")
