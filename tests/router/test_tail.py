"""Hedging, retry budget, Vegas concurrency limit and coordinated shedding on a fake clock."""

from __future__ import annotations

import random

import pytest

from headroom.router.snapshot import ReplicaSnapshot
from headroom.router.tail import (
    HEDGE_BUDGET,
    RETRY_BUDGET,
    BudgetConfig,
    BudgetState,
    HedgeConfig,
    LatencyWindow,
    ShedConfig,
    VegasConfig,
    budget_deposit,
    budget_withdraw,
    hedge_delay_s,
    replayable,
    retryable,
    shed,
    vegas_initial,
    vegas_update,
)


def test_latency_window_is_bounded_and_reports_nearest_rank_percentiles() -> None:
    w = LatencyWindow(max_samples=100)
    for i in range(1, 201):
        w = w.add(i / 1000)
    assert len(w.samples_s) == 100 and w.samples_s[0] == 0.101
    assert w.percentile_s(0.95) == 0.195
    assert LatencyWindow().percentile_s(0.5) is None


def test_hedge_delay_needs_history_then_follows_p95() -> None:
    cfg = HedgeConfig(min_samples=20)
    w = LatencyWindow()
    for _ in range(19):
        w = w.add(0.010)
    assert hedge_delay_s(w, cfg) is None
    w = w.add(0.5)
    assert hedge_delay_s(w, cfg) == 0.010
    for _ in range(5):
        w = w.add(0.5)
    assert hedge_delay_s(w, cfg) == 0.5


@pytest.mark.parametrize(("cfg", "fraction"), [(HEDGE_BUDGET, 0.05), (RETRY_BUDGET, 0.2)])
def test_budgets_cap_extra_requests_at_their_fraction_under_sustained_demand(cfg: BudgetConfig,
                                                                             fraction: float) -> None:
    """Every request wants an extra copy (a retry storm); the bucket grants only its fraction."""
    state, granted, now, n = BudgetState(), 0, 0.0, 10_000
    for _ in range(n):
        now += 0.01  # 100 requests/s for 100 s
        state = budget_deposit(state, now, cfg)
        ok, state = budget_withdraw(state, now, cfg)
        granted += ok
    floor = cfg.min_per_s * now  # the time-based floor adds at most this many
    assert granted <= fraction * n + floor + cfg.max_tokens
    assert granted >= fraction * n * 0.95


def test_retry_floor_lets_a_quiet_router_retry() -> None:
    ok, state = budget_withdraw(BudgetState(0.0, 0.0), 2.0, RETRY_BUDGET)
    assert ok and state.tokens == pytest.approx(1.0)


def test_only_never_started_requests_are_retryable() -> None:
    assert retryable("connect_error") and retryable("not_ready") and retryable("draining")
    for outcome in ("overloaded", "timeout", "connection_lost", "http_500"):
        assert not retryable(outcome)


def test_a_lost_connection_is_retried_only_on_replayable_routes() -> None:
    assert retryable("connection_lost", replayable_request=True)
    for outcome in ("overloaded", "timeout", "http_500", "http_502"):
        assert not retryable(outcome, replayable_request=True)
    for path in ("/v2/models/m/infer", "/v2/models/m/versions/2/infer", "/v1/embeddings", "/v1/completions",
                 "/v1/chat/completions"):
        assert replayable("POST", path), path
    assert replayable("GET", "/v2/models/m")
    for path in ("/v2/repository/models/m/load", "/v2/repository/models/m/unload", "/v2/models/m/infer/x",
                 "/v1/chat/completions/extra"):
        assert not replayable("POST", path), path


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
