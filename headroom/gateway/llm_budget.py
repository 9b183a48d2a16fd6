"""A gRPC call's LLM-token budget: the tenant's LLM-token bucket, charged where the message is read.

Over HTTP the gateway reads the body, estimates the LLM tokens a request may use (prompt characters / 4 + max_tokens
x n) and charges the tenant's bucket before the app runs, then refunds what was not generated. A gRPC interceptor
sees no message, so `GatewayInterceptor` binds an `LLMBudget` for the call instead, and the LLM's gRPC path
(`headroom.llm.grpc_generate`) reserves the estimate when it has decoded the request (429 / RESOURCE_EXHAUSTED
beyond the bucket, 400 when it could never fit) and settles with the generation's usage, exactly as HTTP does.
The call's request token was taken when it opened (the interceptor's `check`), so only the LLM bucket is charged.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from headroom.core.clock import Clock
from headroom.core.errors import InvalidRequest, RateLimited
from headroom.gateway.ratelimit import RateLimiter
from headroom.gateway.usage import LLMUsage, unused_tokens


@dataclass(frozen=True, slots=True)
class LLMBudget:
    """One tenant's LLM-token bucket as one call sees it."""

    limiter: RateLimiter
    tenant: str
    clock: Clock

    def reserve(self, prompt_tokens: int, completion_tokens: int) -> int:
        """Charge the estimate; the completion tokens reserved (settle them with `settle`)."""
        total = prompt_tokens + completion_tokens
        decision = self.limiter.check_llm(self.tenant, total, self.clock.now_s())
        if decision.allowed:
            return completion_tokens
        if decision.retry_after_s == float("inf"):
            burst = self.limiter.config_for(self.tenant).llm_tokens.burst
            raise InvalidRequest(f"this request may use {total} LLM tokens, more than tenant {self.tenant!r} can "
                                 f"ever spend at once ({burst:.0f}); lower max_tokens or n, or shorten the prompt")
        raise RateLimited(f"tenant {self.tenant!r} is over its LLM tokens rate limit; retry after "
                          f"{decision.retry_after_s:.2f}s", retry_after_s=decision.retry_after_s)

    def settle(self, reserved: int, usage: LLMUsage | None, status_code: int) -> None:
        """Give back what was reserved and not generated (`headroom.gateway.usage.unused_tokens`)."""
        self.limiter.refund(self.tenant, unused_tokens(reserved, usage, status_code), self.clock.now_s())


_current: ContextVar[LLMBudget | None] = ContextVar("headroom_llm_budget", default=None)


def bind_llm_budget(budget: LLMBudget) -> None:
    """Bind `budget` for the rest of the current task (a gRPC call runs in its own)."""
    _current.set(budget)


def current_llm_budget() -> LLMBudget | None:
    return _current.get()


__all__ = ["LLMBudget", "bind_llm_budget", "current_llm_budget"]
