"""The body is read once: the gateway reads and checks it, the handlers' `read_body` takes it from the scope."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from headroom.core.errors import HeadroomError, PayloadTooLarge
from headroom.gateway.limits import BODY_SCOPE_KEY, read_body
from headroom.gateway.middleware import GatewayConfig, GatewayMiddleware

Message = MutableMapping[str, Any]


def handler_app(max_body_bytes: int) -> Starlette:
    async def echo(request: Request) -> Response:
        try:
            body = await read_body(request, max_body_bytes)
        except HeadroomError as exc:
            return Response(exc.reason, status_code=exc.http_status)
        return Response(body, headers={"x-from-scope": str(BODY_SCOPE_KEY in request.scope).lower()})

    return Starlette(routes=[Route("/echo", echo, methods=["POST"])])


def call(app: Any, chunks: list[bytes]) -> tuple[int, dict[bytes, bytes], bytes, int]:
    """Drive `app` with `chunks` as the request body; return status, headers, body and receive() calls made."""
    inbox: list[Message] = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)
    ]
    sent: list[Message] = []
    calls = 0

    async def receive() -> Message:
        nonlocal calls
        calls += 1
        return inbox.pop(0) if inbox else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/echo", "raw_path": b"/echo", "root_path": "",
             "headers": [(b"content-type", b"application/octet-stream")], "query_string": b""}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body, calls


def test_behind_the_gateway_the_handler_reads_no_message_itself() -> None:
    app = GatewayMiddleware(handler_app(1024), GatewayConfig())
    status, headers, body, calls = call(app, [b"first ", b"second"])
    assert (status, body) == (200, b"first second")
    assert headers[b"x-from-scope"] == b"true"
    assert calls == 2  # the gateway's two chunks, nothing more: the handler took the body from the scope


def test_without_the_gateway_the_handler_reads_the_stream() -> None:
    status, headers, body, calls = call(handler_app(1024), [b"first ", b"second"])
    assert (status, body) == (200, b"first second")
    assert headers[b"x-from-scope"] == b"false"
    assert calls == 2


def test_a_handler_limit_below_the_gateways_still_applies_to_the_scoped_body() -> None:
    app = GatewayMiddleware(handler_app(8), GatewayConfig())
    status, _, body, _ = call(app, [b"0123456789"])
    assert status == PayloadTooLarge.http_status
    assert body == PayloadTooLarge.reason.encode()


@pytest.mark.parametrize("chunks", [[b""], [b"", b""]])
def test_an_empty_body_is_passed_on_as_empty(chunks: list[bytes]) -> None:
    status, headers, body, _ = call(GatewayMiddleware(handler_app(1024), GatewayConfig()), chunks)
    assert (status, body, headers[b"x-from-scope"]) == (200, b"", b"true")
