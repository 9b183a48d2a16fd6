"""The router's own /metrics (parsed with prometheus_client) and Prometheus service discovery of its replicas."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from headroom.router.fake_replica import ReplicaBehaviour
from headroom.router.metrics import CacheAwareView, RouterMetrics, RouterView
from headroom.router.proxy import ProxyConfig
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
