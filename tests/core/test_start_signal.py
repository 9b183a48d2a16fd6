"""The start hook's ContextVar: bound per task, taken once, a failing hook contained."""

from __future__ import annotations

import asyncio
import logging

import pytest

from headroom.core import start_signal


async def test_take_returns_the_bound_hook_once_and_only_in_its_task() -> None:
    calls: list[str] = []
    assert start_signal.take() is None

    async def request(name: str) -> tuple[bool, bool]:
        token = start_signal.bind(lambda: calls.append(name))
        try:
            await asyncio.sleep(0)  # another request's task runs meanwhile
            hook = start_signal.take()
            start_signal.fire(hook)
            return hook is not None, start_signal.take() is None
        finally:
            start_signal.reset(token)

    assert await asyncio.gather(request("a"), request("b")) == [(True, True), (True, True)]
    assert sorted(calls) == ["a", "b"]
    assert start_signal.take() is None  # nothing leaked into the caller's context


def test_fire_contains_a_failing_hook(caplog: pytest.LogCaptureFixture) -> None:
    def boom() -> None:
        raise RuntimeError("notice failed")

    with caplog.at_level(logging.ERROR):
        start_signal.fire(boom)
        start_signal.fire(None)
    assert "start hook failed" in caplog.text
