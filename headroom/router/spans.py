"""The router's own tracing span per proxied request (a child of the client's traceparent)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from opentelemetry.trace import TracerProvider
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from headroom.gateway.tracing import IngressSpan, parse_traceparent


def start_span(tracer_provider: TracerProvider | None, request: Request) -> IngressSpan | None:
    """The router's SERVER span for one request (None when tracing is off)."""
    if tracer_provider is None:
        return None
    parent = parse_traceparent(request.headers.get("traceparent"))
    attributes = {"http.request.method": request.method, "url.path": request.url.path}
    return IngressSpan(tracer_provider, "router", parent, request.headers.get("x-request-id", ""), "",
                       time.time_ns(), attributes)


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
