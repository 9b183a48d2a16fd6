"""Await a data-plane coroutine, or raise Cancelled when the client goes away first."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from headroom.core.dataplane import DisconnectWatcher
from headroom.core.errors import Cancelled

T = TypeVar("T")

#: A request answered within this long never starts its disconnect watcher (a task, and that task's
#: cancellation, on the event loop per request); one still waiting then is watched from then on, so a client
#: that left is dropped from the queue at most this much later than it could be.
WATCH_AFTER_S = 0.01


async def race_disconnect(submit: Coroutine[Any, Any, T], disconnected: DisconnectWatcher | None,
                          name: str, watch_after_s: float = WATCH_AFTER_S) -> T:
    """Await the batcher; if the client goes away first, cancel (drop from the queue) and raise Cancelled.

    The batcher runs in this task (no extra task and no `asyncio.wait` per request). The watcher starts only
    once the request has waited `watch_after_s` (a timer until then: a request answered sooner costs no task);
    when the client disconnects, it cancels this task, and the CancelledError is turned into Cancelled here.
    """
    if disconnected is None:
        return await submit
    current = asyncio.current_task()
    if current is None:
        raise RuntimeError("race_disconnect must run inside a task")
    gone = finished = False
    watcher: asyncio.Future[None] | None = None

    def on_watcher_done(done: asyncio.Future[None]) -> None:
        nonlocal gone
        if done.cancelled():
            return
        done.exception()  # retrieved: a receive() that failed means the connection is gone too
        if finished:
            return
        gone = True
        current.cancel()

    def start_watching() -> None:
        nonlocal watcher
        if finished:
            return
        watcher = asyncio.ensure_future(disconnected())
        watcher.add_done_callback(on_watcher_done)

    timer = asyncio.get_running_loop().call_later(watch_after_s, start_watching)
    try:
        return await submit
    except asyncio.CancelledError:
        if not gone:
            raise
        current.uncancel()
        raise Cancelled(f"client disconnected; request to '{name}' dropped") from None
    finally:
        finished = True
        timer.cancel()
        if watcher is not None:
            watcher.cancel()
