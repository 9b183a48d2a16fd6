"""HTTP and gRPC go through one policy pipeline: the same request sequence against equivalent fleets (a healthy
replica, one refusing connections, one answering server errors, one draining) yields the same answers, the same
decisions (choice, retries, ejection, readiness, no replica) and the same metrics on both transports.

Real routers and real replicas on 127.0.0.1 (the fake HTTP replica; grpc.aio V2 servers), both routers on a
`FakeClock` so that every timestamp, budget and ejection deadline is comparable."""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import grpc.aio
import httpx
import orjson
from prometheus_client import CollectorRegistry

from headroom.core.clock import FakeClock
from headroom.core.dataplane import DisconnectWatcher
from headroom.core.errors import Draining
from headroom.core.types import InferenceRequest, InferenceResponse
from headroom.protocol.generated import headroom_inference_pb2 as pb
from headroom.protocol.grpc_service import bind_grpc_server, stop_grpc_server
from headroom.router import health as hp
from headroom.router.fake_replica import ReplicaBehaviour, make_app, serve_asgi
from headroom.router.grpc_proxy import SERVICE_NAME, GrpcProxy
from headroom.router.health import HealthConfig
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.upstream import Upstream
from tests.router.test_grpc_proxy import EchoPlane, _infer_request
from tests.support.server import free_port
from tests.support.waiting import until

ORDER = ("ok", "dead", "bad", "drain")
CONFIG = ProxyConfig(policy="round_robin", health=HealthConfig(consecutive_failures=2, max_ejected_fraction=1.0),
                     check_interval_s=3600.0)  # one round of checks at start, then only what the requests show
REQUESTS = 10


class BrokenPlane(EchoPlane):
    """Every inference fails inside the server (gRPC INTERNAL, as the HTTP replica's 500)."""

    async def infer(self, request: InferenceRequest,
                    disconnected: DisconnectWatcher | None = None) -> InferenceResponse:
        raise RuntimeError("boom")


class DrainingPlane(EchoPlane):
    """A server shutting down: UNAVAILABLE with `x-headroom-draining: 1`, as the HTTP replica's 503."""

    async def infer(self, request: InferenceRequest,
                    disconnected: DisconnectWatcher | None = None) -> InferenceResponse:
        raise Draining("draining")


def _ready_everywhere(router: Router) -> None:
    for rid in ORDER:  # the same starting point on both transports: every replica ready
        _, router.health = hp.record_check(router.health, rid, True, router.clock.now_s(), CONFIG.health)


Send = Callable[[int], Awaitable[str]]


@contextlib.asynccontextmanager
async def http_side() -> AsyncIterator[tuple[Router, Send]]:
    behaviours = {"ok": ReplicaBehaviour("ok", delay_ms=0.0), "bad": ReplicaBehaviour("bad", fail_status=500),
                  "drain": ReplicaBehaviour("drain", draining=True)}
    async with contextlib.AsyncExitStack() as stack:
        urls = {rid: await stack.enter_async_context(serve_asgi(make_app(b))) for rid, b in behaviours.items()}
        urls["dead"] = f"http://127.0.0.1:{free_port()}"
        router = Router([Upstream(rid, urls[rid]) for rid in ORDER], CONFIG, clock=FakeClock(),
                        rng=random.Random(0), registry=CollectorRegistry())
        base = await stack.enter_async_context(serve_asgi(router.app, lifespan="on"))
        await until(lambda: any(s.ready for s in router.snapshots()), "the router's first round of checks")
        _ready_everywhere(router)
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=base, timeout=30.0))

        async def send(i: int) -> str:
            r = await client.post("/v2/models/echo/infer", content=orjson.dumps({"inputs": [], "id": f"q{i}"}))
            if r.status_code == 200:
                return f"ok:{r.headers['x-headroom-replica']}"
            return {500: "server_error", 503: "unavailable"}.get(r.status_code, str(r.status_code))

        yield router, send


@contextlib.asynccontextmanager
async def grpc_side() -> AsyncIterator[tuple[Router, Send]]:
    planes = {"ok": EchoPlane("ok"), "bad": BrokenPlane("bad"), "drain": DrainingPlane("drain")}
    servers = {rid: await bind_grpc_server(p, "127.0.0.1", 0) for rid, p in planes.items()}
    targets = {rid: f"127.0.0.1:{port}" for rid, (_, port) in servers.items()} | {"dead": f"127.0.0.1:{free_port()}"}
    router = Router([Upstream(rid, "http://127.0.0.1:1", grpc_target=targets[rid]) for rid in ORDER], CONFIG,
                    clock=FakeClock(), rng=random.Random(0), registry=CollectorRegistry())
    _ready_everywhere(router)
    proxy = GrpcProxy(router)
    port = await proxy.start("127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary(f"/{SERVICE_NAME}/ModelInfer")

    async def send(i: int) -> str:
        try:
            raw: bytes = await call(_infer_request(i), timeout=30.0)
        except grpc.aio.AioRpcError as err:
            names = {grpc.StatusCode.INTERNAL: "server_error", grpc.StatusCode.UNAVAILABLE: "unavailable"}
            return names.get(err.code(), str(err.code()))
        return f"ok:{pb.ModelInferResponse.FromString(raw).model_version}"

    try:
        yield router, send
    finally:
        await channel.close()
        await proxy.close()
        for server, _ in servers.values():
            await stop_grpc_server(server, 0.1)


def _attempt_counts(router: Router) -> dict[tuple[str, str], float]:
    """Finished attempts by (replica, outcome); a server error is `http_5xx` on one side, `grpc_<code>` on the
    other (the transport's own status), so both read as `server_error`."""
    counts: dict[tuple[str, str], float] = {}
    for family in router.metrics.registry.collect():
        for s in family.samples:
            if s.name == "headroom_router_attempt_latency_seconds_count":
                outcome = s.labels["outcome"]
                outcome = "server_error" if outcome.startswith(("http_5", "grpc_")) else outcome
                counts[(s.labels["replica"], outcome)] = s.value
    return counts


async def _run(side: Callable[[], contextlib.AbstractAsyncContextManager[tuple[Router, Send]]]
               ) -> tuple[Router, list[str]]:
    async with side() as (router, send):
        answers = [await send(i) for i in range(REQUESTS)]
        for rid in ORDER:  # every replica goes away (an ejected one would still be tried as a last resort)
            router.pipeline.mark_unready(rid)
        answers.append(await send(REQUESTS))
        assert all(rt.outstanding == 0 for rt in router.replicas.values())
        return router, answers


async def test_http_and_grpc_make_the_same_decisions_and_metrics() -> None:
    http_router, http_answers = await _run(http_side)
    grpc_router, grpc_answers = await _run(grpc_side)
    assert http_answers == grpc_answers
    assert http_answers[-1] == "unavailable" and "server_error" in http_answers and "ok:ok" in http_answers
    h, g = http_router.pipeline, grpc_router.pipeline
    assert h.counters == g.counters
    assert h.counters["retries"] >= 2 and h.counters["no_replica"] == 1 and h.counters["requests"] == REQUESTS + 1
    assert h.health == g.health  # readiness, failures in a row, ejections and their deadlines
    now = h.clock.now_s()
    assert [s.replica_id for s in h.snapshots() if s.ejected(now)] == ["bad"]
    assert h.health.get("dead").consecutive_failures == 1  # refused: not ready, and a failure
    assert (h.retry_state, h.hedge_state, h.route_state, h.latencies, h.vegas) == (
        g.retry_state, g.hedge_state, g.route_state, g.latencies, g.vegas)
    per_replica = {rid: (rt.requests, rt.failures) for rid, rt in h.replicas.items()}
    assert per_replica == {rid: (rt.requests, rt.failures) for rid, rt in g.replicas.items()}
    assert _attempt_counts(http_router) == _attempt_counts(grpc_router)
    assert _attempt_counts(http_router)[("dead", "connect_error")] >= 1
