"""The dashboard's fleet view: the router's registry read over a window, on a fake clock (pure parts), and
through a real router in front of two real replicas (the endpoint)."""

from __future__ import annotations

import asyncio
import random

import httpx
from prometheus_client import CollectorRegistry

from headroom.core.clock import FakeClock
from headroom.router.fake_replica import ReplicaBehaviour, make_app, serve_asgi
from headroom.router.fleet_view import FleetSampler, fleet_json
from headroom.router.metrics import ReplicaView, RouterMetrics, RouterView
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.snapshot import ReplicaSnapshot
from headroom.router.upstream import Upstream


def test_rates_percentiles_and_states_per_replica_over_the_window() -> None:
    clock = FakeClock()
    counts = {"a": [0, 0], "b": [0, 0]}  # requests, failures

    def view() -> RouterView:
        snaps = {"a": ReplicaSnapshot("a", outstanding=2, ewma_latency_s=0.02),
                 "b": ReplicaSnapshot("b", ejected_until_s=clock.now_s() + 30.0)}
        reps = tuple(ReplicaView(snaps[r], f"http://{r}", c[0], c[1]) for r, c in counts.items())
        return RouterView(clock.now_s(), {"requests": 0}, 3, None, reps)

    registry = CollectorRegistry()
    metrics = RouterMetrics(registry, view)
    sampler = FleetSampler(registry, clock, window_s=5.0)
    clock.advance(5.0)
    for _ in range(50):
        counts["a"][0] += 1
        metrics.observe_attempt("a", "ok", 0.02)
    for _ in range(10):
        counts["b"][0] += 1
        counts["b"][1] += 1
        metrics.observe_attempt("b", "server_error", 0.3)
    point = sampler.point()
    a, b = point.replicas
    assert (a.replica, a.state, b.replica, b.state) == ("a", "ready", "b", "ejected")
    assert a.rate_per_s == 10.0 and a.failure_rate_per_s == 0.0 and b.failure_rate_per_s == 2.0
    assert a.p99_s is not None and 0.01 < a.p99_s <= 0.025 and b.p50_s is not None and 0.25 < b.p50_s <= 0.5
    assert a.outstanding == 2 and a.ewma_latency_s == 0.02 and point.inflight == 3 and point.window_s == 5.0
    clock.advance(10.0)  # a quiet window: rates fall to 0, nothing to take a percentile of
    quiet = sampler.point()
    assert quiet.replicas[0].rate_per_s == 0.0 and quiet.replicas[0].p99_s is None
    assert fleet_json(quiet)["replicas"][0]["replica"] == "a"


async def test_the_router_serves_the_page_and_every_replicas_numbers() -> None:
    reps = [ReplicaBehaviour(name="r1"), ReplicaBehaviour(name="r2")]
    async with serve_asgi(make_app(reps[0])) as u1, serve_asgi(make_app(reps[1])) as u2:
        router = Router([Upstream("r1", u1), Upstream("r2", u2)], ProxyConfig(policy="round_robin"),
                        rng=random.Random(0))
        async with serve_asgi(router.app, lifespan="on") as url, httpx.AsyncClient(base_url=url) as client:
            for _ in range(400):  # the first readiness sweep
                if all(s.ready for s in router.snapshots()):
                    break
                await asyncio.sleep(0.01)
            page = await client.get("/dashboard")
            assert page.status_code == 200 and 'id="fleet"' in page.text
            for _ in range(20):
                assert (await client.post("/v2/models/m/infer", content=b"{}")).status_code == 200
            doc = (await client.get("/dashboard/api/fleet")).json()
    by_id = {r["replica"]: r for r in doc["replicas"]}
    assert set(by_id) == {"r1", "r2"} and all(r["state"] == "ready" for r in by_id.values())
    assert all(r["rate_per_s"] > 0 and r["p99_s"] is not None for r in by_id.values())
