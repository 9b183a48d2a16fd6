"""Open-loop dispatch against a real (small) HTTP server: the coordinated-omission check and friends."""

from __future__ import annotations

import numpy as np

from headroom.core.clock import MonotonicClock
from headroom.loadgen.arrivals import constant
from headroom.loadgen.clients import ClientConfig, make_client
from headroom.loadgen.collector import Collector
from headroom.loadgen.dispatcher import DispatchConfig, DispatchTarget, run_closed_loop, run_open_loop
from headroom.loadgen.records import Slo
from headroom.loadgen.workloads import digits
from tests.loadgen.fake_server import FakeServerConfig, running_server


async def test_a_one_second_stall_shows_up_as_p99_of_at_least_one_second() -> None:
    # 100 req/s for 3 s against a 50 ms service; the server freezes its whole loop for 1 s at t ~ 1 s.
    config = FakeServerConfig(service_s=0.05, stall_s=1.0, stall_after_s=1.0)
    samples = digits(16, np.random.default_rng(0))
    with running_server(config) as (url, fake):
        clock = MonotonicClock()
        client = make_client(ClientConfig(url=url, model="m"), clock)
        open_loop = Collector(Slo())
        try:
            t0_s = clock.now_s()
            await run_open_loop(
                constant(100.0, 3.0), DispatchTarget(samples, client, clock, open_loop.add), DispatchConfig()
            )
        finally:
            await client.aclose()
    assert open_loop.completed == 300 and open_loop.ok == 300
    assert fake.stall_started_s > 0
    assert open_loop.latency.percentile_ms(99.0) >= 1000.0
    # Every request meant to go out during the stall is charged the wait from its INTENDED send time, even
    # if the generator itself only managed to send it later.
    stall_start_s = fake.stall_started_s - t0_s
    stall_end_s = stall_start_s + config.stall_s
    during = [r for r in open_loop.records if stall_start_s <= r.intended_s < stall_end_s - 0.01]
    assert len(during) >= 90
    for r in during:
        assert r.latency_s >= stall_end_s - r.intended_s - 0.005


async def test_closed_loop_hides_the_same_stall_which_is_why_it_is_labelled() -> None:
    config = FakeServerConfig(service_s=0.05, stall_s=1.0, stall_after_s=0.5)
    samples = digits(4, np.random.default_rng(0))
    with running_server(config) as (url, _):
        clock = MonotonicClock()
        client = make_client(ClientConfig(url=url, model="m"), clock)
        closed = Collector(Slo())
        try:
            stats = await run_closed_loop(
                DispatchTarget(samples, client, clock, closed.add),
                DispatchConfig(mode="closed", concurrency=1, duration_s=2.5),
            )
        finally:
            await client.aclose()
    assert stats.mode == "closed"
    # One request saw the whole stall; it is far less than 1% of an honest open-loop count, but here the
    # closed loop simply stopped sending, so the stall is a single sample among few.
    assert closed.latency.max_ms() >= 1000.0
    assert closed.completed < 2.5 / 0.05


async def test_errors_are_counted_by_status_and_server_timing_is_parsed() -> None:
    config = FakeServerConfig(service_s=0.001, fail_every=4)
    samples = digits(8, np.random.default_rng(0))
    with running_server(config) as (url, _):
        clock = MonotonicClock()
        client = make_client(ClientConfig(url=url, model="m"), clock)
        col = Collector(Slo(e2e_ms=10_000))
        try:
            await run_open_loop(constant(200.0, 0.2), DispatchTarget(samples, client, clock, col.add), DispatchConfig())
        finally:
            await client.aclose()
    assert col.by_status == {"200": 30, "503": 10}
    assert col.good == 30
    assert set(col.stage_summary()) == {"queue", "compute"}
    assert col.stage_summary()["compute"]["mean_ms"] == 1.0


async def test_multistream_query_waits_for_all_samples() -> None:
    config = FakeServerConfig(service_s=0.01)
    samples = digits(16, np.random.default_rng(0))
    with running_server(config) as (url, fake):
        clock = MonotonicClock()
        client = make_client(ClientConfig(url=url, model="m"), clock)
        col = Collector(Slo())
        try:
            stats = await run_closed_loop(
                DispatchTarget(samples, client, clock, col.add),
                DispatchConfig(mode="closed", max_queries=5, duration_s=30, samples_per_query=8),
            )
        finally:
            await client.aclose()
    assert stats.queries_sent == 5 and col.completed == 5
    assert fake.requests == 40
    assert col.latency.min_ms() >= 10.0
