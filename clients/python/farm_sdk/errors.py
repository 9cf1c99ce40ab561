"""The errors the SDK raises: every one is a `FarmError`.

A failed HTTP request becomes the subclass of its status (`BadRequest`, `NotFound`, `Busy`...)
and carries the server's message, the field it names, and the request's method and path.
Failures that are not an HTTP answer (`ConnectionFailed`, `BuildError`, `WaitTimeout`,
`UnsafeArchive`, a stream's `error` event) have `status` None.
"""

from __future__ import annotations

import email.utils
import json
import time
from typing import Any, Dict, Optional, Type

__all__ = [
    "FarmError",
    "BadRequest",
    "Unauthorized",
    "NotFound",
    "Conflict",
    "PayloadTooLarge",
    "Busy",
    "ServerError",
    "ConnectionFailed",
    "BuildError",
    "WaitTimeout",
    "UnsafeArchive",
    "error_from_answer",
]

_MAX_BODY_SHOWN = 2000


class FarmError(Exception):
    """A request to the farm failed, or what it started did.

    `status` is the HTTP status (None when there was no HTTP answer), `message` the server's
    `error` text, `field` the request field it names, `method` and `path` the request's.
    """

    def __init__(
        self,
        status: Optional[int],
        message: str,
        field: Optional[str] = None,
        method: Optional[str] = None,
        path: Optional[str] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.method = method
        self.path = path
        #: Seconds the server asked to wait before trying again (its `Retry-After`), if any.
        self.retry_after = retry_after
        #: How many times the request was sent before this error was raised.
        self.attempts = 1

    def __str__(self) -> str:
        where = " ".join(p for p in (self.method, self.path) if p)
        text = f"{where}: " if where else ""
        if self.status is not None:
            text += f"{self.status} "
        text += self.message
        if self.field:
            text += f" (field: {self.field})"
        if self.attempts > 1:
            text += f" (after {self.attempts} attempts)"
        return text


class BadRequest(FarmError):
    """400 or 422: the request is wrong; `field` names what."""


class Unauthorized(FarmError):
    """401: the bearer token is missing or wrong (see `FARM_SERVE_TOKEN`)."""


class NotFound(FarmError):
    """404: no such environment, sandbox, file or endpoint."""


class Conflict(FarmError):
    """409: not now (an environment still building, a paused sandbox, a request cut by a reset
    or a pause of its sandbox, input a process is not reading...)."""


class PayloadTooLarge(FarmError):
    """413: a file, folder or build context past the service's limit."""


class Busy(FarmError):
    """429 or 503: the service has no room now; `retry_after` is the seconds it asked for.

    `quota` is set when the caller's tenant is over one of its quotas: `{"name", "limit",
    "used"}` (`live`, `memory_mib`, `disk_mib`, `build_minutes_per_day`,
    `requests_per_second`, `connections`).
    """

    quota: Optional[Dict[str, Any]] = None


class ServerError(FarmError):
    """A 5xx other than 503: the service failed."""


class ConnectionFailed(FarmError):
    """The service could not be reached, or the connection broke (after any retries).

    `sent` tells whether the request may have reached the service: when it did, what it asked
    for may have happened (an exec may have run).
    """

    def __init__(self, message: str, method: Optional[str] = None, path: Optional[str] = None, sent: bool = True) -> None:
        super().__init__(None, message, None, method, path)
        self.sent = sent


class BuildError(FarmError):
    """An environment failed to build: where (`dockerfile_line`, `instruction`) and the end of
    the failing step's output (`output_tail`). `environment` is the failed environment."""

    # `environment` is a `models.Environment`, not named here: the models import the errors.
    def __init__(
        self,
        message: str,
        environment: Any = None,
        dockerfile_line: Optional[int] = None,
        instruction: Optional[str] = None,
        output_tail: Optional[str] = None,
    ) -> None:
        super().__init__(None, message)
        self.environment = environment
        self.dockerfile_line = dockerfile_line
        self.instruction = instruction
        self.output_tail = output_tail

    @classmethod
    def of(cls, environment: Any) -> "BuildError":
        """The error of a failed environment, from its `error` object."""
        error = environment.error or {}
        line = error.get("dockerfile_line")
        return cls(
            str(error.get("message") or "the build failed"),
            environment=environment,
            dockerfile_line=line if isinstance(line, int) else None,
            instruction=error.get("instruction"),
            output_tail=error.get("output_tail"),
        )

    def __str__(self) -> str:
        name = self.environment.id if self.environment is not None else "the environment"
        text = f"{name} failed to build: {self.message}"
        if self.dockerfile_line is not None or self.instruction:
            at = [f"Dockerfile line {self.dockerfile_line}"] if self.dockerfile_line is not None else []
            if self.instruction:
                at.append(self.instruction)
            text += f" ({': '.join(at)})"
        if self.output_tail:
            text += "\n" + self.output_tail.rstrip("\n")
        return text


class WaitTimeout(FarmError, TimeoutError):
    """A wait (an environment's build) took longer than its `timeout`."""

    def __init__(self, message: str) -> None:
        super().__init__(None, message)


class UnsafeArchive(FarmError):
    """A downloaded tar archive holds an entry that would land outside its folder (an absolute
    path, a `..`, a link pointing out) or a device: nothing of it is extracted past that entry."""

    def __init__(self, message: str) -> None:
        super().__init__(None, message)


_BY_STATUS: Dict[int, Type[FarmError]] = {
    429: Busy,
    503: Busy,
    400: BadRequest,
    422: BadRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
}


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """Seconds from a `Retry-After` header (seconds or an HTTP date); None when absent or bad."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_from_answer(
    status: int, body: bytes, method: str, path: str, retry_after: Optional[str] = None
) -> FarmError:
    """The error of an HTTP answer with a 4xx or 5xx status: the server's `{"error", "field"}`
    when the body is that JSON, else the body's text."""
    message: str = ""
    field: Optional[str] = None
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and "error" in parsed:
        message = str(parsed["error"])
        field = parsed.get("field") if isinstance(parsed.get("field"), str) else None
    else:
        message = body.decode("utf-8", "replace").strip()[:_MAX_BODY_SHOWN] or "(no message)"
    kind = _BY_STATUS.get(status)
    if kind is None:
        kind = ServerError if status >= 500 else FarmError
    error = kind(status, message, field, method, path, retry_after=parse_retry_after(retry_after))
    if isinstance(error, Busy) and isinstance(parsed, dict) and isinstance(parsed.get("quota"), dict):
        error.quota = parsed["quota"]
    return error
