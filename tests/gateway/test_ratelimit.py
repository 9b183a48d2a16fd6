"""The token-bucket policy: pure functions of (config, state, cost, now_s)."""

from __future__ import annotations

import math

import pytest

from headroom.gateway.ratelimit import (
    BucketConfig,
    BucketState,
    RateLimitConfig,
    RateLimiter,
    TenantState,
    admit,
    give_back,
    refund,
    take,
)


def test_full_bucket_allows_burst_then_refuses_with_exact_retry_after() -> None:
    cfg = BucketConfig(rate_per_s=2.0, burst=3.0)
    state: BucketState | None = None
    for _ in range(3):
        decision, state = take(cfg, state, 1.0, now_s=10.0)
        assert decision.allowed
    decision, state = take(cfg, state, 1.0, now_s=10.0)
    assert not decision.allowed and decision.retry_after_s == pytest.approx(0.5)
    decision, state = take(cfg, state, 1.0, now_s=10.25)  # half a token refilled: still short
    assert not decision.allowed and decision.retry_after_s == pytest.approx(0.25)
    decision, _ = take(cfg, state, 1.0, now_s=10.5)
    assert decision.allowed and decision.remaining == pytest.approx(0.0)


def test_refill_is_capped_at_burst_and_clock_going_back_adds_nothing() -> None:
    cfg = BucketConfig(rate_per_s=1.0, burst=2.0)
    _, state = take(cfg, None, 2.0, now_s=0.0)
    decision, state = take(cfg, state, 0.0, now_s=1000.0)
    assert decision.remaining == pytest.approx(2.0)
    _, state = take(cfg, state, 2.0, now_s=1000.0)
    decision, _ = take(cfg, state, 1.0, now_s=999.0)
    assert not decision.allowed


def test_cost_above_burst_can_never_succeed() -> None:
    decision, _ = take(BucketConfig(1.0, 5.0), None, 6.0, now_s=0.0)
    assert not decision.allowed and math.isinf(decision.retry_after_s)


def test_disabled_bucket_always_allows() -> None:
    decision, state = take(BucketConfig(0.0, 0.0), None, 1e9, now_s=0.0)
    assert decision.allowed and state is None


@pytest.mark.parametrize(("rate", "burst"), [(-1.0, 1.0), (1.0, 0.5), (math.inf, 1.0), (1.0, math.nan)])
def test_bad_bucket_configs_are_refused(rate: float, burst: float) -> None:
    with pytest.raises(ValueError):
        BucketConfig(rate, burst)


def test_admit_is_all_or_nothing_across_both_buckets() -> None:
    cfg = RateLimitConfig.of(
        requests_per_s=1.0, request_burst=2.0, llm_tokens_per_s=10.0, llm_token_burst=100.0
    )
    decision, state = admit(cfg, TenantState(), llm_tokens=80, now_s=0.0)
    assert decision.allowed
    decision, state2 = admit(cfg, state, llm_tokens=80, now_s=0.0)
    assert not decision.allowed and decision.limit == "llm_tokens"
    assert decision.retry_after_s == pytest.approx(6.0)  # 20 left, 60 more at 10/s
    assert state2.requests is not None and state2.requests.tokens == pytest.approx(
        1.0
    )  # request token refunded
    decision, _ = admit(cfg, state2, llm_tokens=0, now_s=0.0)
    assert decision.allowed


def test_limiter_keeps_tenants_apart_and_honours_overrides() -> None:
    limiter = RateLimiter(RateLimitConfig.of(1.0, 1.0), {"vip": RateLimitConfig.of()})
    assert limiter.check("a", 0, 0.0).allowed
    assert not limiter.check("a", 0, 0.0).allowed
    assert limiter.check("b", 0, 0.0).allowed
    assert all(limiter.check("vip", 0, 0.0).allowed for _ in range(100))


def test_limiter_forgets_only_refilled_tenants() -> None:
    limiter = RateLimiter(RateLimitConfig.of(1.0, 1.0), max_tracked_tenants=2)
    for t in ("a", "b"):
        limiter.check(t, 0, 0.0)
    limiter.check("c", 0, 10.0)  # a and b refilled by now: forgotten, decisions unchanged
    assert not limiter.check("c", 0, 10.0).allowed
    assert limiter.check("a", 0, 10.0).allowed


def test_refund_restores_capacity_but_never_above_burst() -> None:
    cfg = BucketConfig(rate_per_s=1.0, burst=100.0)
    _, state = take(cfg, None, 90.0, now_s=0.0)  # 10 left
    state = give_back(cfg, state, 50.0, now_s=2.0)  # 10 + 2 refilled + 50
    assert state == BucketState(62.0, 2.0)
    decision, _ = take(cfg, state, 62.0, now_s=2.0)
    assert decision.allowed
    assert give_back(cfg, state, 1000.0, now_s=3.0) == BucketState(100.0, 3.0)  # capped
    assert give_back(cfg, None, 5.0, now_s=3.0) is None  # a full bucket stays full
    off = BucketConfig(0.0, 0.0)
    assert give_back(off, BucketState(1.0, 0.0), 5.0, now_s=1.0) == BucketState(1.0, 0.0)  # disabled: untouched


def test_negative_refund_charges_an_overrun_as_debt() -> None:
    cfg = BucketConfig(rate_per_s=10.0, burst=100.0)
    _, state = take(cfg, None, 100.0, now_s=0.0)
    state = give_back(cfg, state, -30.0, now_s=0.0)  # generated 30 more than reserved
    assert state == BucketState(-30.0, 0.0)
    decision, _ = take(cfg, state, 10.0, now_s=0.0)
    assert not decision.allowed and decision.retry_after_s == pytest.approx(4.0)  # pay 30, then 10
    assert give_back(cfg, None, -5.0, now_s=1.0) == BucketState(95.0, 1.0)
    with pytest.raises(ValueError):
        give_back(cfg, state, math.inf, now_s=1.0)


def test_refund_touches_only_the_llm_bucket_and_the_limiter_settles_per_tenant() -> None:
    config = RateLimitConfig.of(requests_per_s=1, request_burst=1, llm_tokens_per_s=1, llm_token_burst=600)
    decision, state = admit(config, TenantState(), 520.0, now_s=0.0)
    assert decision.allowed
    settled = refund(config, state, 500.0, now_s=0.0)
    assert settled.requests == state.requests and settled.llm_tokens == BucketState(580.0, 0.0)
    limiter = RateLimiter(config)
    assert limiter.check("a", 520.0, 0.0).allowed
    assert not limiter.check("a", 520.0, 1.0).allowed  # without the refund: 81 < 520
    limiter.refund("a", 510.0, 1.0)
    assert limiter.check("a", 520.0, 2.0).allowed  # the request bucket refilled, the tokens came back
    limiter.refund("never-seen", 10.0, 2.0)  # a tenant with full buckets: nothing to do
    assert limiter.check("never-seen", 600.0, 2.0).allowed
