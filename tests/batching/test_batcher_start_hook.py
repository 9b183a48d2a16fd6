"""`Batcher.submit(on_start=...)`: called once when the request's batch starts executing, never for a request
that leaves the queue without running (what tied requests' start notices rely on, headroom.server.tied)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from headroom.batching.batcher import Batcher, BatcherConfig
from headroom.batching.policy import BatchPolicyConfig
from headroom.core.clock import MonotonicClock
from headroom.core.errors import DeadlineExceeded
from tests.batching.test_batcher import Doubler, executing
from tests.support.waiting import until


def _one_at_a_time(model: Doubler) -> Batcher:
    cfg = BatchPolicyConfig(max_batch_size=1, max_queue_delay_s=0.0)
    return Batcher(model, BatcherConfig(policy=cfg), MonotonicClock(), name="doubler")


async def _submit(b: Batcher, value: float, started: list[float], timeout_s: float = 5.0) -> float:
    res = await b.submit({"x": np.array([[value]], dtype=np.float32)}, {},
                         deadline_s=MonotonicClock().now_s() + timeout_s, on_start=lambda: started.append(value))
    return float(np.asarray(res.outputs["y"])[0, 0])


async def test_the_hook_fires_when_the_batch_starts_not_while_queued() -> None:
    model = Doubler()
    model.gate.clear()
    b = _one_at_a_time(model)
    b.start()
    started: list[float] = []
    try:
        first = asyncio.create_task(_submit(b, 1.0, started))
        await executing(model)
        assert started == [1.0]  # before predict: the batch has started
        second = asyncio.create_task(_submit(b, 2.0, started))
        await until(lambda: b.queue_depth == 1, "the second request queued")
        assert started == [1.0]  # queued behind the busy instance: not started
        model.entered.clear()
        model.gate.set()
        assert await first == 2.0 and await second == 4.0
    finally:
        await b.stop()
    assert started == [1.0, 2.0]


async def test_no_hook_for_a_request_cancelled_or_expired_in_the_queue() -> None:
    model = Doubler()
    model.gate.clear()
    b = _one_at_a_time(model)
    b.start()
    started: list[float] = []
    try:
        blocker = asyncio.create_task(_submit(b, 1.0, started))
        await executing(model)
        gone = asyncio.create_task(_submit(b, 42.0, started))
        await until(lambda: b.queue_depth == 1, "the request queued")
        gone.cancel()
        await until(lambda: b.queue_depth == 0, "the cancelled request to leave the queue")
        with pytest.raises(DeadlineExceeded):
            await _submit(b, 99.0, started, timeout_s=0.05)
        model.gate.set()
        await blocker
    finally:
        await b.stop()
    assert started == [1.0]


async def test_a_failing_hook_neither_fails_its_request_nor_the_batcher() -> None:
    model = Doubler()
    b = _one_at_a_time(model)
    b.start()

    def boom() -> None:
        raise RuntimeError("hook failed")

    try:
        res = await b.submit({"x": np.array([[3.0]], dtype=np.float32)}, {},
                             deadline_s=MonotonicClock().now_s() + 5.0, on_start=boom)
        assert float(np.asarray(res.outputs["y"])[0, 0]) == 6.0
        assert await _submit(b, 4.0, []) == 8.0
    finally:
        await b.stop()
    assert b.alive
