"""The router process: an asyncio HTTP reverse proxy in front of N replicas, driven by the policy pipeline.

`headroom.router.pipeline.Pipeline` owns the replica table and every policy's state, and makes every decision
(the gRPC side, `headroom.router.grpc_proxy`, uses the same instance); this module moves the bytes. Per
request: coordinated shedding (503 + Retry-After without touching a replica) -> optional adaptive concurrency
limit -> `choose` a replica -> send over a pooled keep-alive `httpx.AsyncClient` -> optionally hedge to a
second replica after the p95 of recent latency (budgeted, the loser is cancelled) -> retry elsewhere, under
the retry budget, attempts that never started (connection refused, a replica not ready or answering 503
`x-headroom-draining: 1`) and, on idempotent routes (V2 inference, embeddings, LLM generation), attempts whose
connection was lost before any answer byte reached the client -> pass the answer through (small bodies
buffered, SSE and large bodies streamed once their first chunk arrived). A background task checks `GET
/v2/health/ready` on every replica (policy ``cache_aware``: also the KV blocks it holds,
`headroom.router.prefix_index`); results and every finished attempt feed the pipeline. `/router/stats`,
`/metrics` and `/metrics/replicas` (Prometheus service discovery): `headroom.router.metrics`.

W3C `traceparent`/`tracestate` go to the replica as sent, or, with a `tracer_provider`, the traceparent of the
router's own SERVER span (`router`) so the replica's spans nest under it. The replica learns the tenant the
router's gateway authenticated in `x-headroom-tenant` (`headroom.gateway.forwarded_tenant`)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Sequence

import httpx
from opentelemetry.trace import TracerProvider
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from headroom.core.clock import Clock, MonotonicClock
from headroom.core.errors import Cancelled, DeadlineExceeded, HeadroomError, Overloaded
from headroom.core.tasks import cancel_and_wait
from headroom.core.tied_wire import CALLBACK_PREFIX
from headroom.gateway.forwarded_tenant import forwarded_headers
from headroom.gateway.limits import read_body
from headroom.router import degrade, tail
from headroom.router import health as hp
from headroom.router.attempts import attempts_or_fallback
from headroom.router.canary import CanaryTracker
from headroom.router.config import ProxyConfig
from headroom.router.metrics import RouterMetrics, admin_routes, router_view
from headroom.router.pipeline import Pipeline
from headroom.router.prefix_index import PrefixIndex
from headroom.router.probes import probe_ready
from headroom.router.prompt_hasher import PromptHasher
from headroom.router.request_keys import RouteKey, request_key
from headroom.router.shed import VegasState
from headroom.router.snapshot import ReplicaSnapshot
from headroom.router.tied import CLIENT_FORBIDDEN, TiedRaces
from headroom.router.upstream import HOP_BY_HOP, HttpAttempt, ReplicaRuntime, Upstream
from headroom.router.wire import Outgoing, UpstreamFailed, disconnected, end_span_with, json_error, router_span

__all__ = ["ProxyConfig", "Router", "UpstreamFailed"]


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
        self.metrics = RouterMetrics(registry or CollectorRegistry(), lambda: router_view(self))
        self.pipeline = Pipeline(self.config, self.clock, rng or random.Random(), self.metrics, self.prefix)
        self._client: httpx.AsyncClient | None = None
        self._checker: asyncio.Task[None] | None = None
        self._wake_checker = asyncio.Event()
        self.set_upstreams(upstreams)
        self.tied = TiedRaces()  # tied requests' open races (start notices: POST /router/tied/<tag>)
        self.app = Starlette(routes=[*admin_routes(lambda: router_view(self), self.metrics.registry),
                                     Route(CALLBACK_PREFIX + "{tag}", self._tied_notice, methods=["POST"]),
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
        await cancel_and_wait(self._checker)
        self._checker = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def set_upstreams(self, upstreams: Sequence[Upstream]) -> None:
        """Replace the replica set (replica manager / autoscaler). New replicas start not ready."""
        self.pipeline.set_upstreams(upstreams)
        self._wake_checker.set()

    # ------------------------------------------------------------------------ the pipeline's state, read-only
    @property
    def replicas(self) -> dict[str, ReplicaRuntime]:
        return self.pipeline.replicas

    @property
    def counters(self) -> dict[str, int]:
        return self.pipeline.counters

    @property
    def inflight(self) -> int:
        return self.pipeline.inflight

    @property
    def vegas(self) -> VegasState:
        return self.pipeline.vegas

    @property
    def breaker(self) -> degrade.BreakerState:
        return self.pipeline.breaker

    @property
    def health(self) -> hp.HealthState:
        return self.pipeline.health

    @health.setter
    def health(self, state: hp.HealthState) -> None:  # tests and the autoscaler's fixtures seed readiness
        self.pipeline.health = state

    @property
    def canary(self) -> CanaryTracker | None:
        return self.pipeline.canary

    @canary.setter
    def canary(self, tracker: CanaryTracker | None) -> None:  # a fleet rollout starts and ends one
        self.pipeline.canary = tracker

    def snapshots(self) -> tuple[ReplicaSnapshot, ...]:
        return self.pipeline.snapshots()

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
        self.pipeline.record_checks(runtimes, ready)

    async def _check_loop(self) -> None:
        while True:
            self._wake_checker.clear()
            await self.check_once()
            self.pipeline.evaluate_rollout()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake_checker.wait(), self.config.check_interval_s)

    # ------------------------------------------------------------------------------------------ sending
    def require_client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("Router.start() must run before requests are proxied (use the app's lifespan)")
        return self._client

    def build(self, rt: ReplicaRuntime, out: Outgoing) -> httpx.Request:
        return self.require_client().build_request(out.method, rt.upstream.base_url + out.path_and_query,
                                                   headers=list(out.headers), content=out.body)

    async def drop(self, attempt: HttpAttempt) -> None:
        """Close a failed attempt's response (if any) and fold its outcome into the pipeline."""
        if attempt.response is not None:
            await attempt.response.aclose()
        self.pipeline.finish(attempt)

    # ----------------------------------------------------------------------------------------- handling
    async def _tied_notice(self, request: Request) -> Response:
        """A replica's notice that its copy of a tied request started: cancel the twin (204 either way)."""
        self.tied.started(request.path_params["tag"])
        return Response(status_code=204)

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
        c, pipe = self.config, self.pipeline
        body = await read_body(request, c.max_body_bytes)  # 413 before an oversized body is buffered
        a = pipe.admit()
        if a.verdict == "shed":
            raise Overloaded(f"all replicas are {a.shed.utilisation:.0%} busy; shedding {a.shed.fraction:.0%} of "
                             "new requests, retry later", retry_after_s=a.shed.retry_after_s)
        if a.verdict == "limited":
            raise Overloaded(f"concurrency limit {a.limit} reached; retry later", retry_after_s=1.0)
        tenant = request.scope.get("state", {}).get("tenant", "")  # what _outgoing forwards to the replica
        key: RouteKey = (await self.prefix.key(body, tenant) if self.prefix is not None
                         else request_key(c.policy, request.headers, body, c.affinity_header))
        out = self._outgoing(request, body, a.shed.utilisation, traceparent)
        inflight_at_start = pipe.enter()
        work = asyncio.create_task(attempts_or_fallback(self, out, key))
        gone = asyncio.create_task(disconnected(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():  # the client went away: stop the replica's work too
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                pipe.counters["cancelled"] += 1
                raise Cancelled("the client disconnected")
            winner, out = work.result()
        finally:
            gone.cancel()
            pipe.leave()
        return self._respond(winner, inflight_at_start, out.degraded_to)

    def _outgoing(self, request: Request, body: bytes, utilisation: float, traceparent: str | None = None) -> Outgoing:
        path, degraded_to = request.url.path, ""
        rewritten = self.pipeline.degrade(path, body, utilisation)
        if rewritten is not None:
            path, body, degraded_to = rewritten
        query = f"?{request.url.query}" if request.url.query else ""
        tenant = request.scope.get("state", {}).get("tenant", "")  # the gateway's, never the client's header
        headers = forwarded_headers(request.headers.items(), HOP_BY_HOP | CLIENT_FORBIDDEN, tenant)
        if traceparent is not None:  # the router's span becomes the replica's parent (tracestate passes as is)
            headers = (*((k, v) for k, v in headers if k.lower() != "traceparent"), ("traceparent", traceparent))
        server = request.scope.get("server")  # (host, port) the client reached: where start notices go
        return Outgoing(request.method, path + query, headers, body, degraded_to,
                        tail.replayable(request.method, path), int(server[1]) if server and server[1] else 0)

    def _respond(self, a: HttpAttempt, inflight_at_start: int, degraded_to: str = "") -> Response:
        rid, pipe = a.replica.upstream.replica_id, self.pipeline
        if a.response is None or a.outcome in ("timeout", "connection_lost"):
            pipe.finish(a)
            pipe.counters["upstream_failed"] += 1
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
            pipe.finish(a, latency)
            pipe.done(latency, inflight_at_start, a.outcome == "overloaded")
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
                pipe.finish(a, latency)
                pipe.done(latency, inflight_at_start, False)

        return StreamingResponse(stream(), resp.status_code, headers)
