"""The ASGI middleware driven directly (no sockets): streaming pass-through, replay, context, limits, 429s."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from headroom.core.clock import FakeClock
from headroom.gateway.auth import KeyStore, create_key
from headroom.gateway.context import current_context
from headroom.gateway.limits import InputLimits
from headroom.gateway.middleware import GatewayConfig, GatewayMiddleware, is_exempt, presented_key
from headroom.gateway.ratelimit import RateLimitConfig
from headroom.gateway.usage import LLMUsage, report_usage

Message = MutableMapping[str, Any]
App = Callable[[Any, Any, Any], Awaitable[None]]


def scope(
    path: str, method: str = "POST", headers: list[tuple[bytes, bytes]] | None = None
) -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "headers": headers or [],
        "query_string": b"",
    }


async def call(
    app: App, sc: dict[str, Any], body: bytes = b"", chunks: list[bytes] | None = None
) -> tuple[int, dict[bytes, bytes], bytes, list[Message]]:
    parts = chunks if chunks is not None else [body]
    inbox: list[Message] = [
        {"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return inbox.pop(0) if inbox else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(sc, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), payload, sent


async def echo_app(sc: Any, receive: Any, send: Any) -> None:
    """Answers with what it saw: body, request id header, tenant, bound context."""
    message = await receive()
    ctx = current_context()
    out = json.dumps(
        {
            "body": message["body"].decode(),
            "headers": {k.decode(): v.decode() for k, v in sc["headers"]},
            "tenant": sc["state"]["tenant"],
            "ctx_tenant": ctx.tenant if ctx else None,
            "next": (await receive())["type"],
        }
    ).encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": out})


async def test_auth_off_passes_through_with_replayed_body_and_request_id() -> None:
    app = GatewayMiddleware(echo_app, GatewayConfig())
    status, headers, payload, _ = await call(app, scope("/v2/models/echo/infer"), chunks=[b'{"a"', b": 1}"])
    assert status == 200
    seen = json.loads(payload)
    assert seen["body"] == '{"a": 1}' and seen["next"] == "http.disconnect"
    assert seen["tenant"] == "anonymous" == seen["ctx_tenant"]
    assert seen["headers"]["x-request-id"] == headers[b"x-request-id"].decode()


async def test_limits_apply_even_with_auth_off() -> None:
    app = GatewayMiddleware(echo_app, GatewayConfig(limits=InputLimits(max_json_depth=2, max_body_bytes=100)))
    status, _, payload, _ = await call(app, scope("/v2/models/echo/infer"), b"[[[1]]]")
    assert status == 400 and json.loads(payload)["reason"] == "invalid_request"
    status, _, _, _ = await call(app, scope("/v2/models/echo/infer"), chunks=[b"x" * 60, b"y" * 60])
    assert status == 413


async def test_streamed_chunks_are_forwarded_one_by_one() -> None:
    first_seen = asyncio.Event()

    async def sse_app(sc: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await asyncio.wait_for(first_seen.wait(), 5.0)  # deadlocks (and fails) if the middleware buffers
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    app = GatewayMiddleware(sse_app, GatewayConfig())
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)
        if message.get("body") == b"data: 1\n\n":
            first_seen.set()

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    await app(scope("/v1/chat/completions", "GET"), receive, send)
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n", b"data: 2\n\n", b""]


async def test_client_that_leaves_mid_body_never_reaches_the_app() -> None:
    called = []

    async def app_(sc: Any, receive: Any, send: Any) -> None:
        called.append(sc)

    app = GatewayMiddleware(app_, GatewayConfig())
    sent: list[Message] = []
    inbox: list[Message] = [
        {"type": "http.request", "body": b"{", "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return inbox.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope("/v2/models/echo/infer"), receive, send)
    assert called == [] and sent == []


async def test_slow_body_is_408_with_connection_close() -> None:
    app = GatewayMiddleware(
        echo_app, GatewayConfig(limits=InputLimits(body_timeout_s=0.05, body_grace_s=0.05))
    )

    async def receive() -> Message:
        await asyncio.Event().wait()  # never sends anything
        raise AssertionError

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope("/v2/models/echo/infer"), receive, send)
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]


def keyed(tmp_path: Path, **config: Any) -> tuple[KeyStore, dict[str, str]]:
    path = tmp_path / "keys.yaml"
    keys = {"a": create_key(path, "a"), "b": create_key(path, "b"), "admin": create_key(path, "ops", "admin")}
    return KeyStore.from_file(path), keys


async def test_per_tenant_request_bucket_gives_429_with_retry_after(tmp_path: Path) -> None:
    store, keys = keyed(tmp_path)
    clock = FakeClock(100.0)
    cfg = GatewayConfig(
        auth_enabled=True, rate_limits=RateLimitConfig.of(requests_per_s=0.25, request_burst=2)
    )
    app = GatewayMiddleware(echo_app, cfg, store, clock)

    def sc(who: str) -> dict[str, Any]:
        return scope("/v2/models/echo/infer", headers=[(b"authorization", f"Bearer {keys[who]}".encode())])

    assert [(await call(app, sc("a"), b"{}"))[0] for _ in range(2)] == [200, 200]
    status, headers, payload, _ = await call(app, sc("a"), b"{}")
    assert (
        status == 429 and headers[b"retry-after"] == b"4" and json.loads(payload)["reason"] == "rate_limited"
    )
    assert (await call(app, sc("b"), b"{}"))[0] == 200  # another tenant is untouched
    clock.advance(4.0)
    assert (await call(app, sc("a"), b"{}"))[0] == 200
    health = scope("/v2/health/ready", "GET")
    assert [(await call(app, health))[0] for _ in range(10)] == [200] * 10  # exempt: no key, no bucket


async def test_llm_token_bucket(tmp_path: Path) -> None:
    store, keys = keyed(tmp_path)
    cfg = GatewayConfig(
        auth_enabled=True, rate_limits=RateLimitConfig.of(llm_tokens_per_s=10, llm_token_burst=300)
    )
    app = GatewayMiddleware(echo_app, cfg, store, FakeClock())
    sc = scope("/v1/completions", headers=[(b"x-api-key", keys["a"].encode())])
    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 200}).encode()
    assert (await call(app, sc, body))[0] == 200
    status, headers, payload, _ = await call(app, sc, body)
    assert status == 429 and json.loads(payload)["error"]["type"] == "rate_limit_error"
    assert int(headers[b"retry-after"]) == 11  # 99 left, 201 needed, 10/s → 10.2 s → 11
    huge = json.dumps({"prompt": "hi", "max_tokens": 400}).encode()
    status, _, payload, _ = await call(app, sc, huge)
    assert status == 400 and "lower max_tokens" in json.loads(payload)["error"]["message"]


async def test_auth_errors_and_roles(tmp_path: Path) -> None:
    store, keys = keyed(tmp_path)
    app = GatewayMiddleware(echo_app, GatewayConfig(auth_enabled=True), store, FakeClock())
    status, _, payload, _ = await call(app, scope("/v2/models/echo/infer"), b"{}")
    assert status == 401 and json.loads(payload) == {
        "error": "missing API key: send `Authorization: Bearer <key>` or `X-API-Key: <key>`",
        "reason": "unauthenticated",
    }
    user = [(b"authorization", f"Bearer {keys['a']}".encode())]
    assert (await call(app, scope("/v2/repository/models/x/unload", headers=user)))[0] == 403
    admin = [(b"authorization", f"Bearer {keys['admin']}".encode())]
    assert (await call(app, scope("/v2/repository/models/x/unload", headers=admin), b""))[0] == 200


def test_presented_key_sources() -> None:
    assert presented_key([(b"authorization", b"Bearer abc")]) == "abc"
    assert presented_key([(b"authorization", b"bearer  abc ")]) == "abc"
    assert presented_key([(b"authorization", b"Basic abc"), (b"x-api-key", b"k")]) == "k"
    assert presented_key([]) is None


def test_auth_on_without_keys_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="api-keys-file"):
        GatewayMiddleware(echo_app, GatewayConfig(auth_enabled=True))


async def test_non_http_scopes_pass_through() -> None:
    seen: list[str] = []

    async def app_(sc: Any, receive: Any, send: Any) -> None:
        seen.append(sc["type"])

    async def nothing() -> Message:
        return {}

    async def drop(message: Message) -> None:
        return None

    await GatewayMiddleware(app_, GatewayConfig())({"type": "lifespan"}, nothing, drop)
    assert seen == ["lifespan"]


def test_exempt_paths_are_exact_or_below_a_slash() -> None:
    exempt = ("/v2/health/", "/metrics")
    assert is_exempt("/metrics", exempt) and is_exempt("/v2/health/ready", exempt)
    assert not is_exempt("/metricsX", exempt) and not is_exempt("/v2/healthz", exempt)
    assert not is_exempt("/v2/models/echo/infer", exempt)


# --- LLM tokens: charged up front, settled when the request ends -------------------------------------------


def llm_app(completion_tokens: int | None, status: int = 200, stream_then_disconnect: bool = False) -> App:
    """An OpenAI route stand-in: reports `LLMUsage` (unless None) into the scope state, like headroom.llm.http."""

    async def app(sc: Any, receive: Any, send: Any) -> None:
        await receive()
        usage = None
        if completion_tokens is not None:
            usage = LLMUsage(
                prompt_tokens=4, completion_tokens=completion_tokens, cached_tokens=0, preprocess_ms=0.001,
                queue_ms=0.002, prefill_ms=0.003, decode_ms=0.004, total_ms=0.012,  # shorter than any real call
                finish_reason="abort" if stream_then_disconnect else "stop",
            )
        await send({"type": "http.response.start", "status": status, "headers": []})
        if stream_then_disconnect:
            await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
            assert (await receive())["type"] == "http.disconnect"  # the client left: no final body
            if usage is not None:
                report_usage(sc["state"], usage)
            return
        if usage is not None:
            report_usage(sc["state"], usage)
        await send({"type": "http.response.body", "body": b"{}"})

    return app


def llm_gateway(tmp_path: Path, app: App, provider: TracerProvider | None = None) -> tuple[GatewayMiddleware, Any]:
    store, keys = keyed(tmp_path)
    cfg = GatewayConfig(auth_enabled=True, rate_limits=RateLimitConfig.of(llm_tokens_per_s=1, llm_token_burst=600))
    gateway = GatewayMiddleware(app, cfg, store, FakeClock(), tracer_provider=provider)
    return gateway, scope("/v1/completions", headers=[(b"x-api-key", keys["a"].encode())])


BIG_ASK = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 512}).encode()  # 1 + 512 tokens charged


async def test_unused_llm_tokens_are_refunded_when_the_request_ends(tmp_path: Path) -> None:
    app, sc = llm_gateway(tmp_path, llm_app(completion_tokens=10))
    assert [(await call(app, sc, BIG_ASK))[0] for _ in range(5)] == [200] * 5  # each nets 11 tokens
    assert app.limiter.check("a", 0, 0.0).allowed
    level = app.limiter._state["a"].llm_tokens
    assert level is not None and level.tokens == pytest.approx(600 - 5 * 11)


async def test_without_a_report_errors_are_refunded_and_successes_keep_the_charge(tmp_path: Path) -> None:
    app, sc = llm_gateway(tmp_path, llm_app(completion_tokens=None, status=404))
    assert [(await call(app, sc, BIG_ASK))[0] for _ in range(3)] == [404] * 3  # nothing generated
    app, sc = llm_gateway(tmp_path, llm_app(completion_tokens=None, status=200))
    assert [(await call(app, sc, BIG_ASK))[0] for _ in range(2)] == [200, 429]


async def test_a_client_that_leaves_mid_stream_is_refunded_the_rest(tmp_path: Path) -> None:
    app, sc = llm_gateway(tmp_path, llm_app(completion_tokens=3, stream_then_disconnect=True))
    for _ in range(3):
        status, _, _, sent = await call(app, sc, BIG_ASK)
        assert status == 200 and sent[-1].get("more_body") is True  # the response never finished
    level = app.limiter._state["a"].llm_tokens
    assert level is not None and level.tokens == pytest.approx(600 - 3 * 4)


async def test_llm_spans_come_from_the_usage_report(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app, sc = llm_gateway(tmp_path, llm_app(completion_tokens=7), provider)
    assert (await call(app, sc, BIG_ASK))[0] == 200
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"ingress", "llm.queue", "llm.prefill", "llm.decode"}
    ingress = spans["ingress"]
    assert ingress.context is not None
    stages = [spans[n] for n in ("llm.queue", "llm.prefill", "llm.decode")]
    assert all(s.parent is not None and s.parent.span_id == ingress.context.span_id for s in stages)
    starts_ends = [(s.start_time or 0, s.end_time or 0) for s in stages]
    assert [e - b for b, e in starts_ends] == [2000, 3000, 4000]  # ns
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(starts_ends))  # in order
    assert (ingress.start_time or 0) <= starts_ends[0][0] and starts_ends[-1][1] <= (ingress.end_time or 0)
    assert spans["llm.prefill"].attributes == {"gen_ai.usage.input_tokens": 4, "headroom.llm.cached_tokens": 0}
    assert spans["llm.decode"].attributes == {"gen_ai.usage.output_tokens": 7}
    assert ingress.attributes is not None and ingress.attributes["headroom.llm.finish_reason"] == "stop"
