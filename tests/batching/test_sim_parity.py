"""The server's batcher and the simulator run the same policy on the same estimators: driven with one arrival
trace on a fake clock, with batches that take the profile's service time, they close the same batches at the
same times with the same windows.

The server side is the real `Batcher` (event loop, executor thread, futures) on a `FakeClock`. The test is the
discrete-event driver: it moves the clock to the next event (an arrival, the running batch's end, or the
policy's wake-up), lets the batcher react, and waits (polling with a bounded limit) until it has.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pytest

from headroom.batching import batcher as batcher_module
from headroom.batching.batcher import Batcher, BatcherConfig
from headroom.batching.policy import BatchDecision, BatchPolicyConfig, QueueSnapshot, decide
from headroom.batching.queue import BatchResult
from headroom.core.clock import FakeClock
from headroom.loadgen.arrivals import poisson
from headroom.models.base import Model
from headroom.models.config import ModelConfig, TensorSpec
from headroom.sim import engine as sim_engine
from headroom.sim.config import SimConfig
from headroom.sim.engine import simulate
from headroom.sim.profile import ServiceProfile

PROFILE = ServiceProfile.linear(fixed_s=0.004, per_item_s=0.001, max_batch_size=8)
_LIMIT_S = 30.0  # bounded wait for the batcher to react (generous: shared, slow machines)


@dataclass(frozen=True)
class Taken:
    now_s: float
    size: int
    window_s: float


class Held(Model):
    """Each batch waits in its executor thread until the driver has moved the clock to the batch's end."""

    cheap_preprocess = True

    def __init__(self) -> None:
        super().__init__(ModelConfig(name="held", backend="python", inputs=(TensorSpec("x", "FP32", (1,)),),
                                     outputs=(TensorSpec("y", "FP32", (1,)),), max_batch_size=8))
        self.entered = 0  # batches whose predict started
        self.release = threading.Semaphore(0)

    def predict(self, batch: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        self.entered += 1
        if not self.release.acquire(timeout=_LIMIT_S):
            raise RuntimeError("the driver never released the batch")
        return {"y": batch["x"]}


def recording(decisions: list[tuple[float, int, BatchDecision]],
              decide: Callable[[QueueSnapshot, float, BatchPolicyConfig], BatchDecision],
              ) -> Callable[[QueueSnapshot, float, BatchPolicyConfig], BatchDecision]:
    def wrapper(snapshot: QueueSnapshot, now_s: float, cfg: BatchPolicyConfig) -> BatchDecision:
        d = decide(snapshot, now_s, cfg)
        decisions.append((now_s, len(snapshot.items), d))
        return d
    return wrapper


def taken(decisions: list[tuple[float, int, BatchDecision]]) -> list[Taken]:
    return [Taken(now, len(d.take), d.window_s) for now, _, d in decisions if d.take]


async def until(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    give_up = loop.time() + _LIMIT_S
    while not condition():
        if loop.time() > give_up:
            raise AssertionError(f"the batcher did not {what} within {_LIMIT_S} s")
        await asyncio.sleep(0.0005)


async def serve(trace: list[float], policy: BatchPolicyConfig, monkeypatch: pytest.MonkeyPatch) -> list[Taken]:
    decisions: list[tuple[float, int, BatchDecision]] = []
    monkeypatch.setattr(batcher_module, "decide", recording(decisions, decide))
    clock = FakeClock(0.0)
    model = Held()
    b = Batcher(model, BatcherConfig(policy=policy, max_queue_size=1024), clock, name="held")
    b.start()
    requests: list[asyncio.Task[BatchResult]] = []
    running_end_s: float | None = None  # when the executing batch finishes (one instance)
    arrived = 0

    def taken_items() -> int:
        return sum(len(d.take) for _, _, d in decisions)

    async def settle(now_s: float, queued: int | None) -> None:
        """Wait until the batcher decided at `now_s` on a queue of `queued` requests (None: it will not
        decide), and every batch it took has started executing."""
        if queued is not None:
            await until(lambda: any(t == now_s and n == queued for t, n, _ in decisions), f"decide at {now_s}")
        await until(lambda: model.entered == len(taken(decisions)), "start the batches it took")
        await until(lambda: b.queue_depth + taken_items() == arrived, "queue the arrivals")

    try:
        while arrived < len(trace) or running_end_s is not None or b.queue_depth:
            wake_s = None
            if running_end_s is None and b.queue_depth and decisions and not decisions[-1][2].take:
                wake_s = decisions[-1][2].wake_at_s
            events = [t for t in (running_end_s, wake_s) if t is not None]
            next_arrival_s = trace[arrived] if arrived < len(trace) else None
            t_next = min(events, default=None)
            if t_next is not None and (next_arrival_s is None or t_next <= next_arrival_s):
                clock.set(t_next)
                if t_next == running_end_s:  # the batch ends: its requests are answered, the loop looks again
                    running_end_s = None
                    answered = sum(r.done() for r in requests) + taken(decisions)[-1].size
                    waiting = b.queue_depth  # unchanged until the loop looks again
                    model.release.release()
                    await until(lambda a=answered: sum(r.done() for r in requests) == a,  # type: ignore[misc]
                                "answer the batch")
                    await settle(t_next, waiting or None)
                else:
                    await settle(t_next, b.queue_depth)
            else:
                assert next_arrival_s is not None
                clock.set(next_arrival_s)
                busy = running_end_s is not None
                queued = b.queue_depth + 1
                arrived += 1
                requests.append(asyncio.create_task(b.submit({"x": np.zeros((1, 1), np.float32)}, {},
                                                             deadline_s=1e9)))
                await settle(next_arrival_s, None if busy else queued)
            if running_end_s is None and model.entered > 0 and len(taken(decisions)) == model.entered \
                    and sum(r.done() for r in requests) < taken_items():
                last = taken(decisions)[-1]
                running_end_s = last.now_s + PROFILE.mean_service_s(last.size)
        await asyncio.gather(*requests)
    finally:
        await b.stop()
    return taken(decisions)


def simulated(trace: list[float], policy: BatchPolicyConfig, monkeypatch: pytest.MonkeyPatch) -> list[Taken]:
    decisions: list[tuple[float, int, BatchDecision]] = []
    monkeypatch.setattr(sim_engine, "batch_decide", recording(decisions, decide))
    simulate(SimConfig(batching=policy.mode, policy=policy), PROFILE, np.asarray(trace, dtype=np.float64))
    return taken(decisions)


@pytest.mark.parametrize("policy", [
    BatchPolicyConfig(mode="adaptive", max_batch_size=8, slo_s=0.05, fixed_overhead_s=0.001, target_batch_size=6),
    BatchPolicyConfig(mode="dynamic", max_batch_size=8, max_queue_delay_s=0.003),
], ids=["adaptive", "dynamic"])
async def test_server_batcher_and_simulator_close_the_same_batches(policy: BatchPolicyConfig,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    # a burst, a quiet gap (the rate estimate decays with time), then a slower stream
    trace = [*poisson(1500.0, 0.02, rng).tolist(), *(0.3 + poisson(200.0, 0.1, rng)).tolist()]
    assert len(trace) > 30
    server = await serve(trace, policy, monkeypatch)
    sim = simulated(trace, policy, monkeypatch)
    assert sum(t.size for t in server) == len(trace) == sum(t.size for t in sim)
    assert len({t.size for t in server}) > 1  # the trace makes batches of several sizes
    assert [t.size for t in server] == [t.size for t in sim]
    assert [t.now_s for t in server] == pytest.approx([t.now_s for t in sim], abs=1e-9)
    assert [t.window_s for t in server] == pytest.approx([t.window_s for t in sim], abs=1e-9)
    if policy.mode == "adaptive":
        assert len({round(t.window_s, 9) for t in server}) > 2  # the windows followed the estimates
