"""A scripted stand-in for `farm serve`, on httpx.MockTransport: each route answers from a
list (the last answer repeats), and every request is kept for the test to check."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from typing import Any, AsyncIterator, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

import httpx

from farm_sdk import AsyncFarm, Farm

URL = "http://farm.test"

Answer = Union[httpx.Response, Exception, Callable[[httpx.Request], httpx.Response]]


def error(status: int, message: str, field: Optional[str] = None, retry_after: Optional[str] = None) -> httpx.Response:
    body: Dict[str, Any] = {"error": message}
    if field:
        body["field"] = field
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return httpx.Response(status, json=body, headers=headers)


def events(*items: Tuple[str, Any]) -> str:
    """A text/event-stream body of (event, data) pairs; data as JSON unless a str."""
    out = []
    for name, data in items:
        text = data if isinstance(data, str) else json.dumps(data)
        out.append(f"event: {name}\n" + "".join(f"data: {line}\n" for line in text.split("\n")) + "\n")
    return "".join(out)


def chunks(body: bytes, size: int) -> List[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)]


class _Chunks(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body sent in the given pieces, to a sync or an async client."""

    def __init__(self, pieces: Iterable[bytes]) -> None:
        self._pieces = list(pieces)

    def __iter__(self) -> Iterator[bytes]:
        yield from self._pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self._pieces:
            yield piece


def streamed(pieces: Iterable[bytes], content_type: str = "text/event-stream") -> httpx.Response:
    return httpx.Response(200, stream=_Chunks(pieces), headers={"Content-Type": content_type})


def tar_of(entries: Iterable[Tuple[tarfile.TarInfo, Optional[bytes]]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in entries:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return buffer.getvalue()


class MockFarm:
    def __init__(self) -> None:
        self.routes: Dict[Tuple[str, str], List[Answer]] = {}
        self.requests: List[httpx.Request] = []
        self.sleeps: List[float] = []

    def on(self, method: str, path: str, *answers: Answer) -> "MockFarm":
        self.routes[(method, path)] = list(answers)
        return self

    def handle(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        answers = self.routes.get((request.method, request.url.path))
        if not answers:
            return error(404, f"no route {request.method} {request.url.path}")
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise type(answer)(str(answer), request=request)
        if callable(answer):
            return answer(request)
        return answer

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def farm(self, **kwargs: Any) -> Farm:
        farm = Farm(URL, transport=self.transport(), **kwargs)
        farm._http.sleep = self.sleeps.append
        return farm

    def async_farm(self, **kwargs: Any) -> AsyncFarm:
        farm = AsyncFarm(URL, transport=self.transport(), **kwargs)

        async def sleep(seconds: float) -> None:
            self.sleeps.append(seconds)

        farm._http.sleep = sleep
        return farm

    def sent(self, method: str, path: str) -> List[httpx.Request]:
        return [r for r in self.requests if r.method == method and r.url.path == path]

    def paths(self) -> List[str]:
        return [f"{r.method} {r.url.path}" for r in self.requests]


def body(request: httpx.Request) -> Any:
    return json.loads(request.content)


ENV = {"id": "env-1", "state": "ready", "spec": {"image": "python:3.12-slim"}, "created_at_ms": 1, "log_lines": 2,
       "snapshot": "snap-1", "error": None, "sandboxes": 0}
SANDBOX = {"id": "sb-1", "environment": "env-1", "state": "running", "cpus": 1, "memory_mib": 512, "network": None,
           "workdir": "/", "user": "root", "created_at_ms": 1, "expires_at_ms": 2, "idle_timeout_secs": 600,
           "metadata": {}}
PROCESS = {"pid": 42, "command": "python3 -m http.server", "started_at_ms": 1, "state": "running", "exit_code": None,
           "signal": None, "pty": False, "stdout_bytes": 0, "stderr_bytes": 0, "stdin_open": True}
PORT = {"port": 8000, "url": "http://0123abcd.localhost:9000/", "token": "0123abcd", "address": "127.0.0.1:9000",
        "header": "Farm-Port-Token"}
ENTRY = {"name": "index.html", "type": "file", "size": 5, "mode": 0o644, "uid": 0, "gid": 0, "modified_at_ms": 1,
         "target": None}


def process(**changes: Any) -> Dict[str, Any]:
    """A process as the service describes it, with `changes`."""
    return dict(PROCESS, **changes)


def chunk(data: str, offset: int = 0, **changes: Any) -> Dict[str, Any]:
    """A chunk of output as the service answers it."""
    size = len(data.encode())
    return dict({"data": data, "offset": offset, "next": offset + size, "dropped": 0, "eof": False,
                 "state": "running", "exit_code": None, "signal": None}, **changes)


class FakeSocket:
    """A terminal's WebSocket for the tests: what the service says, in order (`EOFError` past
    the end, as a closed connection); what the client sent, kept. It answers the sync and the
    async client (`recv` and `send` awaited when `asynchronous`)."""

    def __init__(self, messages: Iterable[Union[str, bytes]], asynchronous: bool = False) -> None:
        self.messages = list(messages)
        self.sent: List[Union[str, bytes]] = []
        self.closed = False
        self.asynchronous = asynchronous
        self.url: Optional[str] = None
        self.headers: Dict[str, str] = {}

    def connect(self, url: str, additional_headers: Dict[str, str], open_timeout: float) -> Any:
        self.url, self.headers = url, dict(additional_headers)
        if not self.asynchronous:
            return self

        async def opened() -> "FakeSocket":
            return self

        return opened()

    def _next(self) -> Union[str, bytes]:
        if not self.messages:
            raise EOFError("closed")
        message = self.messages.pop(0)
        if isinstance(message, Exception):
            raise message
        return message

    def recv(self, timeout: Optional[float] = None) -> Any:
        if not self.asynchronous:
            return self._next()

        async def received() -> Union[str, bytes]:
            if self.messages and self.messages[0] is HANG:
                await asyncio.sleep(3600)
            return self._next()

        return received()

    def send(self, message: Union[str, bytes]) -> Any:
        self.sent.append(message)
        return _done() if self.asynchronous else None

    def close(self) -> Any:
        self.closed = True
        return _done() if self.asynchronous else None


#: Put in a `FakeSocket`'s messages: the async client waits there for ever.
HANG = TimeoutError("nothing comes")


async def _done() -> None:
    return None
