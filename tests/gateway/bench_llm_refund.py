"""What refunding unused `max_tokens` buys a tenant: `python -m tests.gateway.bench_llm_refund [SECONDS]`.

Deterministic, in process, on a fake clock: one tenant with an LLM-token bucket (2,000 tokens/s, burst 8,000)
sends a `/v1/completions` request asking for `max_tokens: 512` every 10 ms; the stand-in model generates a
seeded, geometrically distributed number of tokens (mean 40, at most 512) and reports it like the real
OpenAI routes do. Once with settlement (the gateway refunds the unused part), once with an app that reports
nothing (the whole reservation stays charged, which is what the gateway did before refunds).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import sys
from typing import Any

from headroom.core.clock import FakeClock
from headroom.gateway.asgi import Message
from headroom.gateway.middleware import GatewayConfig, GatewayMiddleware
from headroom.gateway.ratelimit import RateLimitConfig
from headroom.gateway.usage import LLMUsage, report_usage

BODY = json.dumps({"model": "m", "prompt": "Summarise this for me, please.", "max_tokens": 512}).encode()
INTERVAL_S = 0.01


def llm_app(rng: random.Random, generated: list[int], report: bool) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        tokens = 1
        while tokens < 512 and rng.random() > 1 / 40:
            tokens += 1
        generated.append(tokens)
        if report:
            usage = LLMUsage(8, tokens, 0, 0.0, 0.0, 0.0, 0.0, 0.0, "stop")
            report_usage(scope["state"], usage)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return app


async def run(seconds: float, report: bool) -> tuple[int, int, int]:
    """(requests sent, admitted, tokens generated)."""
    clock = FakeClock()
    generated: list[int] = []
    config = GatewayConfig(rate_limits=RateLimitConfig.of(llm_tokens_per_s=2000, llm_token_burst=8000))
    gateway = GatewayMiddleware(llm_app(random.Random(0), generated, report), config, clock=clock)
    sent = admitted = 0
    statuses: list[int] = []

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            statuses.append(int(message["status"]))

    while clock.now_s() < seconds:
        inbox: list[Message] = [{"type": "http.request", "body": BODY, "more_body": False}]

        async def receive(inbox: list[Message] = inbox) -> Message:
            return inbox.pop() if inbox else {"type": "http.disconnect"}

        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "raw_path": b"/v1/completions",
                 "headers": [(b"content-type", b"application/json")], "query_string": b""}
        await gateway(scope, receive, send)
        sent += 1
        admitted += statuses[-1] == 200
        clock.advance(INTERVAL_S)
    return sent, admitted, sum(generated)


def main(seconds: float) -> None:
    logging.getLogger("headroom").setLevel(logging.WARNING)
    for label, report in (("refunds (settled at the end)", True), ("no refunds (charged max_tokens)", False)):
        sent, admitted, tokens = asyncio.run(run(seconds, report))
        print(f"{label:32s} admitted {admitted:5d} of {sent} requests ({admitted / sent:6.1%}), "
              f"{tokens / seconds:7.0f} generated tokens/s over {seconds:g} s")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0)
