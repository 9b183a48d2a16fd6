"""Passive outlier ejection and active readiness checks on a fake clock."""

from __future__ import annotations

import pytest

from headroom.core.clock import FakeClock
from headroom.router.health import HealthConfig, HealthState, apply, record_check, record_result
from headroom.router.snapshot import ReplicaSnapshot

CFG = HealthConfig()


def _fleet(n: int, now_s: float = 0.0) -> HealthState:
    state = HealthState()
    for i in range(n):
        _, state = record_check(state, f"r{i}", True, now_s, CFG)
    return state


def _fail(state: HealthState, rid: str, times: int, now_s: float) -> HealthState:
    for _ in range(times):
        _, state = record_result(state, rid, True, now_s, CFG)
    return state


def test_replicas_are_not_ready_until_a_check_passes() -> None:
    snaps = apply((ReplicaSnapshot("r0"),), HealthState())
    assert not snaps[0].ready
    _, state = record_check(HealthState(), "r0", True, 0.0, CFG)
    assert apply((ReplicaSnapshot("r0"),), state)[0].ready


def test_five_consecutive_failures_eject_for_thirty_seconds() -> None:
    clock = FakeClock()
    state = _fail(_fleet(3), "r0", 4, clock.now_s())
    assert state.get("r0").ejected_until_s == 0.0
    event, state = record_result(state, "r0", True, clock.now_s(), CFG)
    assert event is not None and event.kind == "ejected" and event.until_s == 30.0
    assert apply((ReplicaSnapshot("r0"),), state)[0].ejected(clock.now_s())
    clock.advance(30.0)
    assert not apply((ReplicaSnapshot("r0"),), state)[0].ejected(clock.now_s())


def test_a_success_resets_the_failure_streak() -> None:
    state = _fail(_fleet(3), "r0", 4, 0.0)
    _, state = record_result(state, "r0", False, 0.0, CFG)
    state = _fail(state, "r0", 4, 0.0)
    assert state.get("r0").ejected_until_s == 0.0


def test_ejection_time_grows_with_repeats_and_is_capped() -> None:
    clock = FakeClock()
    state = _fleet(3)
    lengths = []
    for _ in range(12):
        state = _fail(state, "r0", 5, clock.now_s())
        until = state.get("r0").ejected_until_s
        lengths.append(until - clock.now_s())
        clock.set(until)
    assert lengths[:3] == [30.0, 60.0, 90.0]
    assert max(lengths) == 300.0 and lengths[-1] == 300.0


def test_multiplier_resets_after_a_long_healthy_period() -> None:
    state = _fail(_fleet(3), "r0", 5, 0.0)  # ejected until 30
    _, state = record_result(state, "r0", False, 30.0 + 300.0, CFG)
    state = _fail(state, "r0", 5, 400.0)
    assert state.get("r0").ejected_until_s == 430.0


def test_at_most_ten_percent_but_always_one_replica_is_ejected() -> None:
    state = _fail(_fleet(3), "r0", 5, 0.0)
    state = _fail(state, "r1", 4, 0.0)
    event, state = record_result(state, "r1", True, 0.0, CFG)
    assert event is not None and event.kind == "ejection_skipped_cap"
    assert state.get("r1").ejected_until_s == 0.0  # cap: 10% of 3 rounds down, but one is always allowed
    big = _fleet(20)
    big = _fail(big, "r0", 5, 0.0)
    big = _fail(big, "r1", 5, 0.0)
    big = _fail(big, "r2", 5, 0.0)
    ejected = [r for r in ("r0", "r1", "r2") if big.get(r).ejected_until_s > 0]
    assert ejected == ["r0", "r1"]  # 10% of 20


def test_failing_check_removes_a_draining_replica_at_once() -> None:
    state = _fleet(2)
    event, state = record_check(state, "r1", False, 1.0, CFG)
    assert event is not None and event.kind == "not_ready"
    snaps = apply((ReplicaSnapshot("r0"), ReplicaSnapshot("r1")), state)
    assert [s.ready for s in snaps] == [True, False]


@pytest.mark.parametrize("uneject", [True, False])
def test_passing_check_lifts_an_ejection_only_when_configured(uneject: bool) -> None:
    cfg = HealthConfig(uneject_on_active_pass=uneject)
    state = _fail(_fleet(3), "r0", 5, 0.0)
    _, state = record_check(state, "r0", True, 5.0, cfg)
    assert (state.get("r0").ejected_until_s <= 5.0) is uneject


def test_config_validation_says_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="consecutive_failures"):
        HealthConfig(consecutive_failures=0)
    with pytest.raises(ValueError, match="max_ejected_fraction"):
        HealthConfig(max_ejected_fraction=2.0)
