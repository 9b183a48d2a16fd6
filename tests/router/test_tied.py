"""Tail at Scale's tied requests: a second copy ~2 ms later, the first answer wins, the other is cancelled."""

from __future__ import annotations

import time

import pytest

from headroom.router.fake_replica import ReplicaBehaviour
from headroom.router.proxy import ProxyConfig
from headroom.router.tail import BudgetConfig
from tests.router.test_proxy import INFER, fleet


async def test_tied_requests_hide_stalls_and_cancel_the_losing_copy() -> None:
    # only `a` stalls (every 5th of its copies): a copy that stalls always has a fast twin on `b` (two stalled
    # copies of one request would be a double stall, which no second copy can hide)
    reps = [ReplicaBehaviour(name="a", delay_ms=3.0, stall_every=5, stall_ms=2000.0),
            ReplicaBehaviour(name="b", delay_ms=3.0)]
    cfg = ProxyConfig(policy="round_robin", tied=True, tied_delay_s=0.002,
                      hedge_budget=BudgetConfig(budget_fraction=1.0, max_tokens=10.0, initial_tokens=10.0))
    async with fleet(reps, cfg) as (router, client):
        slowest = 0.0
        for i in range(40):
            t0 = time.monotonic()
            r = await client.post(INFER, content=b'{"i": %d}' % i)
            slowest = max(slowest, time.monotonic() - t0)
            assert r.status_code == 200
        assert router.counters["tied"] >= 38  # (almost) every request was tied: the budget is 100%
    assert reps[0].stalls >= 4  # `a` did stall...
    assert sum(b.stalls_completed for b in reps) == 0  # ...and every stalled copy was cancelled, not finished
    assert slowest < 1.5  # no client waited out a 2 s stall


def test_tied_and_hedging_are_exclusive() -> None:
    with pytest.raises(ValueError, match="tied requests or hedging"):
        ProxyConfig(tied=True, hedging=True)
