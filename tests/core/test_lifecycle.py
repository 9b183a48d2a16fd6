"""ServingLifecycle: admission until drain, in-flight accounting, wait_idle without polling, health, fatal."""

from __future__ import annotations

import asyncio

import pytest

from headroom.core.errors import Draining
from headroom.core.lifecycle import ServingLifecycle


class _Check:
    def __init__(self) -> None:
        self.ok = True

    def alive(self) -> bool:
        return self.ok

    def ready(self) -> bool:
        return self.ok


async def test_drain_refuses_new_requests_and_wait_idle_returns_when_the_last_one_leaves() -> None:
    lc = ServingLifecycle()
    lc.admit("a")
    lc.admit("b")
    lc.start_draining()
    with pytest.raises(Draining) as refused:
        lc.admit("c")
    assert refused.value.http_status == 503 and refused.value.reason == "draining"
    assert not lc.ready() and lc.live()
    waiter = asyncio.ensure_future(lc.wait_idle(5.0))
    lc.release()
    await asyncio.sleep(0)
    assert not waiter.done() and lc.inflight == 1
    lc.release()
    assert await asyncio.wait_for(waiter, 1.0) is True


async def test_wait_idle_gives_up_after_its_timeout() -> None:
    lc = ServingLifecycle()
    with lc.request("a"):
        assert await lc.wait_idle(0.01) is False
    assert lc.inflight == 0 and await lc.wait_idle(0.0)


def test_liveness_and_readiness_follow_every_check() -> None:
    lc = ServingLifecycle()
    engine, models = _Check(), _Check()
    lc.add_liveness_check(engine)
    lc.add_readiness_check(models)
    assert lc.live() and lc.ready()
    models.ok = False
    assert lc.live() and not lc.ready()
    models.ok, engine.ok = True, False
    assert not lc.live() and not lc.ready()  # a dead loop is never ready either


def test_report_fatal_turns_liveness_false_logs_and_tells_the_owner_once(caplog: pytest.LogCaptureFixture) -> None:
    lc = ServingLifecycle()
    told: list[str] = []
    lc.on_fatal(lambda component, exc: told.append(f"{component}: {exc}"))
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        lc.report_fatal("the engine", exc)
        lc.report_fatal("the batcher", exc)
    assert not lc.live() and told == ["the engine: boom"]
    assert "Traceback" in caplog.text and "boom" in caplog.text
