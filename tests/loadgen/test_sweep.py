from __future__ import annotations

import pytest

from headroom.loadgen.arrivals import ArrivalSpec
from headroom.loadgen.clients import ClientConfig
from headroom.loadgen.records import Slo
from headroom.loadgen.runner import BenchConfig, sweep_peak_rate
from headroom.loadgen.sweep import (
    BisectConfig,
    BisectState,
    ParetoPoint,
    find_peak_rate,
    next_probe,
    observe,
    pareto_frontier,
)
from headroom.loadgen.workloads import WorkloadSpec
from tests.loadgen.fake_server import FakeServerConfig, running_server


async def test_bisection_converges_on_a_known_threshold() -> None:
    capacity = 137.0
    config = BisectConfig(low_rate_per_s=1.0, high_rate_per_s=10.0, rel_tolerance=0.02, max_probes=40)

    async def probe(rate: float) -> bool:
        return rate <= capacity

    state = await find_peak_rate(probe, config)
    assert state.best_valid_per_s <= capacity
    assert state.best_valid_per_s >= capacity * 0.98
    # It expanded past 10 first (10, 20, 40, 80, 160), then bisected.
    assert [r for r, _ in state.probes[:5]] == [10.0, 20.0, 40.0, 80.0, 160.0]


def test_bisection_stops_at_the_floor_when_nothing_is_valid() -> None:
    config = BisectConfig(low_rate_per_s=5.0, high_rate_per_s=40.0)
    state = BisectState()
    while (rate := next_probe(state, config)) is not None:
        state = observe(state, rate, False)
    assert state.best_valid_per_s == 0.0
    assert [r for r, _ in state.probes] == [40.0, 20.0, 10.0, 5.0]


def test_pareto_frontier_drops_dominated_runs() -> None:
    points = [
        ParetoPoint("delay=0", 100.0, 5.0),
        ParetoPoint("delay=2", 300.0, 8.0),
        ParetoPoint("delay=5", 280.0, 12.0),  # dominated by delay=2
        ParetoPoint("delay=10", 400.0, 20.0),
    ]
    marked = {p.label: p.on_frontier for p in pareto_frontier(points)}
    assert marked == {"delay=0": True, "delay=2": True, "delay=5": False, "delay=10": True}


async def test_sweep_finds_the_capacity_of_a_serial_server_within_ten_percent() -> None:
    # One request at a time, 100 ms each: capacity is exactly 10 req/s. Constant arrivals for 2 s per probe:
    # above capacity the queue (and p99) grows by (rate/10 - 1) * 2 s, past the 250 ms SLO by 10.75 req/s;
    # below it latency stays at the service time. Generous lateness/SLO margins absorb a busy 2-core machine.
    with running_server(FakeServerConfig(service_s=0.1, concurrency=1)) as (url, _):
        base = BenchConfig(
            client=ClientConfig(url=url, model="m", protocol="v2-http"),
            arrival=ArrivalSpec(kind="constant", duration_s=2.0),
            workload=WorkloadSpec(kind="digits", num_samples=8),
            slo=Slo(p99_ms=250.0),
            confidence=0.0,  # short probes: plain p99 check instead of MLPerf's 459-sample rule
            late_threshold_ms=150.0,
            warmup_queries=3,
            metrics_url="none",
        )
        bisect = BisectConfig(low_rate_per_s=5.0, high_rate_per_s=12.0, rel_tolerance=0.08, max_probes=7)
        state, results = await sweep_peak_rate(base, bisect)
    assert state.best_valid_per_s == pytest.approx(10.0, rel=0.10)
    assert len(results) == len(state.probes)
    assert all(r["load"]["mode"] == "open" for r in results)
