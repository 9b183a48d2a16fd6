"""The router's own /metrics (parsed with prometheus_client) and Prometheus service discovery of its replicas."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from headroom.router.fake_replica import ReplicaBehaviour
from headroom.router.health import HealthConfig
from headroom.router.metrics import CacheAwareView, RouterMetrics, RouterView
from headroom.router.proxy import ProxyConfig
from headroom.router.tail import BudgetConfig
from headroom.router.upstream import Upstream
from tests.router.test_proxy import INFER, _load, fleet


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_count_every_request_per_replica_and_forget_removed_ones() -> None:
    reps = [ReplicaBehaviour(name="a"), ReplicaBehaviour(name="b")]
    async with fleet(reps, ProxyConfig(policy="round_robin")) as (router, client):
        responses = await _load(client, 10, concurrency=2)
        assert all(r.status_code == 200 for r in responses)
        page = await client.get("/metrics")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain")
        m = _samples(page.text)
        assert m[("headroom_router_requests_total", ())] == 10
        assert m[("headroom_router_replica_requests_total", (("replica", "a"),))] == 5
        assert m[("headroom_router_replica_requests_total", (("replica", "b"),))] == 5
        assert m[("headroom_router_replicas", (("state", "ready"),))] == 2
        assert m[("headroom_router_replica_ready", (("replica", "a"),))] == 1
        assert m[("headroom_router_inflight", ())] == 0
        ok = [v for (name, labels), v in m.items()
              if name == "headroom_router_attempt_latency_seconds_count" and ("outcome", "ok") in labels]
        assert sum(ok) == 10
        assert not page.headers.get("x-headroom-replica")  # served by the router, not proxied to a replica

        sd = (await client.get("/metrics/replicas")).json()
        assert sorted(g["labels"]["replica"] for g in sd) == ["a", "b"]
        urls = {u.replica_id: u.base_url for u in (rt.upstream for rt in router.replicas.values())}
        assert {g["labels"]["replica"]: g["targets"][0] for g in sd} == {
            rid: url.removeprefix("http://") for rid, url in urls.items()}

        router.set_upstreams([Upstream("a", urls["a"])])  # b is scaled away: its series go with it
        m = _samples((await client.get("/metrics")).text)
        assert not [k for k in m if ("replica", "b") in k[1]]
        assert ("headroom_router_replica_requests_total", (("replica", "a"),)) in m


async def test_router_stats_still_reports_json() -> None:
    async with fleet([ReplicaBehaviour(name="a")], ProxyConfig()) as (_, client):
        await client.post(INFER, content=b"{}")
        doc = (await client.get("/router/stats")).json()
        assert doc["counters"]["requests"] == 1 and doc["replicas"][0]["id"] == "a"


def test_cache_aware_decisions_and_matched_tokens_are_exported() -> None:
    view = RouterView(0.0, {"requests": 5}, 0, None, (), cache_aware=CacheAwareView(
        {"cache_hit": 3, "cache_place": 1, "unhashed": 1}, matched_tokens=96, prompt_tokens=160, polls_failed=2,
        published_blocks={"r1": 40, "r2": 0}))
    registry = CollectorRegistry()
    RouterMetrics(registry, lambda: view)
    m = _samples(generate_latest(registry).decode())
    decisions = {dict(labels)["reason"]: v for (name, labels), v in m.items()
                 if name == "headroom_router_cache_aware_decisions_total"}
    assert decisions == {"cache_hit": 3, "cache_spill": 0, "cache_place": 1, "fallback": 0, "unhashed": 1}
    assert m[("headroom_router_cache_aware_matched_tokens_total", ())] == 96
    assert m[("headroom_router_cache_aware_prompt_tokens_total", ())] == 160
    assert m[("headroom_router_cache_aware_poll_failures_total", ())] == 2
    assert m[("headroom_router_cache_aware_published_blocks", (("replica", "r1"),))] == 40
    plain = CollectorRegistry()  # another policy: no cache_aware families
    RouterMetrics(plain, lambda: RouterView(0.0, {}, 0, None, ()))
    assert b"cache_aware" not in generate_latest(plain)


async def test_retries_hedges_and_ejections_are_counted_per_replica(caplog: pytest.LogCaptureFixture) -> None:
    """A draining replica's requests are retried elsewhere (counted against it); a failing one is ejected after
    five 5xx in a row (counted, and one structured log line); tied copies are counted where they went."""
    budget = BudgetConfig(budget_fraction=0.2, max_tokens=10.0, min_per_s=0.0, initial_tokens=10.0)
    reps = [ReplicaBehaviour(name="drain"), ReplicaBehaviour(name="bad", fail_status=500), ReplicaBehaviour(name="ok")]
    cfg = ProxyConfig(policy="round_robin", check_interval_s=3600.0, retry_budget=budget, health=HealthConfig())
    with caplog.at_level(logging.WARNING, logger="headroom.router"):
        async with fleet(reps, cfg) as (router, client):
            reps[0].draining = True  # after the first readiness sweep: the router learns it from the answers
            for _ in range(30):
                await client.post(INFER, content=b"{}")
            m = _samples((await client.get("/metrics")).text)
    retries = {dict(k)["replica"]: v for (name, k), v in m.items() if name == "headroom_router_replica_retries_total"}
    assert retries["drain"] >= 1 and retries["ok"] == 0, retries
    ejections = {dict(k)["replica"]: v for (name, k), v in m.items()
                 if name == "headroom_router_replica_ejections_total"}
    assert ejections == {"drain": 0, "bad": 1, "ok": 0}, ejections
    assert m[("headroom_router_events_total", (("event", "retries"),))] == sum(retries.values())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("event=ejected")]
    assert len(lines) == 1 and "replica=bad" in lines[0], lines

    tied = ProxyConfig(policy="round_robin", tied=True, tied_delay_s=0.002,
                       hedge_budget=BudgetConfig(budget_fraction=1.0, max_tokens=10.0, initial_tokens=10.0))
    async with fleet([ReplicaBehaviour(name="a", delay_ms=30.0), ReplicaBehaviour(name="b", delay_ms=30.0)],
                     tied) as (router, client):
        for _ in range(6):
            assert (await client.post(INFER, content=b"{}")).status_code == 200
        m = _samples((await client.get("/metrics")).text)
    copies = {dict(k)["replica"]: v for (name, k), v in m.items() if name == "headroom_router_replica_hedges_total"}
    assert sum(copies.values()) == router.counters["tied"] >= 5, copies  # each copy counted where it went
