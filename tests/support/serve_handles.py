"""A Ray Serve `DeploymentHandle` stand-in for ingress tests without a cluster: `handle.http.options(stream=True)
.remote(call, ...)` runs the `HttpCall` through a real ASGI app with `call_asgi` (what `LLMReplica.http` and
`ModelReplica.http` yield), optionally dying after some items as a killed replica's stream does (`ActorDiedError`,
as Ray raises it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any

from ray.exceptions import ActorDiedError
from starlette.types import ASGIApp

from headroom.ray_serve.asgi_call import HttpCall, HttpHead, call_asgi


class AsgiStream:
    """A DeploymentResponseGenerator over `call_asgi`; after `die_after` items it raises ActorDiedError."""

    def __init__(self, items: AsyncGenerator[HttpHead | bytes, None], die_after: int | None) -> None:
        self.items, self.die_after, self.sent = items, die_after, 0
        self.closed: asyncio.Task[None] | None = None  # cancel() closes the replica's side, as Serve does

    async def __anext__(self) -> HttpHead | bytes:
        if self.die_after is not None and self.sent >= self.die_after:
            raise ActorDiedError()
        item = await anext(self.items)
        self.sent += 1
        return item

    def cancel(self) -> None:
        if self.closed is None:
            self.closed = asyncio.get_running_loop().create_task(self.items.aclose())


class AsgiHandle:
    """The handle of a deployment whose replica runs `app(call)` (a fresh app per call from `app`)."""

    def __init__(self, app: Callable[[], ASGIApp], die_after: int | None = None) -> None:
        self.app, self.die_after = app, die_after
        self.streams: list[AsgiStream] = []
        self.calls: list[HttpCall] = []
        self.http = self

    def options(self, **_: Any) -> AsgiHandle:
        return self

    def remote(self, call: HttpCall, **_: Any) -> AsgiStream:
        self.calls.append(call)
        self.streams.append(AsgiStream(call_asgi(self.app(), call), self.die_after))
        return self.streams[-1]
