"""The router loses nothing it accepted when a replica dies or drains (real replicas on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from headroom.router.fake_replica import ReplicaBehaviour, make_app, serve_asgi
from headroom.router.proxy import ProxyConfig, Router
from headroom.router.upstream import DRAINING_HEADER, Upstream
from tests.support.server import free_port

INFER = "/v2/models/m/infer"


@contextlib.contextmanager
def replica_process(name: str, delay_ms: float) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A fake replica in its own process (so it can be killed with SIGKILL); yields it and its URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "headroom.router.fake_replica", "--port", str(port),
                             "--name", name, "--delay-ms", str(delay_ms)],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


async def _poll(check: object, timeout_s: float = 30.0) -> None:
    """Await `check()` (an async predicate) turning true, polling every 20 ms, for at most `timeout_s`."""
    async def loop() -> None:
        while not await check():  # type: ignore[operator]
            await asyncio.sleep(0.02)
    await asyncio.wait_for(loop(), timeout_s)


async def _ready(url: str) -> bool:
    try:
        async with httpx.AsyncClient() as c:
            return (await c.get(url + "/v2/health/ready", timeout=1.0)).status_code == 200
    except httpx.HTTPError:
        return False


async def _inflight(url: str) -> int:
    async with httpx.AsyncClient() as c:
        return int((await c.get(url + "/stats", timeout=2.0)).json()["inflight"])


@contextlib.asynccontextmanager
async def routed(urls: Sequence[tuple[str, str]]) -> AsyncIterator[tuple[Router, httpx.AsyncClient]]:
    """A router (round robin) in front of (name, url) replicas, once it has seen all of them ready."""
    for _, url in urls:
        await _poll(lambda url=url: _ready(url))
    router = Router([Upstream(name, url) for name, url in urls], ProxyConfig(policy="round_robin"),
                    rng=random.Random(0))
    async with serve_asgi(router.app, lifespan="on") as router_url:
        async def all_ready() -> bool:
            return all(s.ready for s in router.snapshots())
        await _poll(all_ready)
        async with httpx.AsyncClient(base_url=router_url, timeout=30.0) as client:
            yield router, client


@pytest.mark.parametrize("path", [INFER, "/v1/completions"])
async def test_a_replica_killed_mid_request_loses_nothing(path: str) -> None:
    """kill -9 while it holds requests: their connections are reset and the router retries them elsewhere."""
    with replica_process("slow", delay_ms=60_000) as (slow, slow_url), \
            replica_process("fast", delay_ms=5) as (_, fast_url):
        async with routed([("slow", slow_url), ("fast", fast_url)]) as (router, client):
            body = orjson.dumps({"max_tokens": 3, "stream": True})
            sent = [asyncio.create_task(client.post(path, content=body)) for _ in range(4)]

            async def slow_holds_two() -> bool:
                return await _inflight(slow_url) == 2
            await _poll(slow_holds_two)
            os.kill(slow.pid, signal.SIGKILL)
            responses = await asyncio.gather(*sent)
    assert [r.status_code for r in responses] == [200] * 4
    assert {r.headers["x-headroom-replica"] for r in responses} == {"fast"}
    if path != INFER:
        assert all(r.text.endswith("data: [DONE]\n\n") for r in responses)
    assert router.counters["retries"] >= 2


def _draining_app() -> Starlette:
    """What a replica shutting down answers on every route: 503, the header, an OpenAI-shaped body."""
    async def refuse(request: Request) -> Response:
        if request.url.path == "/v2/health/ready":
            return Response(status_code=200)  # the router's check has not noticed yet
        await request.body()
        return JSONResponse({"error": {"message": "the server is draining", "type": "server_error"}}, 503,
                            {DRAINING_HEADER: "1", "Retry-After": "1"})
    return Starlette(routes=[Route("/{path:path}", refuse, methods=["GET", "POST"])])


async def test_a_draining_replicas_503_is_retried_elsewhere_whatever_its_body() -> None:
    ok = ReplicaBehaviour(name="ok")
    async with serve_asgi(_draining_app()) as draining_url, serve_asgi(make_app(ok)) as ok_url, \
            routed([("draining", draining_url), ("ok", ok_url)]) as (router, client):
        statuses = []
        for path in (INFER, "/v1/completions", INFER, "/v1/completions"):
            r = await client.post(path, content=b'{"max_tokens": 2}')
            statuses.append((r.status_code, r.headers["x-headroom-replica"]))
    assert statuses == [(200, "ok")] * 4
    assert router.counters["retries"] >= 1
    assert router.replicas["draining"].requests >= 1 and router.replicas["draining"].failures == 0


async def test_a_503_without_the_header_is_an_answer_not_a_drain() -> None:
    """An overloaded replica's 503 is passed through, not retried (overload must not become a retry storm)."""
    async def overloaded(request: Request) -> Response:
        if request.url.path == "/v2/health/ready":
            return Response(status_code=200)
        return JSONResponse({"error": {"message": "busy", "type": "server_error"}}, 503)
    app = Starlette(routes=[Route("/{path:path}", overloaded, methods=["GET", "POST"])])
    async with serve_asgi(app) as url, routed([("busy", url)]) as (router, client):
        r = await client.post("/v1/completions", content=b"{}")
    assert r.status_code == 503 and r.json()["error"]["message"] == "busy"
    assert router.counters["retries"] == 0
