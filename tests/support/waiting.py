"""Waiting for a condition in a test without sleeping for a guessed time: poll it, yielding to the event loop,
until it holds or a generous bound passes (then fail, saying what was awaited)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Return as soon as `condition()` holds; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.001)


async def until_async(condition: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 30.0) -> None:
    """`until` for a condition that must await (a query to a server): polled every 10 ms."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)


def until_sync(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """`until` for a thread without an event loop (a test driving a server process): polled every 10 ms."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)
