"""One HTTP request run through an in-process ASGI app, as a stream of values a `DeploymentHandle` can carry.

A Serve replica that hosts headroom's own HTTP app (the LLM replica's OpenAI and generate routes, the model
replica's `/v1/embeddings`) receives the request as an `HttpCall` (method, path, query, headers, body: plain
bytes, picklable) and answers through `call_asgi`: first an `HttpHead` (status and headers), then the body in
chunks as the app sends them, so a server-sent-event stream reaches the ingress chunk by chunk through Serve's
streaming handle (`handle.options(stream=True)`). Closing the generator (the ingress's client went away, or the
ingress cancelled the call) tells the app the client disconnected and cancels it: an LLM stream then aborts its
request in the engine, as it does under `headroom serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, MutableMapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.types import ASGIApp

from headroom.core.clock import Clock
from headroom.gateway.app import GatewaySetup, wrap_app
from headroom.gateway.ratelimit import RateLimiter
from headroom.server.http_app import HttpApi, build_http_app

log = logging.getLogger("headroom.ray_serve")

Headers = tuple[tuple[bytes, bytes], ...]
#: Response header naming the Serve replica that answered (as the router's x-headroom-replica).
REPLICA_HEADER = "x-headroom-replica"


def replica_header(replica_id: str) -> Headers:
    return ((REPLICA_HEADER.encode(), replica_id.encode("latin-1")),)


class BrokenAnswer(RuntimeError):
    """The app failed after it had started its answer: the body sent so far is incomplete."""


@dataclass(frozen=True, slots=True)
class HttpCall:
    """An HTTP request, read by the ingress (the body is complete and within its size limit)."""

    method: str
    path: str
    query_string: bytes = b""
    headers: Headers = ()
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class HttpHead:
    """The response's status and headers (the first item of a `call_asgi` stream)."""

    status: int
    headers: Headers = ()

    def header(self, name: str) -> str | None:
        key = name.lower().encode("latin-1")
        return next((v.decode("latin-1") for k, v in self.headers if k.lower() == key), None)


def replica_app(api: HttpApi, extra_routes: Any, registry: CollectorRegistry, clock: Clock,
                gateway: GatewaySetup | None = None) -> ASGIApp:
    """headroom's HTTP app as `headroom serve` builds it (its routes behind the gateway middleware: input limits,
    API keys and tenants when `gateway` has keys, else the anonymous tenant, usage and Server-Timing), for a Serve
    replica."""
    gateway = gateway or GatewaySetup()
    limiter = RateLimiter(gateway.config.rate_limits, gateway.config.tenant_rate_limits)
    return wrap_app(build_http_app(api, extra_routes), gateway, clock, None, registry, limiter)


class PagedReplica:
    """What every headroom Serve replica answers the ingress's `/metrics` scrape with (`replica_id` and
    `registry` set by the replica's `__init__`)."""

    replica_id: str
    registry: CollectorRegistry

    def metrics_page(self, target_replica: str | None = None) -> tuple[str, bytes, str]:
        """(this replica's id, its Prometheus exposition, content type); `target_replica` is the request
        router's (the ingress asks every replica in turn, `headroom.ray_serve.fleet_metrics`)."""
        return self.replica_id, generate_latest(self.registry), CONTENT_TYPE_LATEST


def _scope(call: HttpCall) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": call.method, "scheme": "http", "path": call.path, "raw_path": call.path.encode("utf-8"),
            "query_string": call.query_string, "root_path": "", "headers": list(call.headers),
            "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0), "state": {}}


async def call_asgi(app: ASGIApp, call: HttpCall,
                    extra_headers: Headers = ()) -> AsyncGenerator[HttpHead | bytes, None]:
    """Run `call` through `app`: yields one `HttpHead` (plus `extra_headers`), then the body's chunks. An app
    that fails before it answered yields a JSON 500; one that fails mid-body raises `BrokenAnswer` after the
    chunks it sent (the caller, through the handle, learns that the body is incomplete: the ingress ends an
    event stream with an error event, `headroom.ray_serve.forward`)."""
    items: asyncio.Queue[HttpHead | bytes | BrokenAnswer | None] = asyncio.Queue()
    closed = asyncio.Event()
    state = {"body_read": False, "started": False}

    async def receive() -> MutableMapping[str, Any]:
        if not state["body_read"]:
            state["body_read"] = True
            return {"type": "http.request", "body": call.body, "more_body": False}
        await closed.wait()  # the app listens for a disconnect while it streams: only a closed call is one
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            state["started"] = True
            items.put_nowait(HttpHead(int(message["status"]), (*message.get("headers", ()), *extra_headers)))
        elif message["type"] == "http.response.body":
            if message.get("body"):
                items.put_nowait(bytes(message["body"]))
            if not message.get("more_body", False):
                items.put_nowait(None)

    async def run() -> None:
        try:
            await app(_scope(call), receive, send)
        except Exception:  # the app's own bug: one answer, never a hang
            log.exception("%s %s failed in the replica", call.method, call.path)
            if not state["started"]:
                items.put_nowait(HttpHead(500, ((b"content-type", b"application/json"), *extra_headers)))
                items.put_nowait(b'{"error": "internal error in the replica", "reason": "internal"}')
            else:
                items.put_nowait(BrokenAnswer(f"{call.method} {call.path}: the replica's answer failed mid-body"))
        finally:
            items.put_nowait(None)

    task = asyncio.create_task(run(), name=f"asgi-{call.method}-{call.path}")
    try:
        while (item := await items.get()) is not None:
            if isinstance(item, BrokenAnswer):
                raise item
            yield item
    finally:
        closed.set()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


__all__ = ["REPLICA_HEADER", "BrokenAnswer", "HttpCall", "HttpHead", "PagedReplica", "call_asgi", "replica_app",
           "replica_header"]
