"""Canary rollout: promotion through 5% -> 50% -> 100% and automatic rollback, on a fake clock."""

from __future__ import annotations

import random

import pytest

from headroom.core.clock import FakeClock
from headroom.router.rollout import CanaryConfig, VersionStats, evaluate, pick_version, start

CFG = CanaryConfig(step_duration_s=60.0, min_requests=100)
GOOD = VersionStats(requests=1000, errors=2, p99_s=0.100)


def test_a_healthy_canary_is_promoted_step_by_step_to_completion() -> None:
    clock = FakeClock()
    state = start(clock.now_s())
    weights, phases = [], []
    for _ in range(4):
        clock.advance(61.0)
        d, state = evaluate(GOOD, VersionStats(200, 0, 0.105), state, clock.now_s(), CFG)
        weights.append(d.canary_weight)
        phases.append(d.phase)
    assert weights == [0.5, 1.0, 1.0, 1.0]
    assert phases == ["progressing", "progressing", "complete", "complete"]


def test_no_verdict_before_enough_canary_requests_or_time() -> None:
    state = start(0.0)
    d, state = evaluate(GOOD, VersionStats(50, 50, 9.0), state, 100.0, CFG)
    assert d.canary_weight == 0.05 and d.phase == "progressing" and not d.reset_stats
    d, _ = evaluate(GOOD, VersionStats(200, 0, 0.1), state, 10.0, CFG)
    assert d.canary_weight == 0.05 and d.reason == "step healthy, holding"


@pytest.mark.parametrize("canary", [VersionStats(200, 10, 0.1), VersionStats(200, 0, 0.2)])
def test_a_bad_canary_is_rolled_back_and_stays_rolled_back(canary: VersionStats) -> None:
    state = start(0.0)
    d, state = evaluate(GOOD, VersionStats(200, 0, 0.1), state, 61.0, CFG)  # promoted to 50%
    assert d.canary_weight == 0.5
    d, state = evaluate(GOOD, canary, state, 70.0, CFG)
    assert d.canary_weight == 0.0 and d.phase == "rolled_back"
    d, _ = evaluate(GOOD, VersionStats(1000, 0, 0.05), state, 500.0, CFG)
    assert d.canary_weight == 0.0 and d.phase == "rolled_back"


def test_pick_version_follows_the_weight() -> None:
    rng = random.Random(0)
    share = sum(pick_version(0.05, rng) == "canary" for _ in range(20_000)) / 20_000
    assert share == pytest.approx(0.05, abs=0.006)
    assert pick_version(0.0, rng) == "baseline" and pick_version(1.0, rng) == "canary"


def test_steps_must_end_at_full_traffic() -> None:
    with pytest.raises(ValueError, match=r"ending at 1\.0"):
        CanaryConfig(steps=(0.05, 0.5))


def test_a_canary_whose_replicas_are_all_ejected_is_rolled_back_before_min_requests() -> None:
    state = start(0.0)
    d, state = evaluate(GOOD, VersionStats(5, 5, 0.0), state, 1.0, CFG, canary_ejected=True)
    assert d.phase == "rolled_back" and d.canary_weight == 0.0 and "ejected" in d.reason
    d, _ = evaluate(GOOD, VersionStats(5, 0, 0.1), start(0.0), 1.0, CFG, canary_ejected=False)
    assert d.phase == "progressing"  # not ejected: keep waiting for min_requests
