"""The gateway of a headroom Ray Serve application: `headroom serve`'s API keys, rate limits and CORS at the ingress.

HTTP: the ingress answers every request through `headroom serve`'s own gateway (`headroom.gateway.app.wrap_app`:
CORS, then `GatewayMiddleware`), built from the application's `api_keys_file`, `max_body_bytes`, `rate_limit_rps` /
`rate_limit_burst`, `llm_tokens_per_s` / `llm_token_burst` and `cors_origins` (`ingress_gateway`). So a request
gets exactly `headroom serve`'s refusals, in the same order and shapes: 431 / 400 headers and paths, 401 with
`WWW-Authenticate` (403 for a missing role), 413 and 408 bodies, 400 JSON shape, 429 with `Retry-After` per
tenant; browsers get CORS preflights and headers. The exempt paths (`/v2/health/*`, `/metrics`) need no key.

gRPC (`IngressAuth.grpc`): the key from `authorization: Bearer <key>` or `x-api-key` metadata, its role, and the
tenant's request bucket (the same `RateLimiter` as HTTP, so a tenant has one budget across transports), as
`headroom serve`'s gRPC interceptor does; health RPCs are exempt. An LLM ModelInfer carries the tenant to the LLM
replica, which runs it as that tenant (its prefix cache scope), as `headroom serve` runs it.

Limits hold per ingress replica (each keeps its own buckets), as they hold per `headroom serve` process: with
`ingress_replicas: N` a tenant may get up to N times the rate. On Serve the LLM-token bucket keeps the whole
reservation of an answered request (prompt estimate + max_tokens x n): the replica's usage does not travel back
to the ingress, so unused tokens are not refunded as `headroom serve` refunds them (a failed request is
refunded whole).

The replicas run their gateway with the same keys and no limits (`replica_gateway`), so a forwarded OpenAI,
generate or embeddings request (its headers travel in the `HttpCall`) runs as its key's tenant there: the LLM's
prefix cache is scoped by tenant and the access log names it. The keys file is re-read when it changes (every
`keys_reload_interval_s`, 5 s): revocations need no redeploy.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from headroom.core.clock import Clock, MonotonicClock
from headroom.core.errors import RateLimited
from headroom.gateway.app import GatewaySetup, gateway_setup
from headroom.gateway.auth import KeyStore, authorize
from headroom.gateway.grpc_auth import ADMIN_RPCS, EXEMPT_RPCS, metadata_key
from headroom.gateway.middleware import GatewayConfig
from headroom.gateway.ratelimit import RateLimiter
from headroom.ray_serve.spec import ServeAppSpec


def replica_gateway(api_keys_file: str) -> GatewaySetup:
    """The gateway a replica runs its HTTP app behind: the application's keys, or none (limits are the ingress's)."""
    return gateway_setup(Path(api_keys_file)) if api_keys_file else GatewaySetup()


def ingress_gateway(spec: ServeAppSpec) -> GatewaySetup:
    """The ingress's gateway, as `headroom serve`'s flags would build it."""
    return gateway_setup(Path(spec.api_keys_file) if spec.api_keys_file else None, spec.max_body_bytes,
                         spec.rate_limit_rps, spec.rate_limit_burst, spec.llm_tokens_per_s, spec.llm_token_burst,
                         spec.cors_origins)


class IngressAuth:
    """The ingress's gRPC check: key, role and the tenant's request bucket (no keys: the anonymous tenant)."""

    def __init__(self, keys: KeyStore | None, config: GatewayConfig | None = None,
                 limiter: RateLimiter | None = None, clock: Clock | None = None) -> None:
        self.keys = keys
        self.config = config or GatewayConfig(auth_enabled=keys is not None)
        self.limiter = limiter if limiter is not None and limiter.enabled else None
        self.clock = clock or MonotonicClock()
        self._checked_s = time.monotonic()

    @classmethod
    def of(cls, setup: GatewaySetup, limiter: RateLimiter | None = None) -> IngressAuth:
        return cls(setup.keys, setup.config, limiter)

    def grpc(self, rpc: str, metadata: Sequence[tuple[str, str | bytes]] | None) -> str:
        """The tenant a gRPC call runs as; raises the HeadroomError refusing it (UNAUTHENTICATED,
        PERMISSION_DENIED, RESOURCE_EXHAUSTED) unless it may run."""
        if rpc in EXEMPT_RPCS:
            return self.config.anonymous_tenant
        tenant = self.config.anonymous_tenant
        if self.keys is not None:
            now_s = time.monotonic()
            if now_s - self._checked_s >= self.config.keys_reload_interval_s:
                self._checked_s = now_s
                self.keys.reload_if_changed()
            principal = self.keys.authenticate(metadata_key(metadata))
            authorize(principal, "admin" if rpc in ADMIN_RPCS else "user")
            tenant = principal.tenant
        if self.limiter is not None:
            decision = self.limiter.check(tenant, 0, self.clock.now_s())
            if not decision.allowed:
                raise RateLimited(f"tenant {tenant!r} is over its requests rate limit; retry after "
                                  f"{decision.retry_after_s:.2f}s", retry_after_s=decision.retry_after_s)
        return tenant
