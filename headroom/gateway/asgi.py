"""ASGI plumbing the gateway middleware uses: types, header lookup, error responses, body replay."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from headroom.core.errors import HeadroomError
from headroom.protocol.openai_errors import exception_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def header_value(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def presented_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The API key from `Authorization: Bearer <key>` or `X-API-Key: <key>` (None when neither is sent)."""
    auth = header_value(headers, b"authorization")
    if auth is not None:
        scheme, _, value = auth.decode("latin-1").partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    api_key = header_value(headers, b"x-api-key")
    return api_key.decode("latin-1").strip() if api_key else None


def error_body(exc: HeadroomError, path: str) -> bytes:
    """`{"error": message, "reason": ...}`; /v1 paths get OpenAI's `{"error": {"message", "type", ...}}`."""
    if path.startswith("/v1/"):
        return orjson.dumps({**exception_body(exc), "reason": exc.reason})
    return orjson.dumps(exc.to_json())


async def send_error(send: Send, exc: HeadroomError, path: str, request_id: str, close: bool = False) -> None:
    body = error_body(exc, path)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode("latin-1")),
    ]
    if exc.retry_after_s is not None:
        headers.append((b"retry-after", str(max(1, int(-(-exc.retry_after_s // 1)))).encode()))
    if exc.http_status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="headroom"'))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": exc.http_status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A `receive` that yields the buffered body once, then defers to the real one (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
