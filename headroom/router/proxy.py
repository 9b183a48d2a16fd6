"""The router process: an asyncio HTTP reverse proxy in front of N replicas, driven by the pure policies.

Per request: coordinated shedding (503 + Retry-After without touching a replica) -> optional adaptive
concurrency limit -> `choose` a replica -> send over a pooled keep-alive `httpx.AsyncClient` -> optionally
hedge to a second replica after the p95 of recent latency (budgeted, the loser is cancelled) -> retry
elsewhere, under the retry budget, attempts that never started (connection refused, a replica not ready or
answering 503 `x-headroom-draining: 1`) and, on idempotent routes (V2 inference, embeddings, LLM generation),
attempts whose connection was lost before any answer byte reached the client -> pass the answer through
(small bodies buffered, SSE and large bodies streamed once their first chunk arrived). A background task
checks `GET /v2/health/ready` on every replica (policy ``cache_aware``: also the KV blocks it holds,
`headroom.router.prefix_index`); results and every finished attempt feed `headroom.router.health`.
`/router/stats`, `/metrics` and `/metrics/replicas` (Prometheus service discovery): `headroom.router.metrics`.

W3C `traceparent`/`tracestate` go to the replica as sent, or, with a `tracer_provider`, the traceparent of the
router's own SERVER span (`router`) so the replica's spans nest under it. The replica learns the tenant the
router's gateway authenticated in `x-headroom-tenant` (`headroom.gateway.forwarded_tenant`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Collection, Sequence

import httpx
from opentelemetry.trace import TracerProvider
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from headroom.core.clock import Clock, MonotonicClock
from headroom.core.errors import Cancelled, DeadlineExceeded, HeadroomError, Overloaded
from headroom.gateway.forwarded_tenant import forwarded_headers
from headroom.gateway.limits import read_body
from headroom.router import degrade, tail
from headroom.router import health as hp
from headroom.router.attempts import attempts_or_fallback
from headroom.router.canary import CanaryTracker
from headroom.router.config import ProxyConfig
from headroom.router.metrics import RouterMetrics, admin_routes, router_view
from headroom.router.policies import choose
from headroom.router.prefix_index import PrefixIndex
from headroom.router.probes import probe_ready, record_probes
from headroom.router.prompt_hasher import PromptHasher
from headroom.router.request_keys import PrefixKey, RouteKey, request_key
from headroom.router.snapshot import ReplicaSnapshot, RouterState, routable
from headroom.router.upstream import HOP_BY_HOP, Attempt, ReplicaRuntime, Upstream
from headroom.router.wire import Outgoing, UpstreamFailed, disconnected, end_span_with, json_error, router_span

__all__ = ["ProxyConfig", "Router", "UpstreamFailed"]

log = logging.getLogger("headroom.router")


class Router:
    """Owns the replica table, the policy states, the pooled client and the health-check task."""

    def __init__(self, upstreams: Sequence[Upstream], config: ProxyConfig | None = None,
                 clock: Clock | None = None, rng: random.Random | None = None,
                 tracer_provider: TracerProvider | None = None,
                 registry: CollectorRegistry | None = None, prompt_hasher: PromptHasher | None = None) -> None:
        self.config = config or ProxyConfig()
        self.prefix = PrefixIndex.for_policy(self.config.policy, self.config.prefix_index, prompt_hasher)
        self.tracer_provider = tracer_provider  # records a `router` span per proxied request when set
        self.clock = clock or MonotonicClock()
        self.rng = rng or random.Random()
        self.replicas: dict[str, ReplicaRuntime] = {}
        self.health = hp.HealthState()
        self.route_state = RouterState()
        self.retry_state = self.config.retry_budget.fresh(self.clock.now_s())
        self.hedge_state = self.config.hedge_budget.fresh(self.clock.now_s())
        self.latencies = tail.LatencyWindow()
        self.vegas = tail.vegas_initial(self.config.vegas)
        self.inflight = 0
        self.canary = (CanaryTracker(self.config.canary_version, self.config.canary, self.clock.now_s())
                       if self.config.canary_version else None)
        self.counters = dict.fromkeys(("requests", "shed", "limited", "retries", "retries_denied", "hedges",
                                       "hedge_wins", "no_replica", "upstream_failed", "degraded",
                                       "degraded_on_error", "tied", "cancelled"), 0)
        self.breaker = degrade.BreakerState()  # per primary model: failures in a row, ejections
        self._client: httpx.AsyncClient | None = None
        self._checker: asyncio.Task[None] | None = None
        self._wake_checker = asyncio.Event()
        self.metrics = RouterMetrics(registry or CollectorRegistry(), lambda: router_view(self))
        self.set_upstreams(upstreams)
        self.app = Starlette(routes=[*admin_routes(lambda: router_view(self), self.metrics.registry),
                                     Route("/{path:path}", self.handle, methods=[
                                         "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])],
                             lifespan=self._lifespan)

    # ---------------------------------------------------------------------------------------- lifecycle
    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.close()

    async def start(self) -> None:
        c = self.config
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(c.request_timeout_s, connect=c.connect_timeout_s),
            limits=httpx.Limits(max_connections=c.max_connections, max_keepalive_connections=c.max_connections,
                                keepalive_expiry=c.keepalive_expiry_s))
        self._checker = asyncio.create_task(self._check_loop(), name="router-health-checks")

    async def close(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checker
            self._checker = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def set_upstreams(self, upstreams: Sequence[Upstream]) -> None:
        """Replace the replica set (replica manager / autoscaler). New replicas start not ready."""
        wanted = {u.replica_id: u for u in upstreams}
        for rid in list(self.replicas):
            if rid not in wanted:
                del self.replicas[rid]
                self.health = self.health.without(rid)
                self.metrics.forget(rid)
        for rid, u in wanted.items():
            if rid in self.replicas:
                self.replicas[rid].upstream = u
            else:
                self.replicas[rid] = ReplicaRuntime(u)
        self._wake_checker.set()

    # -------------------------------------------------------------------------------------- health checks
    async def check_once(self) -> None:
        """Probe every replica's readiness once, concurrently."""
        client = self._client
        if client is None:
            return
        runtimes = list(self.replicas.values())
        ready = await probe_ready(client, runtimes, self.config.check_timeout_s)
        if self.prefix is not None:  # cache_aware: the KV blocks each replica holds
            await self.prefix.poll(client, [rt.upstream for rt in runtimes], self.config.check_timeout_s)
        self.health = record_probes(self.health, runtimes, ready, self.replicas, self.clock.now_s(),
                                    self.config.health)

    async def _check_loop(self) -> None:
        while True:
            self._wake_checker.clear()
            await self.check_once()
            if self.canary is not None:
                now = self.clock.now_s()
                arm = [s for s in self.snapshots() if self.canary.in_arm("canary", s.version)]
                self.canary.evaluate(now, bool(arm) and all(s.ejected(now) for s in arm))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake_checker.wait(), self.config.check_interval_s)

    # ------------------------------------------------------------------------------------------ routing
    def snapshots(self) -> tuple[ReplicaSnapshot, ...]:
        return hp.apply([rt.snapshot() for rt in self.replicas.values()], self.health)

    def _record(self, attempt: Attempt, latency_s: float | None = None) -> None:
        if attempt.recorded:
            return
        attempt.recorded = True
        failed = attempt.failed
        if latency_s is None:
            latency_s = attempt.finish()
        if attempt.replica.upstream.replica_id not in self.replicas:
            return  # removed (drained) while this request was in flight
        self.metrics.observe_attempt(attempt.replica.upstream.replica_id, attempt.outcome, latency_s)
        event, self.health = hp.record_result(self.health, attempt.replica.upstream.replica_id, failed,
                                              self.clock.now_s(), self.config.health)
        if event is not None:
            log.warning("event=%s replica=%s until_s=%.1f", event.kind, event.replica_id, event.until_s)
        if attempt.outcome in ("connect_error", "draining"):
            self.mark_unready(attempt.replica.upstream.replica_id)
        if attempt.outcome == "ok":
            self.latencies = self.latencies.add(latency_s)
        if self.canary is not None and attempt.arm and not tail.retryable(attempt.outcome):
            self.canary.record(attempt.arm, failed, latency_s)

    async def _drop(self, attempt: Attempt) -> None:
        """Close a failed attempt's response (if any) and fold its outcome into health."""
        if attempt.response is not None:
            await attempt.response.aclose()
        self._record(attempt)

    def _arm(self) -> str:
        """Draw this request's rollout arm; an arm without a routable replica yields to the other."""
        if self.canary is None:
            return ""
        arm = self.canary.pick(self.rng)
        now = self.clock.now_s()
        if not any(self.canary.in_arm(arm, s.version) for s in routable(self.snapshots(), now)):
            arm = "baseline" if arm == "canary" else "canary"
        return arm

    def _pick(self, key: RouteKey, exclude: set[str], arm: str = "") -> ReplicaRuntime | None:
        snaps = [s for s in self.snapshots() if s.replica_id not in exclude
                 and (self.canary is None or not arm or self.canary.in_arm(arm, s.version))]
        now, blocks = self.clock.now_s(), key if isinstance(key, PrefixKey) else None
        snaps = self.prefix.stamp(snaps, blocks, now) if self.prefix is not None else snaps
        decision, self.route_state = choose(self.config.policy, snaps,
                                            key.placement_key() if isinstance(key, PrefixKey) else key,
                                            self.route_state, now, self.rng, self.config.routing)
        if self.prefix is not None:  # cache_aware: count the decision (/metrics), remember where the blocks went
            self.prefix.note_decision(decision.reason, decision.replica_id, blocks, now)
        return None if decision.replica_id is None else self.replicas[decision.replica_id]

    # ------------------------------------------------------------------- for other transports (gRPC)
    def pick(self, key: str | None = None, exclude: Collection[str] = ()) -> ReplicaRuntime | None:
        """Choose a replica with the configured policy; None when no replica is routable."""
        return self._pick(key, set(exclude), self._arm())

    def allow_retry(self) -> bool:
        """Withdraw one retry from the budget (HTTP and gRPC share it); counts the retry or its denial."""
        allowed, self.retry_state = tail.budget_withdraw(self.retry_state, self.clock.now_s(),
                                                         self.config.retry_budget)
        self.counters["retries" if allowed else "retries_denied"] += 1
        return allowed

    def mark_unready(self, replica_id: str) -> None:
        """The replica refused a connection or is draining: no new traffic there until a check passes."""
        event, self.health = hp.record_check(self.health, replica_id, False, self.clock.now_s(), self.config.health)
        if event is not None:
            log.info("event=not_ready replica=%s reason=refused_or_draining", replica_id)

    def admit(self) -> tail.ShedDecision:
        """The shedding decision for one new request (always admits when shedding is off)."""
        snaps = self.snapshots()
        undispatched = self.inflight - sum(s.outstanding for s in snaps)
        d = tail.shed(snaps, self.clock.now_s(), self.rng, self.config.shed, undispatched)
        self.counters["requests"] += 1
        if not self.config.shedding:
            return tail.ShedDecision(False, d.fraction, d.utilisation, d.retry_after_s)
        self.counters["shed"] += d.reject
        return d

    def observe(self, rt: ReplicaRuntime, failed: bool, latency_s: float) -> None:
        """Fold one finished call on `rt` (already released from `outstanding`) into latency and health."""
        now = self.clock.now_s()
        rt.observe_latency(latency_s, now)
        rt.failures += failed
        if rt.upstream.replica_id not in self.replicas:
            return
        event, self.health = hp.record_result(self.health, rt.upstream.replica_id, failed, now,
                                              self.config.health)
        if event is not None:
            log.warning("event=%s replica=%s until_s=%.1f", event.kind, event.replica_id, event.until_s)
        if not failed:
            self.latencies = self.latencies.add(latency_s)

    def _require_client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("Router.start() must run before requests are proxied (use the app's lifespan)")
        return self._client

    def _build(self, rt: ReplicaRuntime, out: Outgoing) -> httpx.Request:
        return self._require_client().build_request(out.method, rt.upstream.base_url + out.path_and_query,
                                                    headers=list(out.headers), content=out.body)

    # ----------------------------------------------------------------------------------------- handling
    async def handle(self, request: Request) -> Response:
        if request.url.path == "/v2/health/live":
            return Response(status_code=200)
        if request.url.path == "/v2/health/ready":
            ready = any(s.ready for s in self.snapshots())
            return Response(status_code=200 if ready else 503)
        span = router_span(self.tracer_provider, request)
        try:
            response = await self._proxy(request, span.traceparent if span is not None else None)
        except HeadroomError as exc:
            response = json_error(exc)
        except BaseException:
            if span is not None:
                span.finish([], time.time_ns(), status_code=500)
            raise
        return response if span is None else end_span_with(response, span)

    async def _proxy(self, request: Request, traceparent: str | None = None) -> Response:
        c = self.config
        body = await read_body(request, c.max_body_bytes)  # 413 before an oversized body is buffered
        now = self.clock.now_s()
        self.counters["requests"] += 1
        snaps = self.snapshots()
        undispatched = self.inflight - sum(s.outstanding for s in snaps)  # admitted, no replica picked yet
        d = tail.shed(snaps, now, self.rng, c.shed, undispatched)
        if c.shedding and d.reject:
            self.counters["shed"] += 1
            raise Overloaded(f"all replicas are {d.utilisation:.0%} busy; shedding {d.fraction:.0%} of "
                             "new requests, retry later", retry_after_s=d.retry_after_s)
        if c.adaptive_concurrency and self.inflight >= self.vegas.effective_limit(c.vegas):
            self.counters["limited"] += 1
            raise Overloaded(f"concurrency limit {self.vegas.effective_limit(c.vegas)} reached; retry later",
                             retry_after_s=1.0)
        self.retry_state = tail.budget_deposit(self.retry_state, now, c.retry_budget)
        self.hedge_state = tail.budget_deposit(self.hedge_state, now, c.hedge_budget)
        tenant = request.scope.get("state", {}).get("tenant", "")  # what _outgoing forwards to the replica
        key: RouteKey = (await self.prefix.key(body, tenant) if self.prefix is not None
                         else request_key(c.policy, request.headers, body, c.affinity_header))
        out = self._outgoing(request, body, d.utilisation, traceparent)
        self.inflight += 1
        inflight_at_start = self.inflight
        work = asyncio.create_task(attempts_or_fallback(self, out, key))
        gone = asyncio.create_task(disconnected(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():  # the client went away: stop the replica's work too
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                self.counters["cancelled"] += 1
                raise Cancelled("the client disconnected")
            winner, out = work.result()
        finally:
            gone.cancel()
            self.inflight -= 1
        return self._respond(winner, inflight_at_start, out.degraded_to)

    def _outgoing(self, request: Request, body: bytes, utilisation: float, traceparent: str | None = None) -> Outgoing:
        path, degraded_to = request.url.path, ""
        fallbacks = self.config.degrade.fallbacks
        if fallbacks and (utilisation >= self.config.degrade.start_utilisation or (
                self.breaker.ejected_until_s and self.breaker.ejected(degrade.model_of(path, body),
                                                                     self.clock.now_s()))):
            rewritten = degrade.rewrite(path, body, fallbacks)
            if rewritten is not None:
                path, body, degraded_to = rewritten
                self.counters["degraded"] += 1
        query = f"?{request.url.query}" if request.url.query else ""
        tenant = request.scope.get("state", {}).get("tenant", "")  # the gateway's, never the client's header
        headers = forwarded_headers(request.headers.items(), HOP_BY_HOP, tenant)
        if traceparent is not None:  # the router's span becomes the replica's parent (tracestate passes as is)
            headers = (*((k, v) for k, v in headers if k.lower() != "traceparent"), ("traceparent", traceparent))
        return Outgoing(request.method, path + query, headers, body, degraded_to,
                        tail.replayable(request.method, path))

    def _respond(self, a: Attempt, inflight_at_start: int, degraded_to: str = "") -> Response:
        rid = a.replica.upstream.replica_id
        if a.response is None or a.outcome in ("timeout", "connection_lost"):
            self._record(a)
            self.counters["upstream_failed"] += 1
            if a.outcome == "timeout":
                raise DeadlineExceeded(f"replica {rid} did not answer within {self.config.request_timeout_s} s")
            raise UpstreamFailed(f"replica {rid} failed mid-request ({a.outcome}); the request may have run")
        resp = a.response
        headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["x-headroom-replica"] = rid
        if degraded_to:
            headers["x-headroom-degraded-to"] = degraded_to
        if a.body is not None:
            latency = a.finish()
            self._record(a, latency)
            self._feed_limiter(latency, inflight_at_start, a.outcome == "overloaded")
            return Response(a.body, resp.status_code, headers)

        async def stream() -> AsyncIterator[bytes]:
            try:
                if a.first_chunk:
                    yield a.first_chunk
                async for chunk in a.rest if a.rest is not None else resp.aiter_raw():
                    yield chunk
            except httpx.TransportError:
                a.outcome = "connection_lost"  # the replica broke the stream: counts against it
                raise
            except (asyncio.CancelledError, GeneratorExit):
                a.outcome = "cancelled"  # the client went away: not the replica's fault
                raise
            finally:
                await resp.aclose()
                latency = a.finish(record_latency=a.outcome != "cancelled")
                self._record(a, latency)
                self._feed_limiter(latency, inflight_at_start, False)

        return StreamingResponse(stream(), resp.status_code, headers)

    def _feed_limiter(self, latency_s: float, inflight: int, dropped: bool) -> None:
        if self.config.adaptive_concurrency and latency_s > 0:
            self.vegas = tail.vegas_update(self.vegas, latency_s, inflight, dropped, self.config.vegas)
