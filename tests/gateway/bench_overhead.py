"""Per-request cost of the gateway middleware, in process: `python -m tests.gateway.bench_overhead [N]`."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from headroom.gateway.asgi import ASGIApp, Message
from headroom.gateway.auth import KeyStore, create_key
from headroom.gateway.middleware import GatewayConfig, GatewayMiddleware
from headroom.gateway.ratelimit import RateLimitConfig


async def bare_app(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def per_request_us(app: ASGIApp, headers: list[tuple[bytes, bytes]], body: bytes, n: int) -> float:
    async def send(message: Message) -> None:
        return None

    path = "/v2/models/echo/infer"
    start = time.perf_counter()
    for _ in range(n):
        inbox: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive(inbox: list[Message] = inbox) -> Message:
            return inbox.pop() if inbox else {"type": "http.disconnect"}

        scope = {
            "type": "http",
            "method": "POST",
            "path": path,
            "raw_path": path.encode(),
            "headers": headers,
            "query_string": b"",
        }
        await app(scope, receive, send)
    return (time.perf_counter() - start) / n * 1e6


def main(n: int) -> None:
    logging.getLogger("headroom").setLevel(logging.WARNING)
    body = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]}
    ).encode()
    keys_file = Path(tempfile.mkdtemp()) / "keys.yaml"
    key = create_key(keys_file, "bench")
    headers = [
        (b"host", b"x"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"authorization", f"Bearer {key}".encode()),
    ]
    keyed = GatewayConfig(auth_enabled=True, rate_limits=RateLimitConfig.of(1e9, 1e9))
    for label, app in (
        ("bare app", bare_app),
        ("gateway, auth off", GatewayMiddleware(bare_app, GatewayConfig())),
        ("gateway, key + rate limits", GatewayMiddleware(bare_app, keyed, KeyStore.from_file(keys_file))),
    ):
        print(
            f"{label:28s} {asyncio.run(per_request_us(app, headers, body, n)):8.1f} µs/request "
            f"({len(body)}-byte body, {n} requests)"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
