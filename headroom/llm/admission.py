"""LLM requests under the server's lifecycle (`headroom.core.lifecycle`), the same contract as tensor requests.

`@admitted` wraps an `OpenAIServing` entry point: the request is admitted (or refused with 503 and
`x-headroom-draining: 1` once drain started) before its body is looked at, and counted in flight until its
response is complete: a JSON body when it is returned, a stream when its last event went out or the
transport closed it (client gone). SIGTERM therefore waits for LLM streams as for tensor requests.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, Protocol, TypeVar, cast

from headroom.core.errors import HeadroomError
from headroom.core.lifecycle import ServingLifecycle
from headroom.llm.openai_protocol import ServingResponse, from_exception


class _Served(Protocol):
    model_name: str
    lifecycle: ServingLifecycle


F = TypeVar("F", bound=Callable[..., Awaitable[ServingResponse]])  # (self, body, on_usage=None, ...) -> response


def admitted(call: F) -> F:
    """Admit, run `call`, and release when its response is complete (the signature is kept)."""

    @functools.wraps(call)
    async def entry(self: _Served, body: Any, on_usage: Any = None, *args: Any, **kwargs: Any) -> ServingResponse:
        try:
            self.lifecycle.admit(self.model_name)
        except HeadroomError as exc:
            return from_exception(exc)
        try:
            response = await call(self, body, on_usage, *args, **kwargs)
        except BaseException:
            self.lifecycle.release()
            raise
        if response.stream is None:
            self.lifecycle.release()
            return response
        return replace(response, stream=_Releasing(response.stream, self.lifecycle.release))

    return cast(F, entry)


class _Releasing:
    """A stream that releases its admission once: at its end, or when closed before it (idempotent)."""

    def __init__(self, stream: AsyncIterator[str], release: Callable[[], None]) -> None:
        self._stream = stream  # the SSE events
        self._release: Callable[[], None] | None = release  # None once released

    def __aiter__(self) -> _Releasing:
        return self

    async def __anext__(self) -> str:
        try:
            return await anext(self._stream)
        except BaseException:  # the end (StopAsyncIteration) or a failure: the response is complete either way
            self._done()
            raise

    async def aclose(self) -> None:
        try:
            aclose = getattr(self._stream, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            self._done()

    def _done(self) -> None:
        if self._release is not None:
            release, self._release = self._release, None
            release()
