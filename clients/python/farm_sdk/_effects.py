"""Performing the core's effects (see `_core`): `run` and `iterate` drive an operation with a
`SyncHTTP`, `arun` and `aiterate` with an `AsyncHTTP` (awaiting a callback that is a
coroutine function). Every face (`client`, `aio`, `hosting`, `aio_hosting`) runs its
operations through these four.
"""

from __future__ import annotations

import inspect
from contextlib import AsyncExitStack, ExitStack
from typing import Any, AsyncIterator, Iterator, Optional, TypeVar

from . import _core as core
from ._http import AsyncHTTP, Call, SyncHTTP

__all__ = ["run", "iterate", "arun", "aiterate"]

T = TypeVar("T")


class _SyncEffects(ExitStack):
    """Performs effects with a `SyncHTTP`; the streams it opens are closed with it."""

    def __init__(self, http: SyncHTTP) -> None:
        super().__init__()
        self._http = http
        self._pieces: Iterator[Any] = iter(())

    def perform(self, effect: Any) -> Any:
        if isinstance(effect, Call):
            return self._http.send(effect)
        if isinstance(effect, core.Open):
            response = self.enter_context(self._http.stream(effect.call))
            self._pieces = response.iter_text() if effect.text else response.iter_bytes()
        elif effect is core.READ:
            return next(self._pieces, None)
        elif isinstance(effect, core.Notify) and effect.callback is not None:
            effect.callback(effect.text)
        return None


def iterate(http: SyncHTTP, operation: core.Operation[Any]) -> Iterator[Any]:
    """Runs `operation`: yields what it emits, then what it returns."""
    with core.Progress(operation) as progress, _SyncEffects(http) as effects:
        while not progress.done:
            effect = progress.effect
            if isinstance(effect, core.Emit):
                yield effect.item
            try:
                outcome = effects.perform(effect)
            except BaseException as error:
                progress.fail(error)
            else:
                progress.answer(outcome)
    yield progress.value


def run(http: SyncHTTP, operation: core.Operation[T]) -> T:
    """Runs `operation` to its end: what it returns."""
    *_, result = iterate(http, operation)
    return result


class _AsyncEffects(AsyncExitStack):
    """Performs effects with an `AsyncHTTP`, awaiting what a callback returns when it is
    awaitable; the streams it opens are closed with it."""

    def __init__(self, http: AsyncHTTP) -> None:
        super().__init__()
        self._http = http
        self._pieces: Optional[AsyncIterator[Any]] = None

    async def perform(self, effect: Any) -> Any:
        if isinstance(effect, Call):
            return await self._http.send(effect)
        if isinstance(effect, core.Open):
            response = await self.enter_async_context(self._http.stream(effect.call))
            self._pieces = response.aiter_text() if effect.text else response.aiter_bytes()
        elif effect is core.READ and self._pieces is not None:
            try:
                return await self._pieces.__anext__()
            except StopAsyncIteration:
                return None
        elif isinstance(effect, core.Notify) and effect.callback is not None:
            called = effect.callback(effect.text)
            if inspect.isawaitable(called):
                await called
        return None


async def aiterate(http: AsyncHTTP, operation: core.Operation[Any]) -> AsyncIterator[Any]:
    """Runs `operation`: yields what it emits, then what it returns."""
    with core.Progress(operation) as progress:
        async with _AsyncEffects(http) as effects:
            while not progress.done:
                effect = progress.effect
                if isinstance(effect, core.Emit):
                    yield effect.item
                try:
                    outcome = await effects.perform(effect)
                except BaseException as error:
                    progress.fail(error)
                else:
                    progress.answer(outcome)
    yield progress.value


async def arun(http: AsyncHTTP, operation: core.Operation[T]) -> T:
    """Runs `operation` to its end: what it returns."""
    async for result in aiterate(http, operation):
        pass
    return result
