"""A training loop's side of `farm serve`: rollouts, results, capacity and sessions.

`Service` talks to one service; `Fleet` makes several (one per node) one pool.

    fleet = Fleet(["http://node1:8765", "http://node2:8765"], token)
    groups = fleet.submit(items, key="step-1200")   # each group to the endpoint with most room
    rows = fleet.results(wait=10)                   # from every endpoint, a cursor each
    s = fleet.open_session("double")                # on the endpoint with most session room
    b = s.branch()                                  # a branch stays on its session's endpoint

Submits carry an `Idempotency-Key`, so a retried submit (by the SDK, or by you with the same
key) gets the same rollouts, never twice as many. Results are read with a cursor and a long
poll, so a reconnect loses nothing.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import httpx

from ._http import Call, Params, SyncClient, new_key
from .errors import Busy, ConnectionFailed, ServerError

if TYPE_CHECKING:
    import pyarrow

__all__ = ["Service", "Fleet", "Session", "Down", "lost_in_restart", "ARROW_STREAM"]

ARROW_STREAM = "application/vnd.apache.arrow.stream"
#: Seconds a fleet waits for an endpoint's `/v1/capacity`: a refused connection is seen at
#: once; this is for a service that hangs, with room for one merely slow on a loaded machine.
CAPACITY_TIMEOUT = 60.0
# Methods whose request may be sent again after it may have reached the service.
_RESENDABLE = ("GET", "HEAD", "PUT", "DELETE")


class Down(ConnectionFailed):
    """No endpoint (of those asked) can be reached now: restarting, or its node is gone."""

    def __init__(self, message: str) -> None:
        super().__init__(message, sent=False)


def lost_in_restart(row: Mapping[str, Any]) -> bool:
    """Whether a row is a rollout its endpoint lost when it restarted: submit it again to get a
    verdict."""
    return row.get("status") == "env_error" and "lost in restart" in (row.get("error") or "")


class Service(SyncClient):
    """One `farm serve` service's rollouts API (see docs/serve.md, API).

    `url` defaults to `$FARM_URL`, else `http://127.0.0.1:8765`; `token` to
    `$FARM_SERVE_TOKEN`. `timeout`, `retries` and `transport` are as `Farm`'s.
    """

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Optional[Params] = None,
        accept: Optional[str] = None,
        key: Optional[str] = None,
        resend: Optional[bool] = None,
        wait: float = 0.0,
        timeout: Optional[float] = None,
        retries: Optional[int] = None,
    ) -> httpx.Response:
        """Any request, with the SDK's errors and retries. After a broken connection, a POST
        is sent again only when it carries an idempotency `key` or `resend` says it may be (a
        429 or 503, or a failure to connect, is retried for every request). `wait` is how
        long the service may hold the answer on purpose."""
        method = method.upper()
        if resend is None:
            resend = key is not None or method in _RESENDABLE
        call = Call(
            method,
            path,
            params=params,
            json=body,
            accept=accept,
            idempotency_key=key,
            resend=resend,
            wait=wait,
        )
        return self._http.send(call, timeout=timeout, retries=retries)

    def submit(self, items: Sequence[Mapping[str, Any]], key: Optional[str] = None) -> Dict[str, Any]:
        """Submits groups of rollouts: `{"groups": [{"group_id", "task_id", "suite",
        "rollout_ids"}]}`. A retry with the same `key` gets the same rollouts (one is made
        when none is given, the same on every retry of this call)."""
        body = {"items": [dict(item) for item in items]}
        return self.call("POST", "/v1/rollouts", body, key=key or new_key()).json()

    def results(
        self, cursor: int = 0, wait: float = 30.0, max_rows: int = 100, *, retries: Optional[int] = None
    ) -> Tuple[List[Dict[str, Any]], int]:
        """Rows from `cursor` on (waiting up to `wait` seconds for a first one) and the cursor
        to ask for next: keep it to resume, even after a restart of either side."""
        response = self.call(
            "GET", "/v1/results", params={"cursor": cursor, "max": max_rows, "wait": wait}, wait=wait, retries=retries
        )
        rows = [json.loads(line) for line in response.text.splitlines() if line.strip()]
        return rows, int(response.headers.get("farm-next-cursor", cursor + len(rows)))

    def results_arrow(self, cursor: int = 0, max_rows: int = 1000) -> "pyarrow.Table":
        """Rows from `cursor` on as a `pyarrow.Table` with the Parquet schema. Raises
        ImportError when pyarrow is not installed."""
        import pyarrow.ipc

        response = self.call("GET", "/v1/results", params={"cursor": cursor, "max": max_rows}, accept=ARROW_STREAM)
        return pyarrow.ipc.open_stream(response.content).read_all()

    def capacity(self, *, timeout: Optional[float] = None, retries: Optional[int] = None) -> Dict[str, Any]:
        """`{"slots", "in_flight", "queued", "warm", "queue_limit", "sessions", "max_sessions",
        "memory": {...}}`."""
        return self.call("GET", "/v1/capacity", timeout=timeout, retries=retries).json()

    def rollout(self, rollout_id: str) -> Dict[str, Any]:
        """A rollout's state, cursor and row (once it has one)."""
        return self.call("GET", f"/v1/rollouts/{rollout_id}").json()

    def cancel(self, rollout_id: str) -> bool:
        """Cancels a queued or running rollout (it gets an `env_error` row); whether it was."""
        return bool(self.call("POST", f"/v1/rollouts/{rollout_id}/cancel").json().get("cancelled"))

    def cancel_below(self, policy_version: int) -> int:
        """Cancels queued and running rollouts of a lower `policy_version`; how many."""
        answer = self.call("POST", "/v1/cancel", {"policy_version_below": policy_version}).json()
        return int(answer.get("cancelled", 0))

    def open_session(self, task_id: Optional[str] = None, **fields: Any) -> "Session":
        """A live session of a task (`task_id`, or an inline `task=` row), stepped by you."""
        body = dict(fields) if task_id is None else dict(fields, task_id=task_id)
        opened = self.call("POST", "/v1/sessions", body).json()
        return Session(self, opened["session_id"], opened)

    def session(self, session_id: str) -> "Session":
        """The session `session_id` of this service (not asked for: no request is made)."""
        return Session(self, session_id, {})

    def sessions(self) -> List[Dict[str, Any]]:
        """Every live and paused session, as `GET /v1/sessions/{id}` shows it."""
        return list(self.call("GET", "/v1/sessions").json().get("sessions", []))


class Session:
    """A live session on one service. `handle` (`{"endpoint", "session_id"}`) can be stored
    and turned back into a Session with `Fleet.session`."""

    def __init__(self, service: Service, session_id: str, opened: Dict[str, Any]) -> None:
        self.service = service
        self.id = session_id
        #: The answer that opened it (empty for a session named by a handle).
        self.opened = opened

    @property
    def endpoint(self) -> str:
        return self.service.url

    @property
    def handle(self) -> Dict[str, str]:
        return {"endpoint": self.endpoint, "session_id": self.id}

    def __repr__(self) -> str:
        return f"Session({self.id!r} on {self.endpoint})"

    def _post(self, what: str, body: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        return self.service.call("POST", f"/v1/sessions/{self.id}/{what}", dict(body or {})).json()

    def exec(self, command: str, **fields: Any) -> Dict[str, Any]:
        """`{"step": {...}, "observation": "...", "ended": false}`."""
        return self._post("exec", dict(fields, command=command))

    def write_file(self, path: str, content: str, **fields: Any) -> Dict[str, Any]:
        return self._post("write_file", dict(fields, path=path, content=content))

    def branch(self) -> "Session":
        """A branch, on the same service (it forks this session's VM there)."""
        branched = self._post("branch")
        return Session(self.service, branched["session_id"], branched)

    def submit(self, answer: Optional[str] = None) -> Dict[str, Any]:
        """Ends the session and scores it: `{"rollout_id", "status", "reward", ...}`."""
        return self._post("submit", {} if answer is None else {"answer": answer})

    def pause(self) -> Dict[str, Any]:
        """Saves it to disk and stops its VM (pausing a paused session answers the same)."""
        return self.service.call("POST", f"/v1/sessions/{self.id}/pause", {}, resend=True).json()

    def resume(self) -> Dict[str, Any]:
        """Runs it again as it was paused (resuming a live session answers the same)."""
        return self.service.call("POST", f"/v1/sessions/{self.id}/resume", {}, resend=True).json()

    def info(self) -> Dict[str, Any]:
        return self.service.call("GET", f"/v1/sessions/{self.id}").json()

    def close(self) -> None:
        """Ends the session without a row."""
        self.service.call("DELETE", f"/v1/sessions/{self.id}")


class Fleet:
    """Several `farm serve` endpoints as one pool.

    - `submit` spreads groups (a group never splits) by each endpoint's free capacity from
      `/v1/capacity`; an endpoint that does not answer gets nothing.
    - `results` pulls from every endpoint with a cursor of its own (`self.cursors`: keep it
      to resume after the trainer restarts). An endpoint that is down keeps its cursor, and
      its rows are pulled once it is back: a service restarted on its output folder serves
      every row again from the same cursors, and records what it lost as `env_error` rows
      "lost in restart" (see `lost_in_restart`).
    - Sessions stay where they were opened: a `Session` (and its `handle`) names its endpoint.

    Probes of capacity and pulls of results are not retried (an endpoint that does not answer
    is skipped, and asked again next time); submits and session calls are, as `Service`'s.
    """

    def __init__(
        self,
        urls: Iterable[str],
        token: Optional[str] = None,
        *,
        timeout: float = 600.0,
        retries: int = 3,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self.members: Dict[str, Service] = {}
        for url in urls:
            service = Service(url, token, timeout, retries, transport=transport)
            self.members[service.url] = service
        if not self.members:
            raise ValueError("a fleet needs at least one endpoint")
        self.cursors: Dict[str, int] = {url: 0 for url in self.members}
        self._plans: Dict[str, Dict[str, List[int]]] = {}

    def close(self) -> None:
        for service in self.members.values():
            service.close()

    def capacities(self) -> Dict[str, Optional[Dict[str, Any]]]:
        """`{url: capacity, or None when it does not answer}`."""
        out: Dict[str, Optional[Dict[str, Any]]] = {}
        for url, service in self.members.items():
            try:
                out[url] = service.capacity(timeout=CAPACITY_TIMEOUT, retries=0)
            except (ConnectionFailed, Busy, ServerError):
                out[url] = None
        return out

    def submit(self, items: Sequence[Mapping[str, Any]], key: str) -> List[Dict[str, Any]]:
        """Submits each item (a group of n samples) to one endpoint, most free capacity first.
        Returns the groups as `/v1/rollouts` answers them, each with its `endpoint`. A retry
        with the same key reuses the first call's placement, so every endpoint sees its own
        idempotency key again and nothing runs twice."""
        plan = self._plans.get(key)
        if plan is None:
            free: Dict[str, int] = {}
            for url, cap in self.capacities().items():
                if cap is not None:
                    free[url] = cap["slots"] + cap["queue_limit"] - cap["in_flight"] - cap["queued"]
            if not free:
                raise Down("no endpoint of the fleet answers")
            plan = {}
            for i, item in enumerate(items):
                url = max(free, key=lambda u: free[u])  # ties: the first listed
                free[url] -= int(item.get("n", 1))
                plan.setdefault(url, []).append(i)
            self._plans[key] = plan
        groups: List[Dict[str, Any]] = []
        for url, indices in plan.items():
            answer = self.members[url].submit([items[i] for i in indices], key=f"{key}@{url}")
            groups.extend(dict(g, endpoint=url) for g in answer["groups"])
        return groups

    def results(self, wait: float = 10.0, max_rows: int = 100) -> List[Dict[str, Any]]:
        """New rows from every endpoint that answers, each with its `endpoint`. Waits up to
        `wait` seconds in all when there is nothing new."""
        rows: List[Dict[str, Any]] = []
        per = max(0.0, wait / len(self.members))
        for url, service in self.members.items():
            try:
                got, next_cursor = service.results(
                    self.cursors[url], wait=0.0 if rows else per, max_rows=max_rows, retries=0
                )
            except (ConnectionFailed, Busy, ServerError):
                continue  # down, or starting: asked again next time
            self.cursors[url] = next_cursor
            rows.extend(dict(r, endpoint=url) for r in got)
        return rows

    def open_session(self, task_id: str, **fields: Any) -> Session:
        """A live session on the endpoint with the most free session room."""
        room: Dict[str, int] = {}
        for url, cap in self.capacities().items():
            if cap is not None:
                room[url] = cap["max_sessions"] - cap["sessions"]
        if not room:
            raise Down("no endpoint of the fleet answers")
        url = max(room, key=lambda u: room[u])
        return self.members[url].open_session(task_id, **fields)

    def session(self, handle: Mapping[str, str]) -> Session:
        """The session a `Session.handle` names."""
        url = handle["endpoint"].rstrip("/")
        if url not in self.members:
            raise ValueError(f"{url} is not an endpoint of this fleet")
        return self.members[url].session(handle["session_id"])
