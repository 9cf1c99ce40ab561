"""The sandbox API's operations, written once for the sync and the async client, without I/O.

An operation is a generator: it yields each thing it needs done (an effect) and is sent back
the outcome, or has the error thrown in at the `yield`; what it returns is its result. The
effects, and their outcomes:

- a `Call`: the answer (2xx) read whole, an `httpx.Response`, after the retries of `_http`;
- `Open(call, text)`: the answer's body opened as a stream (None). Each `READ` then gives
  its next piece (`str` when `text`, else `bytes`), None past its end. The stream is closed
  when the operation ends, however it ends;
- `Notify(callback, text)`: `callback(text)`, when the caller gave a callback (None);
- `Emit(item)`: `item` handed to the caller of a face that iterates, `iter_exec` (None).

`client.py` performs them with `SyncHTTP`, `aio.py` with `AsyncHTTP` (awaiting a callback
that is a coroutine function), each through a `Progress`.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from typing import IO, Any, Callable, Generator, List, Mapping, Optional, Protocol, Tuple, TypeVar, Union

from . import _calls as calls
from ._calls import EnvironmentRef
from ._http import Call
from ._sse import ExecStream
from ._tar import extract_tar, pack_dir
from .errors import BuildError, FarmError, NotFound
from .models import Context, Environment, ExecResult, LogPage, ResetInfo, SandboxInfo

log = logging.getLogger("farm_sdk")

T = TypeVar("T")
E = TypeVar("E", bound=Environment)
#: What a stream of events gives as it goes, and at its end (see `EventReader`).
C = TypeVar("C")
R = TypeVar("R", covariant=True)
#: An operation that ends with a `T`.
Operation = Generator[Any, Any, T]
#: Makes the face's kind of environment (an `Environment` or an `AsyncEnvironment`, bound
#: to the face's `farm.environments`) from the service's JSON.
Bind = Callable[[Any], E]
#: A callback of the caller: a function, or (on the async face) a coroutine function.
Callback = Callable[[str], Any]
#: What `iter_exec` yields: output chunks, then the result.
ExecItem = Union[Tuple[str, str], ExecResult]


@dataclass(frozen=True)
class Open:
    call: Call
    text: bool


@dataclass(frozen=True)
class Notify:
    callback: Optional[Callback]
    text: str


@dataclass(frozen=True)
class Emit:
    item: Any


#: The next piece of the stream the operation opened last.
READ = object()


class Progress:
    """An operation under way, for a face to drive: the `effect` it waits on, until it is
    `done` with its `value`. Leaving it as a context manager closes an operation cut short."""

    def __init__(self, operation: Operation[Any]) -> None:
        self._operation = operation
        self.done = False
        self.value: Any = None
        self.effect: Any = None
        self._advance(operation.send, None)

    def answer(self, outcome: Any) -> None:
        self._advance(self._operation.send, outcome)

    def fail(self, error: BaseException) -> None:
        self._advance(self._operation.throw, error)

    def _advance(self, step: Callable[[Any], Any], argument: Any) -> None:
        try:
            self.effect = step(argument)
        except StopIteration as end:
            self.done, self.value, self.effect = True, end.value, None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self._operation.close()


def _json(call: Call) -> Operation[Any]:
    return (yield call).json()


# Environments.


def upload_context(context_dir: str) -> Operation[Context]:
    archive = pack_dir(context_dir, for_context=True)
    return Context.from_json((yield from _json(calls.create_context(archive))))


def create_environment(
    bind: Bind[E],
    image: str,
    options: Mapping[str, Any],
    wait: bool,
    on_log: Optional[Callback],
    timeout: Optional[float],
) -> Operation[E]:
    """`options` as `_calls.environment_options`."""
    return (yield from _created(bind, calls.create_environment({"image": image}, options), wait, on_log, timeout))


def environment_from_dockerfile(
    bind: Bind[E],
    context_dir: str,
    dockerfile: str,
    build_args: Optional[Mapping[str, str]],
    target: Optional[str],
    options: Mapping[str, Any],
    wait: bool,
    on_log: Optional[Callback],
    timeout: Optional[float],
) -> Operation[E]:
    """Checks the Dockerfile's path before uploading its context, then creates."""
    path = calls.dockerfile_path(context_dir, dockerfile)
    context = yield from upload_context(context_dir)
    spec = calls.dockerfile_spec(context.id, path, build_args, target)
    return (yield from _created(bind, calls.create_environment({"dockerfile": spec}, options), wait, on_log, timeout))


def _created(
    bind: Bind[E], call: Call, wait: bool, on_log: Optional[Callback], timeout: Optional[float]
) -> Operation[E]:
    """The environment `call` creates; with `wait`, once its build ended (`wait_for_build`)."""
    env = bind((yield from _json(call)))
    if wait and env.building:
        return (yield from wait_for_build(bind, env.id, on_log, timeout))
    if wait and env.failed:
        raise BuildError.of(env)
    return env


def get_environment(bind: Bind[E], environment_id: str) -> Operation[E]:
    return bind((yield from _json(calls.get_environment(environment_id))))


def list_environments(bind: Bind[E]) -> Operation[List[E]]:
    answer = yield from _json(calls.list_environments())
    return [bind(e) for e in calls.listed(answer, "environments")]


def delete_environment(environment_id: str) -> Operation[None]:
    yield calls.delete_environment(environment_id)


def environment_logs(environment_id: str, offset: int, wait: float) -> Operation[LogPage]:
    return calls.log_page((yield from _json(calls.environment_logs(environment_id, offset, wait))))


def wait_for_build(
    bind: Bind[E], environment_id: str, on_log: Optional[Callback], timeout: Optional[float]
) -> Operation[E]:
    """Polls the build log (each line to `on_log`) until the build ended and every line was
    read; the environment then, or `BuildError` when it failed."""
    waiting = calls.BuildWait(environment_id, timeout)
    while True:
        lines, offset, state = yield from environment_logs(environment_id, waiting.offset, waiting.poll_secs())
        for line in lines:
            yield Notify(on_log, line)
        if waiting.done(lines, offset, state):
            break
    env = yield from get_environment(bind, environment_id)
    if env.failed:
        raise BuildError.of(env)
    return env


# Sandboxes: an operation that makes or finds one gives its id, for the face to wrap.


def create_sandbox(environment: EnvironmentRef, options: Mapping[str, Any]) -> Operation[str]:
    """`options` as `_calls.sandbox_options`."""
    return SandboxInfo.from_json((yield from _json(calls.create_sandbox(environment, options)))).id


def get_sandbox(sandbox_id: str) -> Operation[str]:
    return (yield from sandbox_info(sandbox_id)).id


def sandbox_info(sandbox_id: str) -> Operation[SandboxInfo]:
    return SandboxInfo.from_json((yield from _json(calls.get_sandbox(sandbox_id))))


def branch(sandbox_id: str) -> Operation[str]:
    return SandboxInfo.from_json((yield from _json(calls.sandbox_action(sandbox_id, "branch")))).id


def sandbox_action(sandbox_id: str, action: str) -> Operation[SandboxInfo]:
    """`pause`, `resume` or `checkpoint`: the sandbox after it."""
    return SandboxInfo.from_json((yield from _json(calls.sandbox_action(sandbox_id, action))))


def reset(sandbox_id: str) -> Operation[ResetInfo]:
    return ResetInfo.from_json((yield from _json(calls.sandbox_action(sandbox_id, "reset"))))


def snapshot(bind: Bind[E], sandbox_id: str) -> Operation[E]:
    return bind((yield from _json(calls.sandbox_action(sandbox_id, "snapshot"))))


def kill(sandbox_id: str) -> Operation[None]:
    """A sandbox that is gone already is no error."""
    try:
        yield calls.delete_sandbox(sandbox_id)
    except NotFound:
        pass


def leave(sandbox_id: str, error: Optional[BaseException]) -> Operation[None]:
    """Kills the sandbox a `with` block leaves. A failed kill is raised, unless an exception
    is leaving the block: that one is what the caller needs to see, the kill's is logged."""
    try:
        yield from kill(sandbox_id)
    except FarmError as e:
        if error is None:
            raise
        log.warning("killing sandbox %s after %r failed: %s", sandbox_id, error, e)


# Commands: `call` is an exec's, `_calls.exec_call`.


def exec_result(call: Call) -> Operation[ExecResult]:
    return ExecResult.from_json((yield from _json(call)))


class EventReader(Protocol[C, R]):
    """What reads a stream of server-sent events (`_sse.ExecStream`, `_sse.OutputFollow`):
    it is fed the text as it comes and gives the items it decoded, until it has `ended`;
    `finish` gives how the stream ended."""

    @property
    def ended(self) -> bool: ...

    def feed(self, text: str) -> List[C]: ...

    def finish(self) -> R: ...


def read_events(call: Call, events: EventReader[C, R], deliver: Callable[[C], Any]) -> Operation[R]:
    """Opens `call`'s answer as a stream and feeds its text to `events`: each item decoded
    becomes the effect `deliver` makes of it (`Emit` to iterate, `Notify` for callbacks), up
    to the event that ends the stream; then what `events.finish()` gives."""
    yield Open(call, text=True)
    while not events.ended:
        text = yield READ
        if text is None:
            break
        for item in events.feed(text):
            yield deliver(item)
    return events.finish()


def exec_streamed(call: Call, deliver: Callable[[Tuple[str, str]], Any]) -> Operation[ExecResult]:
    """Reads a streamed exec's events: each output chunk, `("stdout" | "stderr", text)`,
    becomes the effect `deliver` makes of it (`Emit` to iterate, `Notify` for callbacks), up
    to the event that ends the stream; the result."""
    return (yield from read_events(call, ExecStream(call.method, call.path), deliver))


def to_callbacks(
    on_stdout: Optional[Callback], on_stderr: Optional[Callback]
) -> Callable[[Tuple[str, str]], Notify]:
    """How `exec_stream` has `exec_streamed` deliver a chunk: to its stream's callback."""

    def notify(chunk: Tuple[str, str]) -> Notify:
        stream, text = chunk
        return Notify(on_stdout if stream == "stdout" else on_stderr, text)

    return notify


# Files. Local files are read and written with blocking calls on both faces: they are local,
# and at most a few hundred MiB.


def write_file(sandbox_id: str, path: str, data: Union[bytes, str], mode: int) -> Operation[None]:
    content = data.encode("utf-8") if isinstance(data, str) else data
    yield calls.write_file(sandbox_id, path, content, mode)


def read_file(sandbox_id: str, path: str) -> Operation[bytes]:
    return (yield calls.read_file(sandbox_id, path)).content


def upload_file(sandbox_id: str, local_path: str, remote_path: str, mode: Optional[int]) -> Operation[None]:
    with open(local_path, "rb") as f:
        content = f.read()
    yield calls.write_file(sandbox_id, remote_path, content, calls.local_mode(local_path, mode))


def download_file(sandbox_id: str, remote_path: str, local_path: str) -> Operation[None]:
    """Writes `local_path` whole or not at all: the bytes go to a `.part` file beside it,
    renamed once complete and removed on any failure."""
    os.makedirs(os.path.dirname(os.path.abspath(local_path)), exist_ok=True)
    part = f"{local_path}.part"
    try:
        with open(part, "wb") as f:
            yield from _copy(calls.read_file(sandbox_id, remote_path), f)
        os.replace(part, local_path)
    except BaseException:
        if os.path.exists(part):
            os.unlink(part)
        raise


def upload_dir(sandbox_id: str, local_dir: str, remote_dir: str) -> Operation[None]:
    yield calls.put_folder(sandbox_id, remote_dir, pack_dir(local_dir, for_context=False))


def download_dir(sandbox_id: str, remote_dir: str, local_dir: str) -> Operation[None]:
    """The archive is kept whole in a temporary file first: `extract_tar` checks every entry's
    name before it extracts any."""
    with tempfile.TemporaryFile() as archive:
        yield from _copy(calls.get_folder(sandbox_id, remote_dir), archive)
        archive.seek(0)
        extract_tar(archive, local_dir)


def _copy(call: Call, sink: IO[bytes]) -> Operation[None]:
    """Writes the answer's body to `sink` as it comes."""
    yield Open(call, text=False)
    while True:
        piece = yield READ
        if piece is None:
            return
        sink.write(piece)
