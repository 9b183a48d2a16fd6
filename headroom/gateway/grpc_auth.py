"""The gateway's checks for gRPC as a server interceptor: API key (metadata), role, per-tenant bucket.

    grpc.aio.server(interceptors=[GatewayInterceptor(keys, limiter)])

Metadata `authorization: Bearer <key>` or `x-api-key: <key>`, as over HTTP. Refusals abort the call with
the error tree's gRPC code (UNAUTHENTICATED, PERMISSION_DENIED, RESOURCE_EXHAUSTED + `retry-after` trailing
metadata). Share one `RateLimiter` with the HTTP middleware so a tenant has one budget across transports.
A stream (ModelStreamInfer) is charged once, when it opens; an LLM call's tokens are charged where its message is
read (`headroom.gateway.llm_budget`). The RPC then runs with the caller's `RequestContext`
bound (`headroom.gateway.context`): its tenant scopes the LLM's prefix cache on gRPC as on HTTP, and log lines name it.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from headroom.core.clock import Clock, MonotonicClock
from headroom.core.errors import HeadroomError, RateLimited
from headroom.gateway.auth import KeyStore, Role, authorize
from headroom.gateway.context import RequestContext, bind_context
from headroom.gateway.llm_budget import LLMBudget, bind_llm_budget

#: Health RPCs: no key, no bucket (probes).
EXEMPT_RPCS: tuple[str, ...] = ("ServerLive", "ServerReady", "ModelReady")
#: Management RPCs: admin role.
ADMIN_RPCS: tuple[str, ...] = (
    "RepositoryModelLoad",
    "RepositoryModelUnload",
    "SystemSharedMemoryRegister",
    "SystemSharedMemoryUnregister",
    "CudaSharedMemoryRegister",
    "CudaSharedMemoryUnregister",
    "TraceSetting",
    "LogSettings",
)


def metadata_key(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The API key from gRPC metadata (`authorization: Bearer ...` or `x-api-key`)."""
    values = {k.lower(): v for k, v in (metadata or ()) if isinstance(v, str)}
    auth = values.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return values.get("x-api-key", "").strip() or None


def _abort_handler(handler: Any, exc: HeadroomError) -> Any:
    """A handler of the same shape as `handler` that only aborts with `exc`'s status."""
    code = getattr(grpc.StatusCode, exc.grpc_code, grpc.StatusCode.INTERNAL)
    trailing: tuple[tuple[str, str], ...] = ()
    if exc.retry_after_s is not None:
        trailing = (("retry-after", str(max(1, int(-(-exc.retry_after_s // 1))))),)

    async def abort(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, exc.message, trailing_metadata=trailing)

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(bool(handler.request_streaming), bool(handler.response_streaming))]
    return make(
        abort,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _bound_handler(handler: Any, ctx: RequestContext, budget: LLMBudget | None) -> Any:
    """`handler` with `ctx` (and the tenant's LLM-token `budget`, when it has a limit) bound while its behaviour
    runs (each RPC runs in its own task, so nothing leaks)."""

    def bind() -> None:
        bind_context(ctx)
        if budget is not None:
            bind_llm_budget(budget)

    def wrap(behavior: Any) -> Any:
        if inspect.isasyncgenfunction(behavior):
            async def stream(request: Any, context: Any) -> Any:
                bind()
                async for item in behavior(request, context):
                    yield item
            return stream

        async def call(request: Any, context: Any) -> Any:
            bind()
            result = behavior(request, context)
            return await result if inspect.isawaitable(result) else result
        return call

    kinds = {
        "unary_unary": grpc.unary_unary_rpc_method_handler, "unary_stream": grpc.unary_stream_rpc_method_handler,
        "stream_unary": grpc.stream_unary_rpc_method_handler, "stream_stream": grpc.stream_stream_rpc_method_handler,
    }
    for kind, make in kinds.items():
        behavior = getattr(handler, kind, None)
        if behavior is not None:
            return make(wrap(behavior), request_deserializer=handler.request_deserializer,
                        response_serializer=handler.response_serializer)
    return handler


class GatewayInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Authenticates, authorizes and rate-limits every RPC except the health ones."""

    def __init__(
        self,
        keys: KeyStore | None,
        limiter: Any = None,
        clock: Clock | None = None,
        anonymous_tenant: str = "anonymous",
        exempt_rpcs: Sequence[str] = EXEMPT_RPCS,
        admin_rpcs: Sequence[str] = ADMIN_RPCS,
    ) -> None:
        self.keys = keys  # None: auth off (rate limits still apply, to `anonymous_tenant`)
        self.limiter = limiter  # a headroom.gateway.ratelimit.RateLimiter, or None for no limits
        self.clock = clock or MonotonicClock()
        self.anonymous_tenant = anonymous_tenant
        self.exempt = frozenset(exempt_rpcs)
        self.admin = frozenset(admin_rpcs)

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: Any
    ) -> Any:
        handler = await continuation(handler_call_details)
        method = str(handler_call_details.method).rsplit("/", 1)[-1]
        if handler is None or method in self.exempt:
            return handler
        try:
            tenant, key_id = self.anonymous_tenant, ""
            if self.keys is not None:
                principal = self.keys.authenticate(metadata_key(handler_call_details.invocation_metadata))
                needed: Role = "admin" if method in self.admin else "user"
                authorize(principal, needed)
                tenant, key_id = principal.tenant, principal.key_id
            if self.limiter is not None:
                decision = self.limiter.check(tenant, 0, self.clock.now_s())
                if not decision.allowed:
                    raise RateLimited(
                        f"tenant {tenant!r} is over its requests rate limit; retry after "
                        f"{decision.retry_after_s:.2f}s",
                        retry_after_s=decision.retry_after_s,
                    )
        except HeadroomError as exc:
            return _abort_handler(handler, exc)
        budget = None
        if self.limiter is not None and self.limiter.config_for(tenant).llm_tokens.enabled:
            budget = LLMBudget(self.limiter, tenant, self.clock)
        return _bound_handler(handler, RequestContext("", tenant, key_id, ""), budget)
