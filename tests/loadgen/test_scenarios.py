from __future__ import annotations

import pytest

from headroom.loadgen.scenarios import (
    binomial_cdf,
    judge_offline,
    judge_tail,
    min_queries_for_tail,
    plan_scenario,
)


def test_459_queries_are_needed_for_a_p99_claim_with_none_over() -> None:
    assert min_queries_for_tail(0) == 459
    assert min_queries_for_tail(0, percentile=90.0) == 44
    assert min_queries_for_tail(1) > 459
    assert binomial_cdf(0, 459, 0.01) <= 0.01 < binomial_cdf(0, 458, 0.01)


def test_server_verdicts() -> None:
    assert judge_tail(500, 0, 10.0).valid
    short = judge_tail(300, 0, 10.0)
    assert not short.valid and "need >= 459" in short.reasons[0]
    slow = judge_tail(1000, 20, 10.0)
    assert not slow.valid and "20 of 1000" in slow.reasons[0]
    late = judge_tail(1000, 0, 10.0, late_sends=50)
    assert not late.valid and "late" in late.reasons[0]
    assert not judge_tail(1000, 0, 0.0).valid  # the Server scenario needs a bound
    assert judge_tail(1000, 0, 0.0, require_bound=False).valid
    assert judge_tail(100, 1, 10.0, confidence=0.0).valid  # plain fraction check: 1% allowed


def test_plans() -> None:
    assert plan_scenario("server").mode == "open"
    assert plan_scenario("single-stream").metric == "p90_ms"
    assert plan_scenario("multi-stream").samples_per_query == 8
    assert plan_scenario("offline").all_at_once
    assert judge_offline(10, 0).valid and not judge_offline(10, 1).valid
    with pytest.raises(ValueError, match="choose one of"):
        plan_scenario("batch")
