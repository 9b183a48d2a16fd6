"""The router's own Prometheus metrics, so a fleet can be watched as a fleet.

`GET /metrics` on the router serves these (and whatever else shares its registry: the gateway's refusals, the
autoscaler's desired replicas and scaling events), instead of proxying one replica's page:

    headroom_router_requests_total                      counter: requests the router accepted
    headroom_router_events_total{event}                 counter: shed | limited | retries | retries_denied |
                                                        hedges | hedge_wins | no_replica | upstream_failed |
                                                        degraded | degraded_on_error | tied | tied_unsent |
                                                        tied_withdrawn | cancelled
    headroom_router_inflight                            gauge: requests in the router now
    headroom_router_concurrency_limit                   gauge: the adaptive (Vegas) limit, when enabled
    headroom_router_replicas{state}                     gauge: replicas by state (ready | ejected | not_ready)
    headroom_router_replica_requests_total{replica}     counter: attempts sent to the replica
    headroom_router_replica_failures_total{replica}     counter: attempts that failed there
    headroom_router_replica_retries_total{replica}      counter: requests sent again elsewhere after failing there
    headroom_router_replica_hedges_total{replica}       counter: hedged (or tied) backup copies sent there
    headroom_router_replica_ejections_total{replica}    counter: times passive outlier detection ejected it
    headroom_router_replica_outstanding{replica}        gauge: attempts in flight there
    headroom_router_replica_ready{replica}              gauge: 1 when it passes readiness checks
    headroom_router_replica_ejected{replica}            gauge: 1 while passive outlier detection ejects it
    headroom_router_replica_ewma_latency_seconds{replica}  gauge: the peak-EWMA latency the policies use
    headroom_router_attempt_latency_seconds{replica,outcome}  histogram: every finished attempt

With the ``cache_aware`` policy (`headroom.router.prefix_index`):

    headroom_router_cache_aware_decisions_total{reason}  counter: cache_hit (the longest cached prefix) |
                                                        cache_spill (a shorter one: the longest was overloaded) |
                                                        cache_place (cached nowhere: the emptiest cache) |
                                                        fallback (every replica overloaded: by load) |
                                                        unhashed (no key: no tokenizer or tenant, unknown model,
                                                        unreadable prompt; by load) | none (no replica)
    headroom_router_cache_aware_matched_tokens_total    counter: prompt tokens cached on the replica chosen
    headroom_router_cache_aware_prompt_tokens_total     counter: prompt tokens (full blocks) hashed
    headroom_router_cache_aware_poll_failures_total     counter: block lists missing or malformed
    headroom_router_cache_aware_published_blocks{replica}  gauge: KV blocks the replica published at the last poll

The counters and gauges are read from the router when Prometheus scrapes (a collector: nothing to keep in sync);
only the latency histogram is observed per attempt. `GET /metrics/replicas` is Prometheus HTTP service
discovery (`http_sd_configs`): one target per replica, so Prometheus scrapes every replica's own `/metrics`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from headroom.core.clock import Clock, MonotonicClock
from headroom.router.fleet_view import FleetSampler, fleet_json
from headroom.router.snapshot import ReplicaSnapshot

if TYPE_CHECKING:
    from headroom.router.proxy import Router

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What the metrics read of one replica at scrape time."""

    snapshot: ReplicaSnapshot
    base_url: str
    requests: int
    failures: int
    retried_away: int = 0
    hedges: int = 0
    ejections: int = 0


@dataclass(frozen=True, slots=True)
class RouterView:
    """What the metrics read of the router at scrape time."""

    now_s: float
    counters: Mapping[str, int]
    inflight: int
    concurrency_limit: float | None  # None when adaptive concurrency is off
    replicas: tuple[ReplicaView, ...]
    canary: Mapping[str, object] | None = None  # version, weight, phase of a running canary rollout
    cache_aware: CacheAwareView | None = None  # the cache_aware policy's decisions (None with other policies)


@dataclass(frozen=True, slots=True)
class CacheAwareView:
    """The cache_aware policy's decisions at scrape time."""

    decisions: Mapping[str, int]  # by reason
    matched_tokens: int
    prompt_tokens: int
    polls_failed: int
    published_blocks: Mapping[str, int] = field(default_factory=dict)  # per replica


class _RouterCollector(Collector):
    def __init__(self, read: Callable[[], RouterView]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        v = self._read()
        total = CounterMetricFamily("headroom_router_requests", "Requests the router accepted.")
        total.add_metric([], v.counters.get("requests", 0))
        yield total
        events = CounterMetricFamily("headroom_router_events", "Router decisions and failures, by event.",
                                     labels=["event"])
        for name, count in sorted(v.counters.items()):
            if name != "requests":
                events.add_metric([name], count)
        yield events
        yield GaugeMetricFamily("headroom_router_inflight", "Requests in the router now.", value=v.inflight)
        if v.concurrency_limit is not None:
            yield GaugeMetricFamily("headroom_router_concurrency_limit", "Adaptive concurrency limit.",
                                    value=v.concurrency_limit)
        yield from _replica_families(v)
        if v.cache_aware is not None:
            yield from _cache_aware_families(v.cache_aware)


def _cache_aware_families(c: CacheAwareView) -> Iterator[Metric]:
    decisions = CounterMetricFamily("headroom_router_cache_aware_decisions",
                                    "cache_aware routing decisions, by reason.", labels=["reason"])
    for reason in sorted({"cache_hit", "cache_spill", "cache_place", "fallback", "unhashed", *c.decisions}):
        decisions.add_metric([reason], c.decisions.get(reason, 0))
    yield decisions
    for name, text, value in (
            ("matched_tokens", "Prompt tokens cached on the replica chosen.", c.matched_tokens),
            ("prompt_tokens", "Prompt tokens (full KV blocks) the router hashed.", c.prompt_tokens),
            ("poll_failures", "Published block lists that were missing or malformed.", c.polls_failed)):
        yield CounterMetricFamily(f"headroom_router_cache_aware_{name}", text, value=value)
    published = GaugeMetricFamily("headroom_router_cache_aware_published_blocks",
                                  "KV blocks the replica published at the router's last poll.", labels=["replica"])
    for rid, blocks in sorted(c.published_blocks.items()):
        published.add_metric([rid], blocks)
    yield published


#: per-replica families: (name, help, counter?, value of one replica at `now_s`)
_PER_REPLICA: tuple[tuple[str, str, bool, Callable[[ReplicaView, float], float]], ...] = (
    ("headroom_router_replica_requests", "Attempts sent to the replica.", True, lambda r, _: r.requests),
    ("headroom_router_replica_failures", "Attempts that failed on the replica.", True, lambda r, _: r.failures),
    ("headroom_router_replica_retries", "Requests sent again elsewhere after failing on the replica.", True,
     lambda r, _: r.retried_away),
    ("headroom_router_replica_hedges", "Hedged (or tied) backup copies sent to the replica.", True,
     lambda r, _: r.hedges),
    ("headroom_router_replica_ejections", "Times passive outlier detection ejected the replica.", True,
     lambda r, _: r.ejections),
    ("headroom_router_replica_outstanding", "Attempts in flight on the replica.", False,
     lambda r, _: r.snapshot.outstanding),
    ("headroom_router_replica_ready", "1 when the replica passes readiness checks.", False,
     lambda r, _: float(r.snapshot.ready)),
    ("headroom_router_replica_ejected", "1 while outlier detection ejects the replica.", False,
     lambda r, now: float(r.snapshot.ejected(now))),
    ("headroom_router_replica_ewma_latency_seconds", "Peak-EWMA latency of the replica.", False,
     lambda r, _: r.snapshot.ewma_latency_s),
)


def _replica_families(v: RouterView) -> Iterator[Metric]:
    states = {"ready": 0, "ejected": 0, "not_ready": 0}
    for r in v.replicas:
        s = r.snapshot
        states["not_ready" if not s.ready else "ejected" if s.ejected(v.now_s) else "ready"] += 1
    by_state = GaugeMetricFamily("headroom_router_replicas", "Replicas by state.", labels=["state"])
    for state, count in states.items():
        by_state.add_metric([state], count)
    yield by_state
    for name, text, counter, value in _PER_REPLICA:
        family = (CounterMetricFamily if counter else GaugeMetricFamily)(name, text, labels=["replica"])
        for r in v.replicas:
            family.add_metric([r.snapshot.replica_id], value(r, v.now_s))
        yield family


class RouterMetrics:
    """The router's families on one injected registry (never prometheus_client's global one)."""

    def __init__(self, registry: CollectorRegistry, read: Callable[[], RouterView]) -> None:
        self.registry = registry
        registry.register(_RouterCollector(read))
        self._latency = Histogram("headroom_router_attempt_latency_seconds", "Finished attempts, by replica.",
                                  ["replica", "outcome"], buckets=LATENCY_BUCKETS_S, registry=registry)
        self._series: set[tuple[str, str]] = set()  # (replica, outcome) label pairs observed

    def observe_attempt(self, replica_id: str, outcome: str, latency_s: float) -> None:
        self._series.add((replica_id, outcome))
        self._latency.labels(replica_id, outcome).observe(latency_s)

    def forget(self, replica_id: str) -> None:
        """Drop a removed replica's latency series (its counters vanish with it from the collector)."""
        for labels in [p for p in self._series if p[0] == replica_id]:
            self._series.discard(labels)
            self._latency.remove(*labels)


def service_discovery(replicas: tuple[ReplicaView, ...]) -> list[dict[str, object]]:
    """Prometheus `http_sd_configs` targets: one group per replica, labelled with its id and readiness."""
    groups: list[dict[str, object]] = []
    for r in replicas:
        parts = urlsplit(r.base_url)
        groups.append({
            "targets": [parts.netloc],
            "labels": {"replica": r.snapshot.replica_id, "__scheme__": parts.scheme or "http",
                       "ready": "true" if r.snapshot.ready else "false"},
        })
    return groups


def stats_document(v: RouterView) -> dict[str, object]:
    """`GET /router/stats`: the same view as JSON, for people and scripts."""
    reps = [{"id": r.snapshot.replica_id, "url": r.base_url, "ready": r.snapshot.ready,
             "ejected": r.snapshot.ejected(v.now_s), "outstanding": r.snapshot.outstanding,
             "ewma_latency_ms": r.snapshot.ewma_latency_s * 1e3, "requests": r.requests, "failures": r.failures,
             "retries": r.retried_away, "hedges": r.hedges, "ejections": r.ejections, "version": r.snapshot.version}
            for r in v.replicas]
    return {"counters": dict(v.counters), "replicas": reps, "inflight": v.inflight,
            "concurrency_limit": v.concurrency_limit, "canary": v.canary}


def admin_routes(read: Callable[[], RouterView], registry: CollectorRegistry, clock: Clock | None = None,
                 fleet_window_s: float = 5.0) -> list[Route]:
    """The router's own endpoints: `/router/stats` (JSON), `/metrics` (Prometheus), `/metrics/replicas` (SD),
    and the dashboard with its fleet view (`/dashboard`, `/dashboard/api/fleet`; the page's per-model view,
    `/dashboard/api/live`, is proxied to a replica like any other path)."""
    fleet = FleetSampler(registry, clock or MonotonicClock(), fleet_window_s)
    page = resources.files("headroom.dashboard").joinpath("page.html").read_text(encoding="utf-8")  # data only

    async def dashboard(request: Request) -> Response:
        return HTMLResponse(page)

    async def fleet_api(request: Request) -> Response:
        return Response(orjson.dumps(fleet_json(fleet.point())), media_type="application/json",
                        headers={"cache-control": "no-store"})

    async def stats(request: Request) -> Response:
        return Response(orjson.dumps(stats_document(read())), media_type="application/json")

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def discovery(request: Request) -> Response:
        return Response(orjson.dumps(service_discovery(read().replicas)), media_type="application/json")

    return [Route("/router/stats", stats, methods=["GET"]), Route("/metrics", metrics, methods=["GET"]),
            Route("/metrics/replicas", discovery, methods=["GET"]), Route("/dashboard", dashboard, methods=["GET"]),
            Route("/dashboard/api/fleet", fleet_api, methods=["GET"])]


def router_view(router: Router) -> RouterView:
    """What `/metrics` reads at scrape time."""
    limit = router.vegas.effective_limit(router.config.vegas) if router.config.adaptive_concurrency else None
    runtimes = router.replicas
    reps = tuple(ReplicaView(s, runtimes[s.replica_id].upstream.base_url, runtimes[s.replica_id].requests,
                             runtimes[s.replica_id].failures, runtimes[s.replica_id].retried_away,
                             runtimes[s.replica_id].hedges, runtimes[s.replica_id].ejections)
                 for s in router.snapshots())
    canary = None if router.canary is None else {"version": router.canary.canary_version,
                                                 "weight": router.canary.weight, "phase": router.canary.state.phase}
    p = router.prefix
    cache = None if p is None else CacheAwareView(dict(p.decisions), p.matched_tokens, p.prompt_tokens,
                                                  p.polls_failed, p.published_blocks())
    return RouterView(router.clock.now_s(), dict(router.counters), router.inflight, limit, reps, canary, cache)
