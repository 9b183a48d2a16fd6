"""Small pieces of the proxy's HTTP edge: the outgoing request, disconnect watching, error responses."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson
from opentelemetry.trace import TracerProvider
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from headroom.core.errors import HeadroomError
from headroom.gateway.tracing import IngressSpan, parse_traceparent


class UpstreamFailed(HeadroomError):
    """The replica failed after the request may have started; it is not retried (it might have run)."""

    http_status = 502
    grpc_code = "UNAVAILABLE"
    reason = "upstream_failed"


@dataclass(frozen=True, slots=True)
class Outgoing:
    """What is sent to a replica (the same for every attempt of one request)."""

    method: str  # HTTP method
    path_and_query: str  # e.g. "/v2/models/m/infer?x=1" (the model may be a fallback's)
    headers: tuple[tuple[str, str], ...]  # end-to-end request headers
    body: bytes  # the request body (possibly rewritten for a fallback model)
    degraded_to: str = ""  # the fallback model serving this request, "" if none
    replayable: bool = False  # idempotent route: may be resent after a connection lost before any answer
    callback_port: int = 0  # the router's port as the client reached it (tied requests' start notices)


def router_span(tracer_provider: TracerProvider | None, request: Request) -> IngressSpan | None:
    """The router's SERVER span for one request, a child of the client's traceparent (None: tracing is off)."""
    if tracer_provider is None:
        return None
    parent = parse_traceparent(request.headers.get("traceparent"))
    attributes = {"http.request.method": request.method, "url.path": request.url.path}
    return IngressSpan(tracer_provider, "router", parent, request.headers.get("x-request-id", ""), "",
                       time.time_ns(), attributes)


async def disconnected(request: Request) -> None:
    """Resolves when the client disconnects (the body has been read, so the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def json_error(exc: HeadroomError) -> Response:
    headers = {}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(exc.retry_after_s)))
    return Response(orjson.dumps(exc.to_json()), exc.http_status, headers, media_type="application/json")


def end_span_with(response: Response, span: IngressSpan) -> Response:
    """End `span` with the response: now for a buffered body, when the last chunk went for a streamed one."""
    replica = response.headers.get("x-headroom-replica", "")
    if replica:
        span.span.set_attribute("headroom.replica", replica)
    if not isinstance(response, StreamingResponse):
        span.finish([], time.time_ns(), status_code=response.status_code)
        return response
    inner = response.body_iterator

    async def body() -> AsyncIterator[str | bytes | memoryview]:
        try:
            async for chunk in inner:
                yield chunk
        finally:
            span.finish([], time.time_ns(), status_code=response.status_code)

    response.body_iterator = body()
    return response
