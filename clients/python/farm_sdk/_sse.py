"""Server-sent events, as `/exec/stream` answers them, read incrementally.

`SSEParser` takes the text as it arrives (events split across chunks anywhere, `\\n`,
`\\r\\n` or `\\r` line ends, multi-line `data`, comments) and gives whole events.
`ExecStream` turns the events of one exec into output chunks and its `ExecResult`;
`OutputFollow` those of a followed background process (`/processes/{pid}/output/stream`)
into `OutputChunk`s and how the process ended.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from .errors import ConnectionFailed, FarmError
from .hosting_models import OutputChunk, ProcessInfo
from .models import ExecResult

__all__ = ["Event", "SSEParser", "ExecStream", "OutputFollow"]


@dataclass(frozen=True)
class Event:
    """One event: its name (`message` when unnamed) and its data lines joined by newlines."""

    event: str
    data: str


class SSEParser:
    """An incremental parser of `text/event-stream`."""

    def __init__(self) -> None:
        self._buffer = ""
        self._event = ""
        self._data: List[str] = []

    def feed(self, text: str) -> List[Event]:
        """The events that `text` completes."""
        self._buffer += text
        events: List[Event] = []
        while True:
            cr, lf = self._buffer.find("\r"), self._buffer.find("\n")
            if cr == -1 and lf == -1:
                break
            if cr != -1 and (lf == -1 or cr < lf):
                if cr == len(self._buffer) - 1:
                    break  # a "\r" last: the "\n" of a "\r\n" may be in the next chunk
                end, size = cr, 2 if self._buffer[cr + 1] == "\n" else 1
            else:
                end, size = lf, 1
            line, self._buffer = self._buffer[:end], self._buffer[end + size :]
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def _line(self, line: str) -> Optional[Event]:
        if not line:
            if not self._data and not self._event:
                return None
            event = Event(self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return event
        if line.startswith(":"):
            return None  # a comment (a keep-alive)
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        # "id" and "retry" mean nothing for a one-shot exec stream.
        return None


class ExecStream:
    """The events of one streamed exec: output chunks as they come, then the result."""

    def __init__(self, method: str, path: str) -> None:
        self._parser = SSEParser()
        self._method, self._path = method, path
        self._stdout: List[str] = []
        self._stderr: List[str] = []
        self._result: Optional[ExecResult] = None
        self._error: Optional[FarmError] = None

    @property
    def ended(self) -> bool:
        """Whether the stream said how it ends (an `exit` or an `error` event)."""
        return self._result is not None or self._error is not None

    def feed(self, text: str) -> List[Tuple[str, str]]:
        """The `("stdout" | "stderr", text)` chunks that `text` completes (none past the
        end)."""
        chunks: List[Tuple[str, str]] = []
        for event in self._parser.feed(text):
            if self.ended:
                break
            if event.event in ("stdout", "stderr"):
                data = _output(event.data)
                (self._stdout if event.event == "stdout" else self._stderr).append(data)
                chunks.append((event.event, data))
            elif event.event == "exit":
                self._result = ExecResult.from_json(
                    _json(event.data), stdout="".join(self._stdout), stderr="".join(self._stderr)
                )
            elif event.event == "error":
                message = f"the stream ended: {_error(event.data)}"
                self._error = FarmError(None, message, method=self._method, path=self._path)
        return chunks

    def finish(self) -> ExecResult:
        """The result. Raises `FarmError` after an `error` event (the sandbox died, a reset or a
        pause cut the command, or the key that opened the stream was revoked), and
        `ConnectionFailed` when the stream ended before the command's exit."""
        if self._error is not None:
            raise self._error
        if self._result is None:
            raise ConnectionFailed(
                "the stream ended before the command's exit (it may still be running)", self._method, self._path
            )
        return self._result


class OutputFollow:
    """The events of a followed background process: its output chunks as they come (each
    stream's offset kept, to follow again from there), then how it ended."""

    def __init__(self, method: str, path: str, stdout: int = 0, stderr: int = 0) -> None:
        self._parser = SSEParser()
        self._method, self._path = method, path
        #: The offset of the next byte of each stream not yet seen.
        self.offsets = {"stdout": stdout, "stderr": stderr}
        self._end: Optional[ProcessInfo] = None
        self._error: Optional[FarmError] = None

    @property
    def ended(self) -> bool:
        """Whether the stream said how it ends (an `exit` or an `error` event)."""
        return self._end is not None or self._error is not None

    def feed(self, text: str) -> List[OutputChunk]:
        """The chunks that `text` completes (none past the end)."""
        chunks: List[OutputChunk] = []
        for event in self._parser.feed(text):
            if self.ended:
                break
            if event.event in ("stdout", "stderr"):
                data = _json(event.data)
                if not isinstance(data, dict):
                    data = {"data": event.data}
                chunk = OutputChunk.from_json(data, event.event)
                self.offsets[event.event] = max(self.offsets[event.event], chunk.next)
                chunks.append(chunk)
            elif event.event == "exit":
                answer = _json(event.data)
                self._end = ProcessInfo.from_json(answer if isinstance(answer, dict) else {})
            elif event.event == "error":
                message = f"following the output ended: {_error(event.data)}"
                self._error = FarmError(None, message, method=self._method, path=self._path)
        return chunks

    def finish(self) -> ProcessInfo:
        """How the process ended. Raises `FarmError` after an `error` event (the sandbox went,
        the pid is unknown), and `ConnectionFailed` when the stream ended before the process
        did (follow again from `offsets`)."""
        if self._error is not None:
            raise self._error
        if self._end is None:
            raise ConnectionFailed(
                "the stream ended before the process did (it may still be running; follow again from "
                f"stdout={self.offsets['stdout']}, stderr={self.offsets['stderr']})",
                self._method,
                self._path,
            )
        return self._end


def _json(data: str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _output(data: str) -> str:
    parsed = _json(data)
    if isinstance(parsed, dict) and isinstance(parsed.get("data"), str):
        return parsed["data"]
    return data


def _error(data: str) -> str:
    parsed = _json(data)
    if isinstance(parsed, dict) and "error" in parsed:
        return str(parsed["error"])
    return data or "(no message)"
