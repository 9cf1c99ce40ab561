"""HTTP with the service: one `Call` per SDK operation, sent by `SyncHTTP` or `AsyncHTTP`
with the same retry rules.

- A transport error (the service cannot be reached, the connection broke) is retried, except
  for a call that is not `resend`-safe (an exec, a session step) once the request may have
  been sent: only failing to connect is retried for those.
- 429 and 503 are retried for every call (the service refused before doing anything),
  after its `Retry-After` (capped) or an exponential backoff.
- A 409 with `Retry-After` on a call carrying an `Idempotency-Key` is retried too: an earlier
  try with the same key is still being admitted.
- A call that creates something carries an `Idempotency-Key` made once per call, so every
  retry of it sends the same key and the service makes one thing.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import (
    Any, AsyncIterator, Awaitable, Callable, Dict, Generic, Iterator, Mapping, Optional, Type, TypeVar, Union
)

import httpx

from ._version import __version__
from .errors import Busy, Conflict, ConnectionFailed, FarmError, error_from_answer

DEFAULT_URL = "http://127.0.0.1:8765"
#: First backoff delay in seconds; it doubles with each retry, up to `BACKOFF_MAX`.
BACKOFF_BASE = 0.5
BACKOFF_MAX = 8.0
#: The longest `Retry-After` honoured, in seconds.
RETRY_AFTER_MAX = 60.0
#: Seconds to connect, at most (a refused or unroutable service is seen quickly).
CONNECT_TIMEOUT = 30.0

Params = Mapping[str, Union[str, int, float]]
#: httpx's transport of a sender: `httpx.BaseTransport` (sync) or `httpx.AsyncBaseTransport`.
_Transport = TypeVar("_Transport")
#: The sender of a client: `SyncHTTP` or `AsyncHTTP`.
_Sender = TypeVar("_Sender", bound="_Core[Any]")

# Errors raised before any byte of the request could reach the service.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Errors worth another try; the other transport errors (a bad URL scheme, a proxy refusing,
# a malformed request) would fail the same way again.
_TRANSIENT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


def new_key() -> str:
    """A fresh idempotency key."""
    return str(uuid.uuid4())


@dataclass(frozen=True)
class Call:
    """One request, as every try of it is sent."""

    method: str
    path: str
    params: Optional[Params] = None
    json: Any = None
    content: Optional[bytes] = None
    content_type: Optional[str] = None
    accept: Optional[str] = None
    #: Sent as `Idempotency-Key`, the same on every retry.
    idempotency_key: Optional[str] = None
    #: Whether the request may be sent again after it may have reached the service.
    resend: bool = True
    #: Seconds the service may hold the answer on purpose (a long poll, a command's run),
    #: added to the client's timeout for reading it.
    wait: float = 0.0


def resolve_url(url: Optional[str]) -> str:
    return (url or os.environ.get("FARM_URL") or DEFAULT_URL).rstrip("/")


def resolve_token(token: Optional[str]) -> Optional[str]:
    return token if token is not None else (os.environ.get("FARM_SERVE_TOKEN") or None)


def _headers(token: Optional[str]) -> Dict[str, str]:
    headers = {"User-Agent": f"farm-sdk-python/{__version__}"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


class _Core(Generic[_Transport]):
    """What the sync and async senders share: the service's address, building requests and
    deciding on retries. A subclass makes its httpx client in `_open`."""

    def __init__(
        self,
        url: Optional[str],
        token: Optional[str],
        timeout: float,
        retries: int,
        transport: Optional[_Transport] = None,
    ) -> None:
        if retries < 0:
            raise ValueError("retries must be 0 or more")
        self.url = resolve_url(url)
        self.timeout = timeout
        self.retries = retries
        self.token = resolve_token(token)
        self._open(_headers(self.token), transport)

    def _open(self, headers: Dict[str, str], transport: Optional[_Transport]) -> None:
        """Makes the httpx client that sends every request with `headers`."""
        raise NotImplementedError

    def _timeout(self, call: Call, timeout: Optional[float]) -> httpx.Timeout:
        read = (self.timeout if timeout is None else timeout) + call.wait
        return httpx.Timeout(read, connect=min(read, CONNECT_TIMEOUT))

    def _request_args(self, call: Call, timeout: Optional[float]) -> Dict[str, Any]:
        headers: Dict[str, str] = {}
        if call.content_type:
            headers["Content-Type"] = call.content_type
        if call.accept:
            headers["Accept"] = call.accept
        if call.idempotency_key:
            headers["Idempotency-Key"] = call.idempotency_key
        args: Dict[str, Any] = {
            "method": call.method,
            "url": call.path,
            "params": dict(call.params) if call.params else None,
            "headers": headers,
            "timeout": self._timeout(call, timeout),
        }
        if call.content is not None:
            args["content"] = call.content
        elif call.json is not None:
            args["json"] = call.json
        return args

    def _transport_error(self, call: Call, error: httpx.TransportError) -> FarmError:
        sent = not isinstance(error, _NOT_SENT)
        what = "the connection failed" if sent else "cannot connect"
        failed = ConnectionFailed(f"{what} ({self.url}): {error or type(error).__name__}", call.method, call.path, sent)
        failed.__cause__ = error
        return failed

    def _answer_error(self, call: Call, response: httpx.Response) -> FarmError:
        return error_from_answer(
            response.status_code, response.content, call.method, call.path, response.headers.get("Retry-After")
        )

    def _delay(self, call: Call, error: FarmError, attempt: int, retries: int) -> float:
        """The seconds to wait before the next try after `error`; raises it when there is none."""
        error.attempts = attempt + 1
        if attempt >= retries:
            raise error
        if isinstance(error, ConnectionFailed):
            cause = error.__cause__
            if not isinstance(cause, _TRANSIENT) or (error.sent and not call.resend):
                raise error
        elif isinstance(error, Busy):
            pass
        elif not (isinstance(error, Conflict) and call.idempotency_key and error.retry_after is not None):
            raise error
        if error.retry_after is not None:
            return min(error.retry_after, RETRY_AFTER_MAX)
        return min(BACKOFF_MAX, BACKOFF_BASE * 2**attempt) * random.uniform(0.5, 1.0)

    @contextmanager
    def _reading(self, call: Call) -> Iterator[None]:
        """While the caller reads an answer's body: a transport error becomes
        `ConnectionFailed`, never retried (part of the body was used)."""
        try:
            yield
        except httpx.TransportError as e:
            raise self._transport_error(call, e) from e


class SyncHTTP(_Core[httpx.BaseTransport]):
    """Sends calls with an `httpx.Client`."""

    def _open(self, headers: Dict[str, str], transport: Optional[httpx.BaseTransport]) -> None:
        self.client = httpx.Client(base_url=self.url, headers=headers, transport=transport)
        #: How the client waits between tries (a seam for tests).
        self.sleep: Callable[[float], None] = time.sleep

    def close(self) -> None:
        self.client.close()

    def send(self, call: Call, *, timeout: Optional[float] = None, retries: Optional[int] = None) -> httpx.Response:
        """The answer to `call` (2xx), read whole, after the retries it is allowed; else its
        `FarmError`."""
        with self.stream(call, timeout=timeout, retries=retries, whole=True) as response:
            return response

    def json(self, call: Call) -> Any:
        return self.send(call).json()

    @contextmanager
    def stream(
        self, call: Call, *, timeout: Optional[float] = None, retries: Optional[int] = None, whole: bool = False
    ) -> Iterator[httpx.Response]:
        """The answer to `call` (2xx), its body still to read unless `whole`. A transport error
        while the caller reads it becomes `ConnectionFailed`, never retried (part of it was
        used)."""
        response = self._answer(call, timeout, self.retries if retries is None else retries, whole)
        try:
            with self._reading(call):
                yield response
        finally:
            response.close()

    def _answer(self, call: Call, timeout: Optional[float], retries: int, whole: bool) -> httpx.Response:
        """The answer to `call` (2xx) after at most `retries` more tries; else its `FarmError`."""
        attempt = 0
        while True:
            outcome = self._try(call, timeout, whole)
            if isinstance(outcome, httpx.Response):
                return outcome
            self.sleep(self._delay(call, outcome, attempt, retries))
            attempt += 1

    def _try(self, call: Call, timeout: Optional[float], whole: bool) -> Union[httpx.Response, FarmError]:
        """One try: the answer (2xx), its body read when `whole`; else the error it ended in."""
        try:
            request = self.client.build_request(**self._request_args(call, timeout))
            response = self.client.send(request, stream=True)
            try:
                if whole or not response.is_success:
                    response.read()
            except BaseException:
                response.close()
                raise
        except httpx.TransportError as e:
            return self._transport_error(call, e)
        if response.is_success:
            return response
        response.close()
        return self._answer_error(call, response)


class AsyncHTTP(_Core[httpx.AsyncBaseTransport]):
    """Sends calls with an `httpx.AsyncClient`."""

    def _open(self, headers: Dict[str, str], transport: Optional[httpx.AsyncBaseTransport]) -> None:
        self.client = httpx.AsyncClient(base_url=self.url, headers=headers, transport=transport)
        #: How the client waits between tries (a seam for tests).
        self.sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    async def close(self) -> None:
        await self.client.aclose()

    async def send(
        self, call: Call, *, timeout: Optional[float] = None, retries: Optional[int] = None
    ) -> httpx.Response:
        """The answer to `call` (2xx), read whole, after the retries it is allowed; else its
        `FarmError`."""
        async with self.stream(call, timeout=timeout, retries=retries, whole=True) as response:
            return response

    async def json(self, call: Call) -> Any:
        return (await self.send(call)).json()

    @asynccontextmanager
    async def stream(
        self, call: Call, *, timeout: Optional[float] = None, retries: Optional[int] = None, whole: bool = False
    ) -> AsyncIterator[httpx.Response]:
        """The answer to `call` (2xx), its body still to read unless `whole` (see
        `SyncHTTP.stream`)."""
        response = await self._answer(call, timeout, self.retries if retries is None else retries, whole)
        try:
            with self._reading(call):
                yield response
        finally:
            await response.aclose()

    async def _answer(self, call: Call, timeout: Optional[float], retries: int, whole: bool) -> httpx.Response:
        """See `SyncHTTP._answer`."""
        attempt = 0
        while True:
            outcome = await self._try(call, timeout, whole)
            if isinstance(outcome, httpx.Response):
                return outcome
            await self.sleep(self._delay(call, outcome, attempt, retries))
            attempt += 1

    async def _try(self, call: Call, timeout: Optional[float], whole: bool) -> Union[httpx.Response, FarmError]:
        """See `SyncHTTP._try`."""
        try:
            request = self.client.build_request(**self._request_args(call, timeout))
            response = await self.client.send(request, stream=True)
            try:
                if whole or not response.is_success:
                    await response.aread()
            except BaseException:
                await response.aclose()
                raise
        except httpx.TransportError as e:
            return self._transport_error(call, e)
        if response.is_success:
            return response
        await response.aclose()
        return self._answer_error(call, response)


_Client = TypeVar("_Client", bound="SyncClient")
_AsyncClient = TypeVar("_AsyncClient", bound="AsyncClient")


class _Service(Generic[_Sender, _Transport]):
    """What `SyncClient` and `AsyncClient` share: the sender each makes (`_sender`, a
    `SyncHTTP` or an `AsyncHTTP`) from the arguments, its URL, and `_opened`, where a subclass
    reaches the service."""

    _sender: Type[_Sender]

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        timeout: float = 600.0,
        retries: int = 3,
        *,
        transport: Optional[_Transport] = None,
    ) -> None:
        self._http: _Sender = self._sender(url, token, timeout, retries, transport)
        self._opened()

    def _opened(self) -> None:
        """What a subclass makes of its connection (nothing here)."""

    @property
    def url(self) -> str:
        return self._http.url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class SyncClient(_Service[SyncHTTP, httpx.BaseTransport]):
    """A client of one service: its URL, `close()` and `with`. `url` defaults to `$FARM_URL`,
    else `http://127.0.0.1:8765`; `token` to `$FARM_SERVE_TOKEN`; `transport` replaces
    httpx's. A subclass reaches the service in `_opened`."""

    _sender = SyncHTTP

    def close(self) -> None:
        """Closes its connections."""
        self._http.close()

    def __enter__(self: _Client) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Service[AsyncHTTP, httpx.AsyncBaseTransport]):
    """`SyncClient` for asyncio (`transport` is an `httpx.AsyncBaseTransport`)."""

    _sender = AsyncHTTP

    async def close(self) -> None:
        """Closes its connections."""
        await self._http.close()

    async def __aenter__(self: _AsyncClient) -> _AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
