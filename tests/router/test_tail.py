"""Hedging, the retry and hedge budgets, and which outcomes are retried, on a fake clock."""

from __future__ import annotations

import pytest

from headroom.router.tail import (
    HEDGE_BUDGET,
    RETRY_BUDGET,
    BudgetConfig,
    BudgetState,
    HedgeConfig,
    LatencyWindow,
    budget_deposit,
    budget_withdraw,
    hedge_delay_s,
    replayable,
    retryable,
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
