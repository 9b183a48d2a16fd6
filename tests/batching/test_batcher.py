"""The asyncio batcher around the policy, with a fake model (no weights) and the real clock.

No test sleeps for a guessed time: the model signals when a batch entered it (`entered`), and queue states
are awaited with a bounded poll (`tests.support.waiting.until`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from headroom.batching.batcher import Batcher, BatcherConfig
from headroom.batching.policy import BatchPolicyConfig
from headroom.batching.queue import BatchResult
from headroom.core.clock import FakeClock, MonotonicClock
from headroom.core.errors import DeadlineExceeded, HeadroomError, Overloaded
from headroom.models.base import Model
from headroom.models.config import ModelConfig, TensorSpec
from tests.support.waiting import until


class Doubler(Model):
    """Doubles its input; can be held on a gate to build up a queue; records every batch it saw."""

    def __init__(self) -> None:
        super().__init__(ModelConfig(name="doubler", backend="python",
                                     inputs=(TensorSpec("x", "FP32", (1,)),),
                                     outputs=(TensorSpec("y", "FP32", (1,)),), max_batch_size=8))
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # set when a batch reaches predict (before the gate)
        self.batches: list[list[float]] = []
        self.fail = False

    def predict(self, batch: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        self.entered.set()
        self.gate.wait(timeout=30)
        self.batches.append([float(v) for v in batch["x"].ravel()])
        if self.fail:
            raise RuntimeError("boom")
        return {"y": batch["x"] * 2}


def make(model: Doubler, **policy: object) -> Batcher:
    cfg = BatchPolicyConfig(**{"max_batch_size": 8, "max_queue_delay_s": 0.05, **policy})  # type: ignore[arg-type]
    return Batcher(model, BatcherConfig(policy=cfg, max_queue_size=64), MonotonicClock(), name="doubler")


async def executing(model: Doubler) -> None:
    """Wait until the model holds a batch (blocked on its gate)."""
    await until(model.entered.is_set, "a batch to reach the model")


async def submit(b: Batcher, value: float, timeout_s: float = 5.0, priority: int = 1) -> np.ndarray:
    res = await b.submit({"x": np.array([[value]], dtype=np.float32)}, {},
                         deadline_s=MonotonicClock().now_s() + timeout_s, priority=priority)
    return np.asarray(res.outputs["y"])


async def test_concurrent_requests_form_one_batch_and_get_their_own_results() -> None:
    model = Doubler()
    b = make(model)
    b.start()
    try:
        outs = await asyncio.gather(*(submit(b, float(i)) for i in range(6)))
    finally:
        await b.stop()
    assert [float(o[0, 0]) for o in outs] == [0, 2, 4, 6, 8, 10]
    assert len(model.batches) == 1 and sorted(model.batches[0]) == [0, 1, 2, 3, 4, 5]


async def test_requests_queue_behind_a_busy_instance_and_batch_up() -> None:
    model = Doubler()
    model.gate.clear()
    b = make(model, max_queue_delay_s=0.0)
    b.start()
    try:
        first = asyncio.create_task(submit(b, 1.0))
        await executing(model)  # the first batch is now executing and blocked on the gate
        rest = [asyncio.create_task(submit(b, float(i))) for i in range(2, 6)]
        await until(lambda: b.queue_depth == 4, "4 requests queued")
        model.gate.set()
        await asyncio.gather(first, *rest)
    finally:
        await b.stop()
    assert model.batches[0] == [1.0]
    assert sorted(model.batches[1]) == [2.0, 3.0, 4.0, 5.0]


async def test_full_queue_rejects_immediately_with_retry_after() -> None:
    model = Doubler()
    model.gate.clear()
    cfg = BatchPolicyConfig(max_batch_size=1, max_queue_delay_s=0.0)
    b = Batcher(model, BatcherConfig(policy=cfg, max_queue_size=2), MonotonicClock(), name="doubler")
    b.start()
    try:
        held = [asyncio.create_task(submit(b, 1.0)), asyncio.create_task(submit(b, 2.0))]
        await executing(model)
        await until(lambda: b.queue_depth == 1, "the second request queued")
        with pytest.raises(Overloaded) as info:
            await submit(b, 3.0)
        assert info.value.retry_after_s and info.value.http_status == 503
        model.gate.set()
        await asyncio.gather(*held)
    finally:
        await b.stop()


async def test_deadline_passing_in_the_queue_gives_504_and_the_model_never_sees_it() -> None:
    model = Doubler()
    model.gate.clear()
    cfg = BatchPolicyConfig(max_batch_size=1, max_queue_delay_s=0.0)
    b = Batcher(model, BatcherConfig(policy=cfg), MonotonicClock(), name="doubler")
    b.start()
    try:
        blocker = asyncio.create_task(submit(b, 1.0))
        await executing(model)
        with pytest.raises(DeadlineExceeded):
            await submit(b, 99.0, timeout_s=0.05)
        model.gate.set()
        await blocker
    finally:
        await b.stop()
    assert all(99.0 not in batch for batch in model.batches)


async def test_cancelled_request_is_dropped_from_the_queue() -> None:
    model = Doubler()
    model.gate.clear()
    cfg = BatchPolicyConfig(max_batch_size=1, max_queue_delay_s=0.0)
    b = Batcher(model, BatcherConfig(policy=cfg), MonotonicClock(), name="doubler")
    b.start()
    try:
        blocker = asyncio.create_task(submit(b, 1.0))
        await executing(model)
        gone = asyncio.create_task(submit(b, 42.0))
        await until(lambda: b.queue_depth == 1, "the request queued")
        gone.cancel()
        await until(lambda: b.queue_depth == 0, "the cancelled request to leave the queue")
        model.gate.set()
        await blocker
    finally:
        await b.stop()
    assert all(42.0 not in batch for batch in model.batches)
    assert b.admitted == 0


async def test_model_failure_becomes_an_error_for_each_request_and_the_batcher_survives() -> None:
    model = Doubler()
    model.fail = True
    b = make(model)
    b.start()
    try:
        results = await asyncio.gather(submit(b, 1.0), submit(b, 2.0), return_exceptions=True)
        assert all(isinstance(r, HeadroomError) and r.http_status == 500 for r in results)
        model.fail = False
        assert float((await submit(b, 3.0))[0, 0]) == 6.0
    finally:
        await b.stop()


def _sizes(batches: Sequence[list[float]]) -> list[int]:
    return [len(x) for x in batches]


async def test_priority_one_jumps_the_queue() -> None:
    model = Doubler()
    model.gate.clear()
    cfg = BatchPolicyConfig(max_batch_size=1, max_queue_delay_s=0.0)
    b = Batcher(model, BatcherConfig(policy=cfg), MonotonicClock(), name="doubler")
    b.start()
    try:
        tasks = [asyncio.create_task(submit(b, 1.0, priority=2))]
        await executing(model)
        tasks += [asyncio.create_task(submit(b, 2.0, priority=2))]
        await until(lambda: b.queue_depth == 1, "the priority-2 request queued")
        tasks += [asyncio.create_task(submit(b, 3.0, priority=1))]
        await until(lambda: b.queue_depth == 2, "the priority-1 request queued")
        model.gate.set()
        await asyncio.gather(*tasks)
    finally:
        await b.stop()
    assert model.batches == [[1.0], [3.0], [2.0]]
    assert _sizes(model.batches) == [1, 1, 1]


class ThreadRecordingDoubler(Doubler):
    """A Doubler that notes which thread ran each preprocess call."""

    def __init__(self, cheap: bool) -> None:
        super().__init__()
        self.cheap_preprocess = cheap
        self.preprocess_threads: list[int] = []

    def preprocess(self, inputs: Mapping[str, np.ndarray],
                   parameters: Mapping[str, object]) -> Mapping[str, np.ndarray]:
        self.preprocess_threads.append(threading.get_ident())
        return inputs


@pytest.mark.parametrize("cheap", [True, False])
async def test_cheap_preprocess_runs_on_the_event_loop_other_preprocess_in_a_worker(cheap: bool) -> None:
    model = ThreadRecordingDoubler(cheap)
    b = make(model)
    b.start()
    try:
        outs = await asyncio.gather(*(submit(b, float(i)) for i in range(3)))
    finally:
        await b.stop()
    assert [float(o[0, 0]) for o in outs] == [0, 2, 4]
    on_loop = [t == threading.get_ident() for t in model.preprocess_threads]
    assert on_loop == [cheap] * 3


async def test_admission_by_predicted_delay_starts_from_the_warm_estimate() -> None:
    """On a fake clock: warmup's batches (1 item: 15 ms, 8 items: 50 ms) give 10 ms + 5 ms per item; 9
    requests held (a batch of 8 running, 1 queued) predict 2 x 10 + 10 x 5 = 70 ms for a tenth at the mean,
    105 ms at the delay calibration's starting factor (1.5); a budget under that is refused with the backlog's
    drain time, 65 ms."""
    model = Doubler()
    model.gate.clear()
    clock = FakeClock(100.0)
    cfg = BatchPolicyConfig(max_batch_size=8, max_queue_delay_s=0.0)
    b = Batcher(model, BatcherConfig(policy=cfg, max_queue_size=64, warmup_batches=((1, 0.015), (8, 0.05))),
                clock, name="doubler")
    assert b.service_time_s > 0
    b.start()

    def request(value: float, budget_s: float) -> Coroutine[Any, Any, BatchResult]:
        return b.submit({"x": np.array([[value]], dtype=np.float32)}, {}, deadline_s=clock.now_s() + 60,
                        budget_s=budget_s)

    try:
        b.check_admission(0.001)  # nothing ahead: admitted although its own batch takes longer
        held = [asyncio.create_task(request(float(i), 1.0)) for i in range(9)]
        for _ in range(1000):
            if b.admitted == 9:
                break
            await asyncio.sleep(0)
        assert b.admitted == 9
        b.check_admission(0.106)
        with pytest.raises(Overloaded, match=r"9 requests ahead \(batches of up to 8 at 10\.0 ms \+ 5\.00 ms per item, "
                                             r"x1\.50 for the tail of measured delays\) predict 105 ms") as info:
            b.check_admission(0.104)
        assert info.value.http_status == 503 and info.value.retry_after_s == pytest.approx(0.065)
        with pytest.raises(Overloaded, match="latency budget of 50 ms"):
            await request(99.0, 0.05)
        assert b.admitted == 9  # the refused request was never admitted
        model.gate.set()
        await asyncio.gather(*held)
    finally:
        await b.stop()
    assert all(99.0 not in batch for batch in model.batches)


async def test_a_loop_that_dies_fails_its_queue_refuses_new_work_and_reports_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from headroom.batching import batcher as batcher_module

    def broken(*args: object) -> None:
        raise RuntimeError("policy bug")

    monkeypatch.setattr(batcher_module, "decide", broken)
    died: list[BaseException] = []
    cfg = BatchPolicyConfig(max_batch_size=8, max_queue_delay_s=0.05)
    b = Batcher(Doubler(), BatcherConfig(policy=cfg), MonotonicClock(), name="doubler", on_fatal=died.append)
    b.start()
    try:
        assert b.alive
        with pytest.raises(HeadroomError, match="batcher failed: policy bug"):
            await asyncio.wait_for(submit(b, 1.0), 5)  # queued when the loop died: failed, not left hanging
        assert not b.alive and [str(e) for e in died] == ["policy bug"]
        with pytest.raises(HeadroomError, match="batcher failed"):
            await asyncio.wait_for(submit(b, 2.0), 5)  # nothing would take it from the queue: refused
        assert len(died) == 1
    finally:
        await b.stop()


class SlowOnFakeClock(Doubler):
    """Each batch takes `batch_s` of the fake clock."""

    def __init__(self, clock: FakeClock, batch_s: float) -> None:
        super().__init__()
        self.clock, self.batch_s = clock, batch_s

    def predict(self, batch: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        self.clock.advance(self.batch_s)
        return super().predict(batch)


async def test_requests_that_miss_their_budget_make_admission_more_cautious() -> None:
    """Warmup says 10 ms + 5 ms per item, but every batch takes 80 ms of the fake clock. Requests with a 50 ms
    budget finish past it, and each miss raises the delay calibration 5%, until the service-time fit has learnt
    the 80 ms batches: from then on the fit alone predicts past 50 ms, so their misses say nothing about the
    factor. Requests without a budget, or with budget to spare, move nothing. Refusals predict at the factor."""
    clock = FakeClock(100.0)
    model = SlowOnFakeClock(clock, 0.08)
    cfg = BatchPolicyConfig(max_batch_size=8, max_queue_delay_s=0.0)
    b = Batcher(model, BatcherConfig(policy=cfg, max_queue_size=64, warmup_batches=((1, 0.015), (8, 0.05))),
                clock, name="doubler")
    b.start()

    def request(value: float, budget_s: float | None) -> Coroutine[Any, Any, BatchResult]:
        return b.submit({"x": np.array([[value]], dtype=np.float32)}, {}, deadline_s=clock.now_s() + 60,
                        budget_s=budget_s)

    try:
        for i in range(10):
            await request(float(i), 0.05)
        raised = b.delay_factor
        assert any(raised == pytest.approx(1.5 * 1.05 ** k) for k in range(2, 10)), raised
        await request(10.0, None)
        await request(11.0, 1.0)
        assert b.delay_factor == raised
        model.gate.clear()
        held = [asyncio.create_task(request(float(i), None)) for i in range(9)]
        await until(lambda: b.admitted == 9, "9 requests admitted")
        with pytest.raises(Overloaded, match=r"for the tail of measured delays") as info:
            b.check_admission(0.5)
        assert f"x{raised:.2f} for the tail" in str(info.value)
        model.gate.set()
        await asyncio.gather(*held)
    finally:
        model.gate.set()
        await b.stop()


@pytest.mark.parametrize("ratio", [4.0, 0.0])
async def test_refusals_are_held_once_they_far_outnumber_admissions_unless_pacing_is_off(ratio: float) -> None:
    """On a fake clock: one request admitted and held in the model, the queue full (1). The first refusals are
    answered at once; past `ratio` x max(1 admission/s, 1/s) refusals in the second they carry a hold (at most
    1 s) and say why. With pacing off (ratio 0) none ever does."""
    model = Doubler()
    model.gate.clear()
    clock = FakeClock(50.0)
    cfg = BatcherConfig(policy=BatchPolicyConfig(max_batch_size=1, max_queue_delay_s=0.0), max_queue_size=1,
                        refusal_pacing_ratio=ratio)
    b = Batcher(model, cfg, clock, name="doubler")
    b.start()
    try:
        held = asyncio.create_task(b.submit({"x": np.array([[1.0]], dtype=np.float32)}, {},
                                            deadline_s=clock.now_s() + 60))
        await executing(model)
        holds = []
        for _ in range(12):
            with pytest.raises(Overloaded, match="queue is full") as info:
                b.check_admission(None)
            holds.append(info.value.hold_s)
            assert ("answered after" in info.value.message) == (info.value.hold_s > 0)
        if ratio:
            assert holds[:4] == [0.0] * 4 and all(0.01 <= h <= 1.0 for h in holds[4:])
        else:
            assert holds == [0.0] * 12
        model.gate.set()
        await held
    finally:
        await b.stop()
