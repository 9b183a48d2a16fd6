"""The pure batching policy, driven by hand-built snapshots on a fake clock."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.batching.policy import (
    BatchPolicyConfig,
    QueuedItem,
    QueueSnapshot,
    adaptive_window_s,
    decide,
)
from headroom.core.clock import FakeClock


def items(*enqueued: float, deadline_s: float = 100.0, size: int = 1) -> tuple[QueuedItem, ...]:
    return tuple(QueuedItem(enqueued_s=t, deadline_s=deadline_s, size=size) for t in enqueued)


def test_empty_queue_never_starts_a_timer() -> None:
    d = decide(QueueSnapshot(items=()), 5.0, BatchPolicyConfig())
    assert d.take == () and d.wake_at_s is None


def test_dynamic_waits_for_the_oldest_request_delay_then_flushes() -> None:
    clock = FakeClock(10.0)
    cfg = BatchPolicyConfig(max_batch_size=8, max_queue_delay_s=0.005)
    snap = QueueSnapshot(items=items(10.0, 10.001, 10.002))
    first = decide(snap, clock.now_s(), cfg)
    assert first.take == ()
    assert first.wake_at_s == pytest.approx(10.005)  # timer started at the first queued request
    clock.advance(0.005)
    second = decide(snap, clock.now_s(), cfg)
    assert second.take == (0, 1, 2)


def test_full_batch_closes_immediately_and_caps_at_max_batch_size() -> None:
    cfg = BatchPolicyConfig(max_batch_size=4, max_queue_delay_s=1.0)
    d = decide(QueueSnapshot(items=items(*[0.0] * 6)), 0.0, cfg)
    assert d.take == (0, 1, 2, 3)


def test_request_sizes_count_toward_the_cap() -> None:
    cfg = BatchPolicyConfig(max_batch_size=8, max_queue_delay_s=1.0)
    snap = QueueSnapshot(items=items(0.0, 0.0, 0.0, size=3))
    assert decide(snap, 0.0, cfg).take == (0, 1)  # 3 + 3 fits, a third would make 9


def test_largest_formable_preferred_size_closes_early() -> None:
    cfg = BatchPolicyConfig(max_batch_size=16, max_queue_delay_s=1.0, preferred_batch_sizes=(2, 4))
    assert decide(QueueSnapshot(items=items(*[0.0] * 5)), 0.0, cfg).take == (0, 1, 2, 3)
    assert decide(QueueSnapshot(items=items(0.0)), 0.0, cfg).take == ()


def test_past_the_queue_delay_everything_pending_goes_not_a_preferred_size() -> None:
    # Triton's GetDynamicBatch: under load (20 requests queued behind a running batch, the oldest past its
    # 5 ms delay) a preferred size of 16 would leave 4 to wait a whole extra batch
    cfg = BatchPolicyConfig(max_batch_size=32, max_queue_delay_s=0.005, preferred_batch_sizes=(8, 16, 32))
    snap = QueueSnapshot(items=items(*[0.0] * 20))
    assert decide(snap, 0.004, cfg).take == tuple(range(16))  # within the delay: the preferred size
    assert decide(snap, 0.005, cfg).take == tuple(range(20))  # past it: everything pending
    assert decide(QueueSnapshot(items=items(*[0.0] * 40)), 0.010, cfg).take == tuple(range(32))  # capped


def test_expired_requests_are_reported_and_never_taken() -> None:
    cfg = BatchPolicyConfig(max_batch_size=2, max_queue_delay_s=0.0)
    snap = QueueSnapshot(items=(QueuedItem(0.0, deadline_s=1.0), QueuedItem(0.0, deadline_s=5.0)))
    d = decide(snap, 2.0, cfg)
    assert d.expire == (0,) and d.take == (1,)


def test_wake_up_at_an_earlier_deadline_than_the_window() -> None:
    cfg = BatchPolicyConfig(max_batch_size=8, max_queue_delay_s=1.0)
    d = decide(QueueSnapshot(items=(QueuedItem(0.0, deadline_s=0.3),)), 0.0, cfg)
    assert d.wake_at_s == pytest.approx(0.3)


def test_priority_levels_are_served_first_fifo_within_a_level() -> None:
    cfg = BatchPolicyConfig(max_batch_size=2, max_queue_delay_s=0.0)
    snap = QueueSnapshot(items=(
        QueuedItem(0.0, 9.0, priority=2), QueuedItem(0.1, 9.0, priority=1),
        QueuedItem(0.2, 9.0, priority=2), QueuedItem(0.3, 9.0, priority=1),
    ))
    assert decide(snap, 1.0, cfg).take == (1, 3)


def test_static_mode_waits_for_a_full_batch_until_its_safety_timeout() -> None:
    cfg = BatchPolicyConfig(mode="static", max_batch_size=4, static_timeout_s=0.1, max_queue_delay_s=0.0)
    snap = QueueSnapshot(items=items(0.0, 0.0))
    assert decide(snap, 0.05, cfg).take == ()
    assert decide(snap, 0.1, cfg).take == (0, 1)


def test_adaptive_window_shrinks_as_the_arrival_rate_grows() -> None:
    cfg = BatchPolicyConfig(mode="adaptive", slo_s=0.05, fixed_overhead_s=0.0, target_batch_size=10_000)
    # Textbook table 15: SLO 50 ms, service 25 ms -> sqrt(T_svc / lambda).
    for rate, expected_ms in ((100, 15.8), (500, 7.1), (1000, 5.0), (5000, 2.24)):
        assert adaptive_window_s(0, rate, 0.025, cfg) * 1e3 == pytest.approx(expected_ms, rel=0.01)
    # Never more than the budget left after service time.
    assert adaptive_window_s(0, 1.0, 0.025, cfg) == pytest.approx(0.025)
    # Listing 2's fast path: enough requests waiting -> close now.
    assert adaptive_window_s(10_000, 1.0, 0.025, cfg) == 0.0


def test_adaptive_mode_uses_the_window_in_decisions() -> None:
    cfg = BatchPolicyConfig(mode="adaptive", max_batch_size=64, slo_s=0.05, fixed_overhead_s=0.0,
                            target_batch_size=10_000)
    snap = QueueSnapshot(items=items(0.0), arrival_rate_per_s=1000.0, service_time_s=0.025)
    d = decide(snap, 0.0, cfg)
    assert d.take == () and d.wake_at_s == pytest.approx(0.005, rel=0.01)
    assert decide(snap, 0.0051, cfg).take == (0,)


def test_multistream_batches_a_frame_when_all_streams_arrived() -> None:
    cfg = BatchPolicyConfig(mode="multistream", max_batch_size=8, sync_deadline_s=0.03,
                            expected_streams=("a", "b", "c"))
    snap = QueueSnapshot(items=(
        QueuedItem(0.0, 9.0, group="f1", stream="a"), QueuedItem(0.001, 9.0, group="f2", stream="a"),
        QueuedItem(0.002, 9.0, group="f1", stream="b"), QueuedItem(0.003, 9.0, group="f1", stream="c"),
    ))
    d = decide(snap, 0.004, cfg)
    assert d.take == (0, 2, 3) and d.missing_streams == ()


def test_multistream_sync_deadline_runs_with_what_arrived_and_names_the_missing() -> None:
    cfg = BatchPolicyConfig(mode="multistream", max_batch_size=8, sync_deadline_s=0.03,
                            expected_streams=("a", "b", "c"))
    snap = QueueSnapshot(items=(QueuedItem(0.0, 9.0, group="f1", stream="a"),
                                QueuedItem(0.01, 9.0, group="f1", stream="c")))
    early = decide(snap, 0.02, cfg)
    assert early.take == () and early.wake_at_s == pytest.approx(0.03)
    late = decide(snap, 0.03, cfg)
    assert late.take == (0, 1) and late.missing_streams == ("b",)


def test_oversized_single_request_still_runs_alone() -> None:
    cfg = BatchPolicyConfig(max_batch_size=4, max_queue_delay_s=0.0)
    assert decide(QueueSnapshot(items=items(0.0, size=6)), 0.0, cfg).take == (0,)


@pytest.mark.parametrize("bad", [{"max_batch_size": 0}, {"max_queue_delay_s": -1.0}, {"mode": "nope"}])
def test_invalid_config_raises(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        BatchPolicyConfig(**bad)  # type: ignore[arg-type]


def test_never_waits_forever_with_live_requests() -> None:
    cfg = BatchPolicyConfig(max_batch_size=8, max_queue_delay_s=0.01)
    d = decide(QueueSnapshot(items=items(0.0, deadline_s=math.inf)), 0.0, cfg)
    assert d.wake_at_s is not None and math.isfinite(d.wake_at_s)


def test_requests_with_other_non_batch_dims_wait_for_their_own_batch() -> None:
    """Alternating shapes [1,3] / [1,4]: each batch holds one shape; the other shape is taken next."""
    cfg = BatchPolicyConfig(max_batch_size=8, max_queue_delay_s=0.0)
    keys = [(("x", (3,)),), (("x", (4,)),)]
    queue = tuple(QueuedItem(enqueued_s=i * 0.001, deadline_s=100.0, batch_key=keys[i % 2]) for i in range(6))
    first = decide(QueueSnapshot(items=queue), 1.0, cfg)
    assert first.take == (0, 2, 4)
    rest = tuple(item for i, item in enumerate(queue) if i not in first.take)
    assert decide(QueueSnapshot(items=rest), 1.0, cfg).take == (0, 1, 2)


def test_a_full_batch_counts_compatible_requests_only() -> None:
    """Seven [3]-shaped requests and one [4]: not a full batch of 8, so the window still applies."""
    cfg = BatchPolicyConfig(max_batch_size=8, max_queue_delay_s=0.01)
    queue = tuple(QueuedItem(enqueued_s=0.0, deadline_s=100.0, batch_key=(("x", (4 if i == 7 else 3,)),))
                  for i in range(8))
    waiting = decide(QueueSnapshot(items=queue), 0.0, cfg)
    assert waiting.take == () and waiting.wake_at_s == pytest.approx(0.01)
    assert decide(QueueSnapshot(items=queue), 0.01, cfg).take == tuple(range(7))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    queue=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(1, 4), st.integers(1, 2), st.integers(0, 2),
                             st.sampled_from(["", "f1", "f2"]), st.sampled_from(["a", "b"])), min_size=1, max_size=20),
    mode=st.sampled_from(["dynamic", "static", "adaptive", "multistream"]),
    now_s=st.floats(0.0, 2.0),
)
def test_no_batch_ever_mixes_batch_keys(queue: list[tuple[float, int, int, int, str, str]], mode: str,
                                        now_s: float) -> None:
    cfg = BatchPolicyConfig(mode=mode, max_batch_size=6, max_queue_delay_s=0.01, expected_streams=("a", "b"))
    snapshot = QueueSnapshot(items=tuple(
        QueuedItem(enqueued_s=t, deadline_s=t + 1.0, size=size, priority=prio, group=group, stream=stream,
                   batch_key=(("x", (key,)),))
        for t, size, prio, key, group, stream in queue))
    decision = decide(snapshot, now_s, cfg)
    assert len({snapshot.items[i].batch_key for i in decision.take}) <= 1
    assert not set(decision.take) & set(decision.expire)
