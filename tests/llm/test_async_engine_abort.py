"""AsyncLLMEngine: a stream closed while a step runs (a client that disconnected) is aborted at that step's end:
the next step no longer carries it, and the gauges show it gone before that next step starts. When every request
of the step in flight is closed, that step is cancelled (the runner sees the flag) and the blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from headroom.core.clock import FakeClock
from headroom.llm.async_engine import AsyncLLMEngine
from headroom.llm.config import EngineConfig
from headroom.llm.engine import LLMEngine
from headroom.llm.request import SamplingParams
from headroom.llm.step_batch import ModelBatch
from headroom.llm.step_cancel import StepCancelled
from tests.support.waiting import until

LONG = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
WAIT_S = 30.0  # generous bound for a thread handshake on a loaded machine


class Gauges:
    """An EngineObserver keeping every (running, waiting, kv usage) it is handed, with the step count then."""

    def __init__(self, steps: Callable[[], int]) -> None:
        self.steps = steps
        self.seen: list[tuple[int, int, int, float]] = []  # (steps so far, running, waiting, kv usage)

    def on_step(self, stats: Any) -> None:
        self.on_gauges(stats.num_running, stats.num_waiting, stats.kv_cache_usage)

    def on_token(self, req: Any, now_s: float, first: bool) -> None:
        pass

    def on_finish(self, req: Any, now_s: float) -> None:
        pass


    def on_rejected(self, reason: str) -> None:

        pass

    def on_gauges(self, num_running: int, num_waiting: int, kv_cache_usage: float) -> None:
        self.seen.append((self.steps(), num_running, num_waiting, kv_cache_usage))


async def _second_joins(async_engine: AsyncLLMEngine, queued: threading.Event, first: tuple[str, list[int]],
                        second: tuple[str, list[int]]) -> tuple[Any, Any]:
    """Start ``first``, then queue ``second`` and set ``queued``: the gated runner holds every step that carries the
    first request alone until then, so the first cannot finish all its tokens before the second joins it (on a
    loaded machine the fake runner's 200 steps can outrun the event loop)."""
    one = await async_engine.generate(first[0], first[1], LONG)
    joining = asyncio.create_task(async_engine.generate(second[0], second[1], LONG))
    await asyncio.sleep(0)  # the task runs first (FIFO) up to its admission wait: its request is queued now
    queued.set()
    return one, await joining


def _hold_until_joined(batch: ModelBatch, queued: threading.Event) -> None:
    """A step of one request waits (on the step thread) until the second request has been queued."""
    if len(batch.items) == 1 and not queued.is_set():
        queued.wait(WAIT_S)


def _started(runner: Any) -> tuple[LLMEngine, AsyncLLMEngine, Gauges]:
    """An engine over the (gated) fake runner, recording its gauges, with its step thread started."""
    gauges = Gauges(lambda: len(runner.batches))
    engine = LLMEngine(runner, EngineConfig(block_size_tokens=4), max_model_len=256, clock=FakeClock(),
                       observer=gauges)
    async_engine = AsyncLLMEngine(engine)
    async_engine.start()
    return engine, async_engine, gauges


async def test_a_stream_closed_during_a_step_is_aborted_at_that_steps_end(fake_runner: Callable[..., Any]) -> None:
    runner = fake_runner(64, vocab_size=50)
    execute = runner.execute
    entered, release, progressed = threading.Event(), threading.Event(), threading.Event()
    queued = threading.Event()
    steps_after: list[int] = []  # set to the step count to wait for

    def gated(batch: ModelBatch) -> np.ndarray:
        _hold_until_joined(batch, queued)
        # hold the first step that runs both requests: the step in flight when the client goes away
        if not entered.is_set() and {it.request_id for it in batch.items} >= {"gone", "stays"}:
            entered.set()
            release.wait(WAIT_S)
        out: np.ndarray = execute(batch)
        if steps_after and len(runner.batches) >= steps_after[0]:
            progressed.set()
        return out

    runner.execute = gated
    engine, async_engine, gauges = _started(runner)
    stays = None
    try:
        gone, stays = await _second_joins(async_engine, queued, ("gone", [1, 2, 3]), ("stays", [4, 5, 6]))
        assert await asyncio.to_thread(entered.wait, WAIT_S)
        held_step = len(runner.batches)  # the held step has not called the fake's execute yet
        await gone.aclose()  # the client left mid-step: the abort is queued
        steps_after.append(held_step + 4)
        release.set()
        assert await asyncio.to_thread(progressed.wait, WAIT_S)  # the survivor went on for 3 more steps
        later = runner.batches[held_step + 1 :]
        assert later and all(it.request_id != "gone" for b in later for it in b.items)
        assert any(it.request_id == "gone" for it in runner.batches[held_step].items)  # it was in the held step
        # the abort's gauges were published before any step after the held one ran
        first_alone = next(s for s in gauges.seen if s[0] > held_step and s[1] == 1)
        assert first_alone[0] == held_step + 1, gauges.seen
    finally:
        release.set()
        if stays is not None:
            await stays.aclose()
        await async_engine.stop()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


async def test_a_step_whose_requests_were_all_closed_is_cancelled(fake_runner: Callable[..., Any]) -> None:
    """The flag that the native step reads between layers is set only once the last request of the step in flight
    is closed; the runner then stops early (this fake checks the flag where the C step would), the step's outputs
    are dropped, and both requests' blocks are freed with the gauges at zero, without another step."""
    runner = fake_runner(64, vocab_size=50)
    execute = runner.execute
    entered, release, queued = threading.Event(), threading.Event(), threading.Event()

    def cancellable(batch: ModelBatch) -> np.ndarray:
        _hold_until_joined(batch, queued)
        if not entered.is_set() and {it.request_id for it in batch.items} >= {"a", "b"}:
            entered.set()
            release.wait(WAIT_S)
            if ctypes.c_int.from_address(batch.cancel_flag_address).value:
                raise StepCancelled("cancelled between layers")
        out: np.ndarray = execute(batch)
        return out

    runner.execute = cancellable
    engine, async_engine, gauges = _started(runner)
    try:
        a, b = await _second_joins(async_engine, queued, ("a", [1, 2, 3]), ("b", [4, 5, 6, 7, 8]))
        assert await asyncio.to_thread(entered.wait, WAIT_S)
        held_step = len(runner.batches)
        await a.aclose()
        assert not engine.cancel.requested  # "b" still wants this step
        await b.aclose()
        assert engine.cancel.requested  # nobody does any more
        release.set()
        await until(async_engine.idle, "the aborts to be handled")
        await until(lambda: bool(gauges.seen) and gauges.seen[-1][1:] == (0, 0, 0.0), "idle gauges")
        assert engine.cancel.steps_cancelled == 1
        assert len(runner.batches) == held_step  # the cancelled step produced nothing and no step followed
        assert engine.kv.num_free_blocks == engine.kv.num_blocks
        assert not engine.cancel.requested
        c = await async_engine.generate("c", [9, 10], SamplingParams(temperature=0.0, max_tokens=3))
        assert len([out async for out in c]) == 3  # the engine goes on
    finally:
        release.set()
        await async_engine.stop()
    assert engine.cancel.steps_cancelled == 1
