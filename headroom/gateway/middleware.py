"""The gateway as pure ASGI middleware: auth, per-tenant rate limits, input limits, slow clients, context.

Per HTTP request, in order (each refusal is one JSON 4xx and the app is never called):

    headers (431) → path / model name (400) → API key (401) and role (403) → body: Content-Encoding (400
    unless gzip / deflate / identity), size (413), slow client (408 + connection closed), decompressed size
    (413) and corrupt stream (400) (`headroom.gateway.content_encoding`), JSON depth / string length (400),
    OpenAI model name and LLM knobs (400)
    → token buckets for the tenant (429 + Retry-After) → the app, with the body in the scope (the handlers'
    `limits.read_body` takes it from there instead of reading it again; a replaying `receive` serves the
    others; a compressed body arrives decoded, without Content-Encoding) and the request id (and the
    ingress span's traceparent) in its headers.

It wraps `send` only to note the status and add `X-Request-Id`, passing every message on at once, so
streamed (SSE) responses stay streamed. Health probes and /metrics (configurable) skip auth and rate limits.
When the request ends (just before its last body message goes out, or after the app returns when the client
left or the app failed) it settles the LLM tokens charged up front, refunding what was reserved but not
generated (`headroom.gateway.usage`), ends the ingress span with its stage spans, and writes the access line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import TracerProvider
from prometheus_client import CollectorRegistry, Counter

from headroom.core.clock import Clock, MonotonicClock
from headroom.core.errors import Cancelled, HeadroomError, InvalidRequest, PayloadTooLarge, RateLimited
from headroom.core.server_timing import parse_server_timing
from headroom.gateway.access import log_refusal
from headroom.gateway.asgi import (
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    header_value,
    presented_key,
    replay_body,
    send_error,
)
from headroom.gateway.auth import (
    DEFAULT_ADMIN_PATHS,
    KeyStore,
    Principal,
    authorize,
    compile_paths,
    required_role,
)
from headroom.gateway.content_encoding import BodySink, body_sink, decoded_headers
from headroom.gateway.context import RequestContext, bind_context, reset_context
from headroom.gateway.errors import RequestTimeout
from headroom.gateway.forwarded_tenant import TENANT_HEADER, claimed_tenant
from headroom.gateway.limits import (
    BODY_SCOPE_KEY,
    EMBEDDING_PATHS,
    InputLimits,
    TokenEstimate,
    body_deadline_s,
    check_content_length,
    check_headers,
    check_json_shape,
    check_model_path,
    count_body_chunk,
    estimate_openai_body,
    is_llm_path,
)
from headroom.gateway.ratelimit import RateLimitConfig, RateLimiter
from headroom.gateway.tracing import (
    IngressSpan,
    SpanPlan,
    llm_span_plan,
    parse_traceparent,
    span_plan_from_server_timing,
)
from headroom.gateway.usage import LLMUsage, reported_usage, unused_tokens

access_log = logging.getLogger("headroom.gateway.access")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """What the gateway enforces. The default (auth off, no rate limits) only applies the input limits."""

    auth_enabled: bool = False  # require an API key on every non-exempt path
    exempt_paths: tuple[str, ...] = ("/v2/health/", "/metrics")  # paths without auth or rate limits
    admin_paths: tuple[str, ...] = DEFAULT_ADMIN_PATHS  # regexes of paths that need the admin role
    limits: InputLimits = field(default_factory=InputLimits)  # headers, body, JSON, LLM knobs, slow clients
    rate_limits: RateLimitConfig = field(default_factory=RateLimitConfig)  # every tenant's buckets
    tenant_rate_limits: Mapping[str, RateLimitConfig] = field(default_factory=dict)  # per-tenant overrides
    anonymous_tenant: str = "anonymous"  # tenant name when auth is off
    keys_reload_interval_s: float = 5.0  # how often to check the keys file for changes (revocations)
    access_log: bool = True  # one `headroom.gateway.access` JSON line per request (never headers or keys)
    llm_access_log: bool = True  # that line for the OpenAI generation routes even when access_log is off
    trust_tenant_header: bool = False  # without keys: a router's x-headroom-tenant names the tenant


def exempt_matcher(exempt_paths: tuple[str, ...]) -> Callable[[str], bool]:
    """`is_exempt` with the paths compiled once: an exact-path set and one prefix tuple (per-request cheap)."""
    exact = frozenset(p.rstrip("/") for p in exempt_paths)
    prefixes = tuple(p if p.endswith("/") else p + "/" for p in exempt_paths)

    def matches(path: str) -> bool:
        return path in exact or path.startswith(prefixes)

    return matches


def is_exempt(path: str, exempt_paths: tuple[str, ...]) -> bool:
    """`/metrics` exempts exactly that path (and below it); `/v2/health/` everything below it."""
    return exempt_matcher(exempt_paths)(path)


class _ClientGone(Exception):
    """The client disconnected while the gateway read its body."""


class GatewayMiddleware:
    """Pure ASGI: `GatewayMiddleware(app, config, keys)` is itself an ASGI app."""

    def __init__(
        self,
        app: ASGIApp,
        config: GatewayConfig,
        keys: KeyStore | None = None,
        clock: Clock | None = None,
        tracer_provider: TracerProvider | None = None,
        registry: CollectorRegistry | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        if config.auth_enabled and keys is None:
            raise ValueError("auth is enabled but no keys were given: pass --api-keys-file, or turn auth off")
        self.app = app
        self.config = config
        self.keys = keys
        self.clock = clock or MonotonicClock()
        self.tracer_provider = tracer_provider
        # pass one limiter to the gRPC interceptor too, so a tenant has one budget across transports
        self.limiter = limiter or RateLimiter(config.rate_limits, config.tenant_rate_limits)
        self._rate_limited = self.limiter.enabled  # skip the buckets entirely when no limit is set
        self.refused = (
            Counter(
                "headroom_gateway_refused",
                "Requests the gateway refused, by tenant and reason.",
                ["tenant", "reason"],
                registry=registry,
            )
            if registry is not None
            else None
        )
        self._admin = compile_paths(config.admin_paths)
        self._is_exempt = exempt_matcher(config.exempt_paths)  # compiled once, not per request
        self._keys_checked_s = self.clock.now_s()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started_s, started_ns = self.clock.now_s(), time.time_ns()
        path: str = scope["path"]
        headers: list[tuple[bytes, bytes]] = list(scope["headers"])
        raw_id = header_value(headers, b"x-request-id")
        request_id = raw_id.decode("latin-1")[:128] if raw_id else os.urandom(8).hex()
        if raw_id is None:
            headers.append((b"x-request-id", request_id.encode()))
        tenant, key_id = self.config.anonymous_tenant, ""
        ingress: IngressSpan | None = None
        status = {"code": 0}
        refused = ""  # the reason when the gateway answered itself (the data plane never sees the request)
        state: dict[str, Any] = {}
        server_timing: list[bytes] = []
        reserved_tokens = 0  # LLM completion tokens charged up front, settled when the request ends
        settled = False
        token = bind_context(RequestContext(request_id, tenant, key_id, ""))

        def settle() -> None:
            """Refund unused LLM tokens and end the spans, once, when the response is complete."""
            nonlocal settled
            if settled:
                return
            settled = True
            usage = reported_usage(state)
            if reserved_tokens:
                refund = unused_tokens(reserved_tokens, usage, status["code"])
                self.limiter.refund(tenant, refund, self.clock.now_s())
            if ingress is not None:
                _finish_span(ingress, server_timing, status["code"], usage)

        try:
            try:
                check_headers(headers, self.config.limits)
                check_model_path(scope.get("raw_path") or path.encode("utf-8"))
                exempt = self._is_exempt(path)
                principal = None if exempt else self._authenticate(headers, path)
                if principal is not None:
                    tenant, key_id = principal.tenant, principal.key_id
                elif self.config.trust_tenant_header and not self.config.auth_enabled:  # behind a router
                    tenant = claimed_tenant(header_value(headers, TENANT_HEADER.encode())) or tenant
                bind_context(RequestContext(request_id, tenant, key_id, ""))
                body: bytes | None = None
                estimate = TokenEstimate(0, 0)
                if scope["method"] in _BODY_METHODS:  # a compressed body is decoded as it arrives
                    sink = body_sink(headers, self.config.limits.max_body_bytes)  # 400: unknown encoding
                    body = await self._read_body(receive, headers, sink)
                    headers = decoded_headers(headers, len(body)) if sink.decoded else headers
                    estimate = self._check_body(path, headers, body)
                if not exempt and self._rate_limited:
                    self._rate_limit(tenant, estimate.total)
                    if is_llm_path(path) and self.limiter.config_for(tenant).llm_tokens.enabled:
                        reserved_tokens = estimate.completion_tokens
            except HeadroomError as exc:  # 408/413: the body was not read, so hang up after answering
                status["code"], refused = exc.http_status, exc.reason
                if self.refused is not None:
                    self.refused.labels(tenant, exc.reason).inc()
                close = isinstance(exc, RequestTimeout | PayloadTooLarge)
                await send_error(send, exc, path, request_id, close=close)
                return
            except _ClientGone:
                status["code"], refused = Cancelled.http_status, Cancelled.reason
                return
            if self.tracer_provider is not None:
                parent = parse_traceparent((header_value(headers, b"traceparent") or b"").decode("latin-1"))
                attributes = {"http.request.method": str(scope["method"]), "url.path": path}
                ingress = IngressSpan(
                    self.tracer_provider, "ingress", parent, request_id, tenant, started_ns, attributes
                )
                headers = [(k, v) for k, v in headers if k != b"traceparent"]  # tracestate passes on as is
                headers.append((b"traceparent", ingress.traceparent.encode()))
                bind_context(RequestContext(request_id, tenant, key_id, ingress.traceparent))
            state.update(scope.get("state", {}))
            state.update({"tenant": tenant, "key_id": key_id, "request_id": request_id, "received_s": started_s})
            inner_scope = {**scope, "headers": headers, "state": state}
            if body is not None:  # read once: `limits.read_body` takes it from here (others get the replay)
                inner_scope[BODY_SCOPE_KEY] = body
            try:
                await self.app(
                    inner_scope,
                    replay_body(body, receive) if body is not None else receive,
                    self._wrap_send(send, request_id, status, server_timing, settle),
                )
            except Exception:
                status["code"] = status["code"] or 500
                raise
        finally:
            settle()  # the client left, or the app failed, before the last body message
            wanted = self.config.access_log or (self.config.llm_access_log and is_llm_path(path))
            if wanted and access_log.isEnabledFor(logging.INFO):
                fields: dict[str, Any] = {
                    "method": scope["method"],
                    "path": path,
                    "status": status["code"],
                    "tenant": tenant,
                    "key_id": key_id,
                    "request_id": request_id,
                    "duration_ms": round((self.clock.now_s() - started_s) * 1e3, 3),
                }
                usage = reported_usage(state)
                if usage is not None:
                    fields.update(usage.log_fields())
                access_log.info("%s %s %d", scope["method"], path, status["code"], extra={"fields": fields})
            elif refused and not wanted:  # the app behind writes the other lines; it never saw this request
                log_refusal(path, status["code"], refused, (self.clock.now_s() - started_s) * 1e3)
            reset_context(token)

    # -- steps -------------------------------------------------------------------------------------------
    def _authenticate(self, headers: list[tuple[bytes, bytes]], path: str) -> Principal | None:
        if not self.config.auth_enabled or self.keys is None:
            return None
        now_s = self.clock.now_s()
        if now_s - self._keys_checked_s >= self.config.keys_reload_interval_s:
            self._keys_checked_s = now_s
            self.keys.reload_if_changed()
        principal = self.keys.authenticate(presented_key(headers))
        authorize(principal, required_role(path, self._admin))
        return principal

    async def _read_body(self, receive: Receive, headers: list[tuple[bytes, bytes]], sink: BodySink) -> bytes:
        limits = self.config.limits
        check_content_length(header_value(headers, b"content-length"), limits)  # the bytes sent (compressed)
        total = 0
        started_s = self.clock.now_s()
        while True:
            timeout_s = body_deadline_s(limits, started_s, total) - self.clock.now_s()
            if timeout_s <= 0:
                raise _slow(limits, total)
            try:
                async with asyncio.timeout(None if timeout_s == float("inf") else timeout_s):  # no extra task
                    message = await receive()
            except TimeoutError:
                raise _slow(limits, total) from None
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk: bytes = message.get("body", b"")
            total = count_body_chunk(total, chunk, limits.max_body_bytes)
            await sink.feed(chunk)  # decoded at once (413 past the limit, 400 when corrupt)
            if not message.get("more_body", False):
                return sink.body()

    def _check_body(self, path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> TokenEstimate:
        limits = self.config.limits
        header_len = header_value(headers, b"inference-header-content-length")
        if header_len is not None:
            if not header_len.isdigit():
                raise InvalidRequest("Inference-Header-Content-Length must be an integer")
            check_json_shape(body[: int(header_len)], limits)
        elif (
            path.startswith("/v1/")
            or b"json" in (header_value(headers, b"content-type") or b"")
            or path.endswith("/infer")
        ):
            check_json_shape(body, limits)
        if is_llm_path(path):
            return estimate_openai_body(path, body, limits)
        if path in EMBEDDING_PATHS:
            estimate_openai_body(path, body, limits)
        return TokenEstimate(0, 0)

    def _rate_limit(self, tenant: str, llm_tokens: int) -> None:
        decision = self.limiter.check(tenant, llm_tokens, self.clock.now_s())
        if decision.allowed:
            return
        if decision.retry_after_s == float("inf"):
            burst = self.limiter.config_for(tenant).llm_tokens.burst
            raise InvalidRequest(
                f"this request may use {llm_tokens} LLM tokens, more than tenant {tenant!r} can "
                f"ever spend at once ({burst:.0f}); lower max_tokens or n, or shorten the prompt"
            )
        what = "requests" if decision.limit == "requests" else "LLM tokens"
        raise RateLimited(
            f"tenant {tenant!r} is over its {what} rate limit; retry after {decision.retry_after_s:.2f}s",
            retry_after_s=decision.retry_after_s,
        )

    def _wrap_send(
        self,
        send: Send,
        request_id: str,
        status: dict[str, int],
        server_timing: list[bytes],
        on_last_body: Callable[[], None],
    ) -> Send:
        """Note the status and Server-Timing, add X-Request-Id; call `on_last_body` before the last body goes."""

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
                out = list(message.get("headers", []))
                if header_value(out, b"x-request-id") is None:
                    out.append((b"x-request-id", request_id.encode("latin-1")))
                timing = header_value(out, b"server-timing")
                if timing is not None:
                    server_timing.append(timing)
                message = {**message, "headers": out}
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                on_last_body()  # before the client can see the end (and send its next request)
            await send(message)

        return wrapped


def _finish_span(
    ingress: IngressSpan, server_timing: list[bytes], status_code: int, usage: LLMUsage | None
) -> None:
    plan: SpanPlan | None = None
    if usage is not None:
        plan = llm_span_plan(usage)
    elif server_timing:
        plan = span_plan_from_server_timing(parse_server_timing(server_timing[0].decode("latin-1")))
    if plan is None:
        ingress.finish([], time.time_ns(), None, status_code)
        return
    ingress.finish(
        plan.stages, time.time_ns(), plan.total_ms, status_code, plan.stage_attributes, plan.attributes
    )


def _slow(limits: InputLimits, received: int) -> RequestTimeout:
    return RequestTimeout(
        f"the request body arrived too slowly ({received} bytes so far): it must arrive within "
        f"{limits.body_timeout_s:g}s and, after {limits.body_grace_s:g}s, at "
        f"{limits.min_body_rate_bytes_per_s:g} bytes/s or more"
    )


__all__ = ["ASGIApp", "GatewayConfig", "GatewayMiddleware", "presented_key"]
