"""Admission on a fake clock: coordinated shedding, the Vegas concurrency limit and their combination."""

from __future__ import annotations

import random

import pytest

from headroom.router.shed import ShedConfig, VegasConfig, admit, shed, vegas_initial, vegas_update
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
