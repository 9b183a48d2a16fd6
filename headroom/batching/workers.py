"""Worker threads for the batcher: a call goes in on a queue and its result comes back to the event loop.

`ThreadPoolExecutor` + `loop.run_in_executor` costs, per call, a `concurrent.futures.Future` (a condition
lock taken by the worker to set it, and again by its callbacks), the executor's shutdown lock and idle
semaphore, and `asyncio.wrap_future`'s chaining on the loop. Here a call is one `SimpleQueue.put` (C) on the
loop, and one `call_soon_threadsafe` back from the worker that resolves the loop's own future: the loop and
the worker share no other lock than the queue's.

The threads start together on first use; they are daemons, and `shutdown` stops them after the calls already
queued (whose futures are then resolved as usual, or dropped with the loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, TypeVar

from headroom.core.compute_priority import lower_current_thread

T = TypeVar("T")

_Call = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


class ThreadWorkers:
    """`threads` named threads running calls submitted from an event loop, taken in submission order."""

    def __init__(self, threads: int, name: str, nice: int = 0) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self._max_threads = threads
        self._name = name
        self._calls: SimpleQueue[_Call | None] = SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._nice = nice  # each thread lowers its own priority to this first (headroom.core.compute_priority)

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run `fn(*args)` on a worker thread; the returned future (on the running loop) gets its result."""
        if self._closed:
            raise RuntimeError(f"workers '{self._name}' are shut down")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if not self._threads:
            self._start_threads()
        self._calls.put((loop, future, fn, args))
        return future

    def shutdown(self) -> None:
        """Let every thread finish the calls already queued, then end; new calls are refused."""
        self._closed = True
        for _ in self._threads:
            self._calls.put(None)

    def _start_threads(self) -> None:
        for index in range(self._max_threads):
            thread = threading.Thread(target=self._work, name=f"{self._name}_{index}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _work(self) -> None:
        lower_current_thread(self._nice)
        while True:
            call = self._calls.get()
            if call is None:
                return
            loop, future, fn, args = call
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the awaiting coroutine, as an executor does
                _deliver(loop, _set_exception, future, exc)
            else:
                _deliver(loop, _set_result, future, result)
            del call, future, fn, args  # drop the references before blocking on the next call


def _deliver(loop: asyncio.AbstractEventLoop, setter: Callable[[asyncio.Future[Any], Any], None],
             future: asyncio.Future[Any], value: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits the future any more
        loop.call_soon_threadsafe(setter, future, value)


def _set_result(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
