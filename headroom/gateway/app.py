"""Putting the gateway in front of the server's ASGI app: one call, `wrap_app`.

uvicorn ─► CORSMiddleware (only when origins are configured; answers preflights itself)
             └─► GatewayMiddleware (auth, limits, rate limits, context, tracing)
                   └─► the server's Starlette app (HttpApi routes, LLM routes)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from opentelemetry.trace import TracerProvider
from prometheus_client import CollectorRegistry
from starlette.middleware.cors import CORSMiddleware

from headroom.core.clock import Clock
from headroom.gateway.auth import KeyStore
from headroom.gateway.limits import InputLimits
from headroom.gateway.middleware import ASGIApp, GatewayConfig, GatewayMiddleware
from headroom.gateway.ratelimit import RateLimitConfig, RateLimiter


@dataclass(frozen=True, slots=True)
class CorsConfig:
    """Cross-origin settings for browser clients such as a dashboard served from another origin."""

    allow_origins: tuple[str, ...] = ()  # e.g. ("http://localhost:3000",); empty = no CORS headers at all
    allow_methods: tuple[str, ...] = ("GET", "POST", "OPTIONS")  # methods a browser may use
    allow_headers: tuple[str, ...] = (
        "authorization",
        "content-type",
        "x-api-key",
        "x-request-id",
        "traceparent",
        "inference-header-content-length",
    )  # request headers a browser may send
    expose_headers: tuple[str, ...] = ("x-request-id", "server-timing", "retry-after")  # readable by scripts
    max_age_s: int = 600  # how long browsers may cache a preflight answer


@dataclass(frozen=True, slots=True)
class GatewaySetup:
    """Everything `wrap_app` needs, built from command-line flags by `gateway_setup`."""

    config: GatewayConfig = field(default_factory=GatewayConfig)  # what the middleware enforces
    keys: KeyStore | None = None  # API keys (required when config.auth_enabled)
    cors: CorsConfig = field(default_factory=CorsConfig)  # CORS (off unless origins are set)


def wrap_app(
    app: ASGIApp,
    setup: GatewaySetup,
    clock: Clock | None = None,
    tracer_provider: TracerProvider | None = None,
    registry: CollectorRegistry | None = None,
    limiter: RateLimiter | None = None,
) -> ASGIApp:
    """The server's ASGI app behind the gateway (and CORS when configured); give the result to uvicorn.

    With `registry`, refusals are counted as `headroom_gateway_refused_total{tenant,reason}`; give the same
    `limiter` to `GatewayInterceptor` for gRPC (default: a new one from `setup.config`).
    """
    wrapped: ASGIApp = GatewayMiddleware(
        app, setup.config, setup.keys, clock, tracer_provider, registry, limiter
    )
    if setup.cors.allow_origins:
        wrapped = cast(
            ASGIApp,
            CORSMiddleware(
                cast(Any, wrapped),
                allow_origins=list(setup.cors.allow_origins),
                allow_methods=list(setup.cors.allow_methods),
                allow_headers=list(setup.cors.allow_headers),
                expose_headers=list(setup.cors.expose_headers),
                max_age=setup.cors.max_age_s,
            ),
        )
    return wrapped


def gateway_setup(
    api_keys_file: Path | None = None,
    max_body_bytes: int = InputLimits().max_body_bytes,
    rate_limit_rps: float = 0.0,
    rate_limit_burst: float = 0.0,
    llm_tokens_per_s: float = 0.0,
    llm_token_burst: float = 0.0,
    cors_origins: Sequence[str] = (),
    body_timeout_s: float = InputLimits().body_timeout_s,
    max_json_depth: int = InputLimits().max_json_depth,
    headers_timeout_s: float = InputLimits().headers_timeout_s,
) -> GatewaySetup:
    """Flags → setup. Auth is on exactly when a keys file is given; rates of 0 mean unlimited."""
    keys = KeyStore.from_file(api_keys_file) if api_keys_file is not None else None
    limits = InputLimits(
        max_body_bytes=max_body_bytes, body_timeout_s=body_timeout_s, max_json_depth=max_json_depth,
        headers_timeout_s=headers_timeout_s,
    )
    rates = RateLimitConfig.of(rate_limit_rps, rate_limit_burst, llm_tokens_per_s, llm_token_burst)
    config = GatewayConfig(auth_enabled=keys is not None, limits=limits, rate_limits=rates)
    return GatewaySetup(config, keys, CorsConfig(allow_origins=tuple(cors_origins)))


def exposure_warning(host: str, setup: GatewaySetup, tls_enabled: bool) -> str | None:
    """A warning to print when the server listens beyond loopback without keys or TLS (None when fine)."""
    if host in ("127.0.0.1", "localhost", "::1"):
        return None
    missing = [
        what
        for what, ok in (
            ("API keys (--api-keys-file)", setup.keys is not None),
            ("TLS (--tls-certfile/--tls-keyfile)", tls_enabled),
        )
        if not ok
    ]
    if not missing:
        return None
    return (
        f"listening on {host} without {' and without '.join(missing)}: anyone who can reach this port can "
        "use it; see docs/SECURITY.md"
    )
