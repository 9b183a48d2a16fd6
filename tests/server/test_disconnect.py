"""race_disconnect: the watcher starts only for a request still waiting after `watch_after_s`, and then a client
that left cancels the wait (Cancelled); a request answered sooner never starts one."""

from __future__ import annotations

import asyncio

import pytest

from headroom.core.errors import Cancelled
from headroom.server.disconnect import race_disconnect
from tests.support.waiting import until


class Watcher:
    """A disconnect watcher that counts its starts and resolves when `leave()` is called."""

    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0
        self._gone = asyncio.Event()

    def leave(self) -> None:
        self._gone.set()

    async def __call__(self) -> None:
        self.started += 1
        try:
            await self._gone.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


async def test_a_request_answered_before_the_watch_starts_never_starts_a_watcher() -> None:
    watcher = Watcher()
    answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(answer.set_result, 7)

    async def submit() -> int:
        return await answer

    assert await race_disconnect(submit(), watcher, "m", watch_after_s=3600.0) == 7
    assert watcher.started == 0


async def test_a_waiting_request_is_watched_and_a_client_that_left_cancels_it() -> None:
    watcher = Watcher()
    watcher.leave()  # the client is already gone when the watch starts: the next receive() says so at once
    reached_batcher = asyncio.Event()
    dropped = asyncio.Event()

    async def submit() -> int:
        reached_batcher.set()
        try:
            await asyncio.Event().wait()  # queued behind a busy model, never answered
        except asyncio.CancelledError:
            dropped.set()  # the batcher removes the entry from its queue here
            raise
        return 0

    with pytest.raises(Cancelled, match="client disconnected; request to 'm' dropped"):
        await race_disconnect(submit(), watcher, "m", watch_after_s=0.0)
    assert reached_batcher.is_set() and dropped.is_set() and watcher.started == 1
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0  # the task is not left cancelled


async def test_a_started_watcher_is_cancelled_when_the_answer_comes_first() -> None:
    watcher = Watcher()
    answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def submit() -> int:
        return await answer

    task = asyncio.create_task(race_disconnect(submit(), watcher, "m", watch_after_s=0.0))
    await until(lambda: watcher.started == 1, "the watch to start")
    answer.set_result(3)
    assert await task == 3
    await until(lambda: watcher.cancelled == 1, "the watcher to be cancelled")
    watcher.leave()  # a disconnect after the answer changes nothing
    await asyncio.sleep(0)
    assert not task.cancelled()


async def test_an_outer_cancel_before_the_watch_propagates_and_no_watcher_starts() -> None:
    watcher = Watcher()
    entered = asyncio.Event()

    async def submit() -> int:
        entered.set()
        await asyncio.Event().wait()
        return 0

    task = asyncio.create_task(race_disconnect(submit(), watcher, "m", watch_after_s=3600.0))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert watcher.started == 0
