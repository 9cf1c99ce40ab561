"""What a sandbox hosts, as the service describes it: its background processes
(`ProcessInfo`), their output (`OutputChunk`) and its open ports (`Port`).

Like the other models, each keeps the whole answer in `raw` and ignores fields it does not
know.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

import httpx

from .models import _int, _object, _str

__all__ = ["ProcessInfo", "OutputChunk", "Port", "PORT_TOKEN_HEADER"]

#: The header a request through the port listener names its port's token in.
PORT_TOKEN_HEADER = "Farm-Port-Token"


@dataclass
class ProcessInfo:
    """A background process of a sandbox.

    `state` is `running` or `exited`; once exited, `exit_code` is its code, or None with
    `signal` the number of the signal that ended it. `stdout_bytes` and `stderr_bytes` are
    what it wrote so far (the offset of its next byte); a process on a terminal (`pty`) has
    one stream, `stdout`.
    """

    pid: int
    command: str = ""
    state: str = ""
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    pty: bool = False
    started_at_ms: Optional[int] = None
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    stdin_open: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def exited(self) -> bool:
        return self.state == "exited"

    @classmethod
    def from_json(cls, data: Any) -> "ProcessInfo":
        d = _object(data, "a process")
        return cls(
            pid=_int(d.get("pid")) or 0,
            command=str(d.get("command") or ""),
            state=str(d.get("state") or ""),
            exit_code=_int(d.get("exit_code")),
            signal=_int(d.get("signal")),
            pty=bool(d.get("pty")),
            started_at_ms=_int(d.get("started_at_ms")),
            stdout_bytes=_int(d.get("stdout_bytes")) or 0,
            stderr_bytes=_int(d.get("stderr_bytes")) or 0,
            stdin_open=bool(d.get("stdin_open")),
            raw=dict(d),
        )


@dataclass
class OutputChunk:
    """A piece of one output stream of a process: `data` (text, whole characters) from byte
    `offset` to `next`, the offset to read from next. `dropped` bytes between the offset asked
    for and `offset` fell out of the process's ring before they were read. `eof`: the stream
    ended and all of it was read. `state`, `exit_code` and `signal` are the process's when
    the chunk was read.

    `stream` (`stdout` or `stderr`) is the SDK's own: which stream the chunk is of.
    """

    data: str
    offset: int = 0
    next: int = 0
    dropped: int = 0
    eof: bool = False
    state: str = ""
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    stream: str = "stdout"
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any, stream: str = "stdout") -> "OutputChunk":
        d = _object(data, "a chunk of output")
        return cls(
            data=str(d.get("data") or ""),
            offset=_int(d.get("offset")) or 0,
            next=_int(d.get("next")) or 0,
            dropped=_int(d.get("dropped")) or 0,
            eof=bool(d.get("eof")),
            state=str(d.get("state") or ""),
            exit_code=_int(d.get("exit_code")),
            signal=_int(d.get("signal")),
            stream=stream,
            raw=dict(d),
        )


@dataclass
class Port:
    """An open port of a sandbox: its service on the guest's `127.0.0.1:port`, reached
    through the service's port listener with the port's `token`.

    `url` names the token in its host (`http://TOKEN.localhost:PORT/`): browsers and curl
    resolve `*.localhost` to the loopback, Python's resolver does not. From Python, connect to
    `address` and send the token in the `header` (`Farm-Port-Token`): `base_url` and
    `headers` are that, and `client()`, `async_client()` and `request()` use them.
    """

    port: int
    url: str = ""
    token: str = ""
    address: str = ""
    header: str = PORT_TOKEN_HEADER
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> "Port":
        d = _object(data, "an open port")
        return cls(
            port=_int(d.get("port")) or 0,
            url=str(d.get("url") or ""),
            token=str(d.get("token") or ""),
            address=str(d.get("address") or ""),
            header=_str(d.get("header")) or PORT_TOKEN_HEADER,
            raw=dict(d),
        )

    @property
    def headers(self) -> Dict[str, str]:
        """The header that carries the token, for any HTTP or WebSocket client."""
        return {self.header: self.token}

    @property
    def base_url(self) -> str:
        """`http://` and the port listener's address (a wildcard address as the loopback)."""
        host, _, port = self.address.rpartition(":")
        if host in ("0.0.0.0", "[::]", "::"):
            host = "127.0.0.1"
        return f"http://{host}:{port}"

    def client(self, **kwargs: Any) -> httpx.Client:
        """An `httpx.Client` whose requests reach this port (`kwargs` go to httpx: `timeout`,
        more `headers`...). Close it, or use it as a context manager."""
        headers = dict(kwargs.pop("headers", None) or {}, **self.headers)
        return httpx.Client(base_url=self.base_url, headers=headers, **kwargs)

    def async_client(self, **kwargs: Any) -> httpx.AsyncClient:
        """An `httpx.AsyncClient` whose requests reach this port (see `client`)."""
        headers = dict(kwargs.pop("headers", None) or {}, **self.headers)
        return httpx.AsyncClient(base_url=self.base_url, headers=headers, **kwargs)

    def request(self, method: str, path: str = "/", timeout: float = 30.0, **kwargs: Any) -> httpx.Response:
        """One request to the port's service (`kwargs` as `httpx.request`'s: `params`,
        `json`, `content`, `headers`...): its answer, read whole. A 502 means nothing listens
        on the guest's port (yet)."""
        with self.client(timeout=timeout) as client:
            return client.request(method, path, **kwargs)
