"""The router process against real upstream HTTP servers on 127.0.0.1 (in-process uvicorn)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence

import httpx
import orjson
import pytest

from headroom.router.fake_replica import ReplicaBehaviour, make_app, serve_asgi
from headroom.router.health import HealthConfig
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.tail import BudgetConfig, HedgeConfig
from headroom.router.upstream import Upstream

INFER = "/v2/models/m/infer"


@contextlib.asynccontextmanager
async def fleet(behaviours: Sequence[ReplicaBehaviour], config: ProxyConfig, capacity: int = 8,
                versions: Sequence[str] = ()) -> AsyncIterator[tuple[Router, httpx.AsyncClient]]:
    """Start the replicas and a router in front of them; yield the router and a client pointed at it."""
    async with contextlib.AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(serve_asgi(make_app(b))) for b in behaviours]
        versions = tuple(versions) or ("",) * len(behaviours)
        router = Router([Upstream(b.name, u, capacity=capacity, version=v)
                         for b, u, v in zip(behaviours, urls, versions, strict=True)], config, rng=random.Random(0))
        router_url = await stack.enter_async_context(serve_asgi(router.app, lifespan="on"))
        for _ in range(200):  # the first readiness sweep
            if any(s.ready for s in router.snapshots()):
                break
            await asyncio.sleep(0.01)
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=router_url, timeout=10.0))
        yield router, client


async def _load(client: httpx.AsyncClient, n: int, concurrency: int) -> list[httpx.Response]:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> httpx.Response:
        async with sem:
            return await client.post(INFER, content=orjson.dumps({"i": i}))

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def test_passes_json_and_sse_through_and_names_the_replica() -> None:
    reps = [ReplicaBehaviour(name="a"), ReplicaBehaviour(name="b")]
    async with fleet(reps, ProxyConfig(policy="round_robin")) as (_, client):
        names = set()
        for _ in range(4):
            r = await client.post(INFER, content=b'{"x": 1}')
            assert r.status_code == 200 and r.json()["echo_bytes"] == 8
            names.add(r.headers["x-headroom-replica"])
        assert names == {"a", "b"}
        async with client.stream("POST", "/v1/completions", json={"max_tokens": 3}) as s:
            assert s.headers["content-type"].startswith("text/event-stream")
            events = [line async for line in s.aiter_lines() if line.startswith("data:")]
        assert len(events) == 4 and events[-1] == "data: [DONE]"
        stats = (await client.get("/router/stats")).json()
        assert stats["counters"]["requests"] == 5 and stats["inflight"] == 0
        assert all(r["outstanding"] == 0 for r in stats["replicas"])


@pytest.mark.parametrize(("policy", "max_share"), [("peak_ewma", 0.10), ("p2c", 0.15)])
async def test_a_five_times_slower_replica_is_avoided(policy: str, max_share: float) -> None:
    """Round robin would give the slow replica 25%.

    Through real sockets on a shared 2-core machine each hop adds tens of milliseconds, so the slow replica
    looks ~3x (not 5x) slower end to end; peak-EWMA still keeps it well under 10% (measured 2-4%), plain
    least-request P2C, which sends to any idle replica, at about 9-11%. The fake-clock simulation in
    test_policies checks both < 10% at a true 5x.
    """
    reps = [ReplicaBehaviour(name=f"r{i}", delay_ms=50.0, concurrency=1) for i in range(3)]
    reps.append(ReplicaBehaviour(name="slow", delay_ms=250.0, concurrency=1))
    async with fleet(reps, ProxyConfig(policy=policy, shedding=False)) as (_, client):
        await _load(client, 24, concurrency=3)  # warm-up: every replica gets latency samples
        responses = await _load(client, 120, concurrency=3)
    assert all(r.status_code == 200 for r in responses)
    share = Counter(r.headers["x-headroom-replica"] for r in responses)["slow"] / len(responses)
    assert share < max_share


async def test_not_ready_replicas_get_no_traffic_until_ready() -> None:
    reps = [ReplicaBehaviour(name="up"), ReplicaBehaviour(name="loading", ready=False)]
    async with fleet(reps, ProxyConfig(policy="round_robin", check_interval_s=0.05)) as (router, client):
        responses = await _load(client, 20, concurrency=2)
        assert {r.headers["x-headroom-replica"] for r in responses} == {"up"}
        reps[1].ready = True
        for _ in range(100):
            if all(s.ready for s in router.snapshots()):
                break
            await asyncio.sleep(0.02)
        responses = await _load(client, 20, concurrency=2)
        assert {r.headers["x-headroom-replica"] for r in responses} == {"up", "loading"}


async def test_five_consecutive_5xx_eject_a_replica() -> None:
    reps = [ReplicaBehaviour(name="ok1"), ReplicaBehaviour(name="ok2"), ReplicaBehaviour(name="bad", fail_status=500)]
    async with fleet(reps, ProxyConfig(policy="round_robin", health=HealthConfig())) as (router, client):
        statuses = [(await client.post(INFER, content=b"{}")).status_code for _ in range(60)]
        assert statuses.count(500) == 5  # then it is ejected for 30 s and only the healthy ones answer
        assert statuses[-20:] == [200] * 20
        assert router.replicas["bad"].requests == 5


async def test_never_started_requests_are_retried_elsewhere() -> None:
    reps = [ReplicaBehaviour(name="a"), ReplicaBehaviour(name="b")]
    # Enough retry tokens up front and no time-based refill: the 5 retries this needs must not depend on how
    # many wall-clock seconds the run takes (the default budget refills 1 token/s, which made this flaky).
    budget = BudgetConfig(budget_fraction=0.2, max_tokens=10.0, min_per_s=0.0, initial_tokens=10.0)
    cfg = ProxyConfig(policy="round_robin", check_interval_s=3600.0,  # the router will not notice the drain
                      retry_budget=budget)
    async with fleet(reps, cfg) as (router, client):
        reps[0].draining = True  # answers 503 not_ready: the request never started there
        responses = await _load(client, 10, concurrency=1)
        assert [r.status_code for r in responses] == [200] * 10
        assert {r.headers["x-headroom-replica"] for r in responses} == {"b"}
        assert router.counters["retries"] >= 1


async def test_retry_budget_stops_a_retry_storm() -> None:
    reps = [ReplicaBehaviour(name=f"r{i}") for i in range(3)]
    cfg = ProxyConfig(policy="round_robin", check_interval_s=3600.0)
    t0 = time.monotonic()  # the router's budget clock starts when the router is built
    async with fleet(reps, cfg) as (router, client):
        for b in reps:
            b.draining = True
        responses = await _load(client, 100, concurrency=4)
        elapsed = time.monotonic() - t0
    assert {r.status_code for r in responses} == {503}
    assert all(r.json()["reason"] == "not_ready" for r in responses)
    budget = cfg.retry_budget
    allowed = budget.budget_fraction * 100 + budget.initial_tokens + budget.min_per_s * elapsed
    assert 0 < router.counters["retries"] <= allowed
    assert sum(rt.requests for rt in router.replicas.values()) <= 100 + allowed


async def test_shedding_at_twice_capacity_rejects_before_replicas_overflow() -> None:
    reps = [ReplicaBehaviour(name="a", delay_ms=300.0, concurrency=4),
            ReplicaBehaviour(name="b", delay_ms=300.0, concurrency=4)]
    async with fleet(reps, ProxyConfig(policy="least_outstanding"), capacity=4) as (router, client):
        loop = asyncio.get_running_loop()

        async def timed() -> tuple[httpx.Response, float]:
            t0 = loop.time()
            r = await client.post(INFER, content=b"{}")
            return r, loop.time() - t0

        results = await asyncio.gather(*(timed() for _ in range(16)))  # 2x the fleet's capacity of 8
    accepted = [t for r, t in results if r.status_code == 200]
    rejected = [(r, t) for r, t in results if r.status_code == 503]
    assert len(accepted) + len(rejected) == 16 and 6 <= len(accepted) <= 8 and rejected
    for r, t in rejected:
        assert r.json()["reason"] == "overloaded" and int(r.headers["retry-after"]) >= 1
        assert t < min(accepted)  # rejected without waiting for any replica's work
    assert max(b.served for b in reps) <= 4  # no replica held more than its capacity
    assert router.counters["shed"] == len(rejected)


async def test_hedging_cuts_stalls_within_the_budget() -> None:
    reps = [ReplicaBehaviour(name=n, delay_ms=3.0, stall_every=60, stall_offset=k * 30, stall_ms=2000.0)
            for k, n in enumerate(("a", "b"))]
    cfg = ProxyConfig(policy="round_robin", hedging=True, hedge=HedgeConfig(percentile=0.99, min_samples=20))
    async with fleet(reps, cfg) as (router, client):
        latencies = []
        for i in range(220):
            t0 = time.monotonic()
            r = await client.post(INFER, content=orjson.dumps({"i": i}))
            latencies.append(time.monotonic() - t0)
            assert r.status_code == 200
    assert sum(b.stalls for b in reps) >= 3  # the replicas did stall (~1.5% of their requests)...
    assert sum(b.stalls_completed for b in reps) == 0  # ...every stalled copy lost its race and was cancelled
    assert max(latencies) < 2.0  # so no client waited out a 2 s stall
    assert router.counters["hedges"] <= 0.05 * 220  # the bucket starts empty: at most 5% extra



async def test_affinity_keeps_a_user_on_one_replica() -> None:
    reps = [ReplicaBehaviour(name=f"r{i}") for i in range(3)]
    async with fleet(reps, ProxyConfig(policy="affinity")) as (_, client):
        for user in ("alice", "bob"):
            seen = {(await client.post(INFER, json={"user": user})).headers["x-headroom-replica"]
                    for _ in range(10)}
            assert len(seen) == 1
        seen = {(await client.post(INFER, content=b"{}", headers={"x-session-id": "s1"})).headers[
            "x-headroom-replica"] for _ in range(10)}
        assert len(seen) == 1


async def test_a_client_that_goes_away_cancels_the_replica_work() -> None:
    reps = [ReplicaBehaviour(name="a", delay_ms=5000.0)]
    async with fleet(reps, ProxyConfig()) as (router, client):
        with pytest.raises(httpx.ReadTimeout):
            await client.post(INFER, content=b"{}", timeout=0.3)
        for _ in range(200):
            if reps[0].cancelled:
                break
            await asyncio.sleep(0.01)
        assert reps[0].cancelled == 1 and reps[0].served == 0
        assert router.counters["cancelled"] == 1 and router.inflight == 0
        assert router.replicas["a"].outstanding == 0


async def test_adaptive_concurrency_limit_rejects_beyond_the_limit_then_learns() -> None:
    reps = [ReplicaBehaviour(name="a", delay_ms=200.0, concurrency=8)]
    cfg = ProxyConfig(shedding=False, adaptive_concurrency=True)
    async with fleet(reps, cfg) as (router, client):
        first = await asyncio.gather(*(client.post(INFER, content=b"{}") for _ in range(6)))
        codes = Counter(r.status_code for r in first)
        assert codes == Counter({200: 3, 503: 3})  # minRTT is probed at a pinned concurrency of 3
        assert all(r.json()["reason"] == "overloaded" for r in first if r.status_code == 503)
        assert not router.vegas.probing and router.vegas.min_rtt_s > 0
        second = await asyncio.gather(*(client.post(INFER, content=b"{}") for _ in range(6)))
        assert {r.status_code for r in second} == {200}  # the learned limit (20) admits them all
        assert router.counters["limited"] == 3


async def test_a_client_leaving_mid_stream_frees_the_replica_without_blaming_it() -> None:
    reps = [ReplicaBehaviour(name="a", delay_ms=20.0)]
    async with fleet(reps, ProxyConfig()) as (router, client):
        async with client.stream("POST", "/v1/completions", json={"max_tokens": 200}) as s:
            lines = s.aiter_lines()
            assert (await anext(lines)).startswith("data:")
        for _ in range(200):
            if router.replicas["a"].outstanding == 0 and reps[0].inflight == 0:
                break
            await asyncio.sleep(0.01)
        assert router.replicas["a"].outstanding == 0 and reps[0].inflight == 0  # the replica stopped too
        assert router.replicas["a"].failures == 0 and reps[0].served == 1


async def test_an_oversized_body_gets_413_before_it_is_buffered_or_forwarded() -> None:
    """The router's body limit (gateway.limits.read_body): a declared Content-Length over it is refused before
    reading, a chunked body without one as soon as the bytes received pass it; no replica sees either."""
    reps = [ReplicaBehaviour(name="a")]
    async with fleet(reps, ProxyConfig(policy="round_robin", max_body_bytes=1000)) as (router, client):
        declared = await client.post(INFER, content=b"x" * 1001)
        assert declared.status_code == 413 and "limit of 1000 bytes" in declared.json()["error"]

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(20):
                yield b"y" * 100

        streamed = await client.post(INFER, content=chunks())  # no Content-Length: chunked
        assert streamed.status_code == 413 and declared.json()["reason"] == streamed.json()["reason"]
        ok = await client.post(INFER, content=b"z" * 1000)
        assert ok.status_code == 200 and ok.json()["echo_bytes"] == 1000
        assert router.counters["requests"] == 1  # only the body within the limit was routed
