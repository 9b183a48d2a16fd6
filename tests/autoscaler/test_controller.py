"""The autoscaler controller: a fake-clock run against a recording actuator, and a real-process run."""

from __future__ import annotations

import asyncio
import logging
import random

import httpx
import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from headroom.autoscaler.controller import AutoscalerController
from headroom.autoscaler.policy import AutoscalerConfig, MetricsSample
from headroom.core.clock import FakeClock, MonotonicClock
from headroom.router import health as hp
from headroom.router.fake_replica import serve_asgi
from headroom.router.load_sample import router_sampler
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.replicas import LocalReplicaManager, ReplicaManagerConfig
from headroom.router.upstream import Upstream
from tests.router.test_replicas import fake_command, wait_ready


class RecordingActuator:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    async def scale_to(self, replicas: int, warm_pool: int) -> None:
        self.calls.append((replicas, warm_pool))

    def serving(self) -> tuple[Upstream, ...]:
        return ()


async def test_step_load_scales_up_within_one_window_and_is_exported(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    actuator = RecordingActuator()
    replicas = {"n": 1}

    def sample(now_s: float) -> MetricsSample:
        offered = 0.3 if now_s < 60 else 2.0  # replicas' worth of work
        n = actuator.calls[-1][0] if actuator.calls else 1
        replicas["n"] = n
        return MetricsSample(now_s, n, utilisation=min(1.0, offered / n))

    registry = CollectorRegistry()
    ctl = AutoscalerController(sample, actuator, AutoscalerConfig(), clock, registry=registry)
    with caplog.at_level(logging.INFO, logger="headroom"):
        for _ in range(120):
            await ctl.step()
            await ctl.settle()
            clock.advance(1.0)
    assert [e.to_replicas for e in ctl.events] == [2, 4]
    assert 60 < ctl.events[0].time_s <= 60 + AutoscalerConfig().window_s
    assert actuator.calls[-1] == (4, 1)  # plus the default warm pool of one
    # what Prometheus reads: the page itself, parsed
    page = {s.name: s for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}
    assert page["headroom_autoscaler_desired_replicas"].value == 4
    assert page["headroom_autoscaler_actual_replicas"].value == 4
    assert page["headroom_autoscaler_scaling_events_total"].labels == {"direction": "up"}
    assert page["headroom_autoscaler_scaling_events_total"].value == 2
    # one structured line per scale event
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("event=scale")]
    assert lines == ["event=scale from_replicas=1 to_replicas=2 utilisation=1.000 reason=" + ctl.events[0].reason,
                     "event=scale from_replicas=2 to_replicas=4 utilisation=1.000 reason=" + ctl.events[1].reason]


def test_router_sampler_reports_load_over_ready_capacity() -> None:
    router = Router([Upstream("a", "http://127.0.0.1:1", capacity=4), Upstream("b", "http://127.0.0.1:2",
                                                                                capacity=4)])
    _, router.health = hp.record_check(router.health, "a", True, 0.0, router.config.health)
    router.replicas["a"].outstanding = 3
    router.counters["requests"] = 10
    sample = router_sampler(router)
    first = sample(1.0)
    assert first.ready_replicas == 1 and first.utilisation == 0.75 and first.queue_depth == 3
    router.counters["requests"] = 30
    assert sample(3.0).requests_per_s == 10.0


async def test_controller_adds_a_real_replica_under_load_and_removes_it_when_idle() -> None:
    router = Router([], ProxyConfig(policy="least_outstanding", check_interval_s=0.05, shedding=False),
                    rng=random.Random(0))
    manager = LocalReplicaManager(fake_command(delay_ms=50.0), ReplicaManagerConfig(capacity=4),
                                  on_change=router.set_upstreams)
    cfg = AutoscalerConfig(window_s=0.5, scale_down_stabilisation_s=1.5, cooldown_s=0.0, scale_up_period_s=0.5,
                           max_replicas=2, warm_pool=0)
    ctl = AutoscalerController(router_sampler(router), manager, cfg, MonotonicClock(), sample_interval_s=0.05,
                               sync_interval_s=0.25)
    try:
        await manager.scale_to(1, 0)
        async with serve_asgi(router.app, lifespan="on") as url, httpx.AsyncClient(base_url=url) as client:
            await wait_ready(router, 1)
            task = asyncio.create_task(ctl.run())
            sem = asyncio.Semaphore(4)  # keeps the single replica's 4 slots full: 100% utilisation

            async def one(i: int) -> int:
                async with sem:
                    r = await client.post("/v2/models/m/infer", content=orjson.dumps({"i": i}))
                    return r.status_code

            for _ in range(200):  # load until the second replica serves
                codes = await asyncio.gather(*(one(i) for i in range(8)))
                assert set(codes) == {200}
                if len(manager.serving()) == 2:
                    break
            assert len(manager.serving()) == 2 and ctl.events[0].to_replicas == 2
            for _ in range(200):  # idle: back to one after the stabilisation window
                await asyncio.sleep(0.05)
                if len(manager.serving()) == 1:
                    break
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert [e.to_replicas for e in ctl.events] == [2, 1]
    finally:
        await manager.close()
