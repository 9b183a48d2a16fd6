"""Racing a request against its client's disconnect, without an extra task per request."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from headroom.batching.queue import BatchResult
from headroom.core.dataplane import DisconnectWatcher
from headroom.core.errors import Cancelled


async def race_disconnect(submit: Coroutine[Any, Any, BatchResult], disconnected: DisconnectWatcher | None,
                          name: str) -> BatchResult:
    """Await the batcher; if the client goes away first, cancel (drop from the queue) and raise Cancelled.

    The batcher runs in this task (no extra task and no `asyncio.wait` per request): the watcher, when the
    client disconnects, cancels this task, and the CancelledError is turned into Cancelled here.
    """
    if disconnected is None:
        return await submit
    current = asyncio.current_task()
    if current is None:
        raise RuntimeError("race_disconnect must run inside a task")
    gone = finished = False

    def on_watcher_done(watcher: asyncio.Future[None]) -> None:
        nonlocal gone
        if watcher.cancelled():
            return
        watcher.exception()  # retrieved: a receive() that failed means the connection is gone too
        if finished:
            return
        gone = True
        current.cancel()

    watcher = asyncio.ensure_future(disconnected())
    watcher.add_done_callback(on_watcher_done)
    try:
        return await submit
    except asyncio.CancelledError:
        if not gone:
            raise
        current.uncancel()
        raise Cancelled(f"client disconnected; request to '{name}' dropped") from None
    finally:
        finished = True
        watcher.cancel()
