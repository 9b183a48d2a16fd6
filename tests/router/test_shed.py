"""Admission on a fake clock: coordinated shedding, the Vegas concurrency limit and their combination."""

from __future__ import annotations

import random

import pytest

from headroom.router.shed import ShedConfig, ShedState, VegasConfig, admit, shed, vegas_initial, vegas_update
from headroom.router.snapshot import ReplicaSnapshot


def _vegas_converge(knee: int, cfg: VegasConfig, steps: int = 3000) -> float:
    """A server whose RTT is flat up to `knee` concurrent requests and grows linearly beyond (Little's law)."""
    state = vegas_initial(cfg)
    base_rtt_s = 0.02
    for _ in range(steps):
        inflight = state.effective_limit(cfg)  # saturated client: always at the limit
        rtt = base_rtt_s * max(1.0, inflight / knee)
        state = vegas_update(state, rtt, inflight, False, cfg)
    return state.limit


@pytest.mark.parametrize("knee", [30, 60, 120])
def test_vegas_limit_settles_near_the_knee(knee: int) -> None:
    limit = _vegas_converge(knee, VegasConfig())
    assert knee * 0.95 <= limit <= knee * 1.25


def test_vegas_reprobes_min_rtt_at_pinned_concurrency() -> None:
    cfg = VegasConfig(probe_multiplier=1)
    s = vegas_update(vegas_initial(cfg), 0.01, 1, False, cfg)
    for _ in range(int(s.limit) + 1):
        s = vegas_update(s, 0.02, int(s.limit), False, cfg)
    assert s.probing and s.effective_limit(cfg) == cfg.probe_concurrency
    assert vegas_update(s, 0.05, 10, False, cfg).probing  # admitted before the probe: ignored
    s = vegas_update(s, 0.015, 2, False, cfg)
    assert not s.probing and s.min_rtt_s == 0.015


def test_vegas_backs_off_on_drops_and_ignores_app_limited_samples() -> None:
    cfg = VegasConfig()
    s = vegas_update(vegas_initial(cfg), 0.01, 1, False, cfg)  # the initial probe measures minRTT
    assert not s.probing and s.min_rtt_s == 0.01
    assert vegas_update(s, 0.01, 2, False, cfg).limit == s.limit  # 2 in flight << limit: no signal
    assert vegas_update(s, 0.01, 20, True, cfg).limit < s.limit


def _fleet(load: int, n: int = 4, capacity: int = 10) -> tuple[ReplicaSnapshot, ...]:
    per = [load // n + (1 if i < load % n else 0) for i in range(n)]
    return tuple(ReplicaSnapshot(f"r{i}", outstanding=p, capacity=capacity, ewma_latency_s=0.2)
                 for i, p in enumerate(per))


def test_no_shedding_below_the_start_threshold() -> None:
    rng = random.Random(0)
    decisions = [shed(_fleet(30), 0.0, rng, ShedConfig()) for _ in range(200)]
    assert not any(d.reject for d in decisions) and decisions[0].fraction == 0.0


def test_shedding_rejects_a_uniform_fraction_between_start_and_full() -> None:
    rng = random.Random(0)
    decisions = [shed(_fleet(36), 0.0, rng, ShedConfig()) for _ in range(4000)]  # 90%: halfway up the ramp
    assert decisions[0].fraction == pytest.approx(0.5)
    rejected = sum(d.reject for d in decisions) / len(decisions)
    assert rejected == pytest.approx(0.5, abs=0.03)


def test_everything_new_is_rejected_at_capacity_with_a_retry_after() -> None:
    d = shed(_fleet(40), 0.0, random.Random(0), ShedConfig())
    assert d.reject and d.fraction == 1.0 and d.retry_after_s >= 1.0


def test_not_ready_replicas_do_not_count_towards_capacity() -> None:
    snaps = (ReplicaSnapshot("a", outstanding=9, capacity=10), ReplicaSnapshot("b", ready=False, capacity=10))
    assert shed(snaps, 0.0, random.Random(0), ShedConfig()).utilisation == pytest.approx(0.9)


def test_requests_admitted_but_not_yet_dispatched_count_as_load() -> None:
    d = shed(_fleet(20), 0.0, random.Random(0), ShedConfig(), undispatched=20)
    assert d.utilisation == pytest.approx(1.0) and d.reject


def test_admission_sheds_first_then_limits_and_keeps_the_utilisation_when_shedding_is_off() -> None:
    cfg, vegas = VegasConfig(), vegas_initial(VegasConfig())  # probing: the limit is pinned at 3
    busy = _fleet(40)
    a = admit(busy, 0, vegas, 0.0, random.Random(0), ShedConfig(), True, cfg)
    assert a.verdict == "shed" and not a.admitted and a.shed.fraction == 1.0
    a = admit(busy, 0, vegas, 0.0, random.Random(0), ShedConfig(), False, cfg)
    assert a.verdict == "admit" and a.shed.utilisation == pytest.approx(1.0)
    quiet = _fleet(0)
    assert admit(quiet, 3, vegas, 0.0, random.Random(0), ShedConfig(), True, cfg).verdict == "limited"
    assert admit(quiet, 2, vegas, 0.0, random.Random(0), ShedConfig(), True, cfg).admitted
    a = admit(quiet, 50, vegas, 0.0, random.Random(0), ShedConfig(), False, None)
    assert a.admitted and a.limit is None  # adaptive concurrency off: no limit


def _failover(cfg: ShedConfig, stall_peak: int) -> tuple[int, int]:
    """2 replicas of capacity 64 at 100 req/s on a fake clock, 5 outstanding each; at t=2 s replica b dies
    (not ready) and its share moves to a, which stalls: its outstanding climbs to `stall_peak` over 0.6 s and
    drains over the next 0.6 s, then settles at 10. Returns (rejected, arrivals)."""
    state, rng, rejected, arrivals = ShedState(), random.Random(0), 0, 0
    for k in range(500):  # one arrival every 10 ms for 5 s
        now = k * 0.01
        if now < 2.0:
            snaps = (ReplicaSnapshot("a", outstanding=5, capacity=64), ReplicaSnapshot("b", outstanding=5, capacity=64))
        else:
            t = now - 2.0
            held = 10 + int((stall_peak - 10) * (t / 0.6 if t < 0.6 else max(0.0, 2.0 - t / 0.6)))
            snaps = (ReplicaSnapshot("a", outstanding=held, capacity=64),
                     ReplicaSnapshot("b", ready=False, capacity=64))
        d = shed(snaps, now, rng, cfg, state=state)
        state, rejected, arrivals = d.state, rejected + d.reject, arrivals + 1
    return rejected, arrivals


def test_a_dead_replicas_share_moving_to_the_survivor_is_queued_not_shed() -> None:
    """The survivor briefly holds up to 60 of its 64: the averaged ramp absorbs it, the old instantaneous
    ramp (window 0) shed a share of the burst."""
    assert _failover(ShedConfig(), stall_peak=60)[0] == 0
    assert _failover(ShedConfig(average_window_s=0.0), stall_peak=60)[0] > 0


def test_a_survivor_full_right_now_still_rejects_whatever_the_average() -> None:
    rejected, _ = _failover(ShedConfig(), stall_peak=80)  # 80 > 64: tail drop while it is over capacity
    assert rejected > 0
    quiet = ShedState(average_utilisation=0.1, updated_s=0.0)
    full = (ReplicaSnapshot("a", outstanding=64, capacity=64),)
    d = shed(full, 0.001, random.Random(0), ShedConfig(), state=quiet)
    assert d.reject and d.fraction == 1.0 and d.state.average_utilisation < 0.2


def test_sustained_load_on_the_ramp_is_shed_once_the_average_catches_up() -> None:
    snaps, state, rng = _fleet(36), ShedState(average_utilisation=0.5, updated_s=0.0), random.Random(0)
    first = shed(snaps, 0.01, rng, ShedConfig(), state=state)
    assert first.fraction == 0.0  # 90% for 10 ms after a quiet second: a burst, not yet shed
    for k in range(1, 1001):  # 10 s at 90%
        state = shed(snaps, k * 0.01, rng, ShedConfig(), state=state).state
    d = shed(snaps, 10.01, rng, ShedConfig(), state=state)
    assert d.fraction == pytest.approx(0.5, abs=0.01) and d.state.average_utilisation == pytest.approx(0.9, abs=0.002)


def test_the_average_window_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="average_window_s"):
        ShedConfig(average_window_s=-1.0)
