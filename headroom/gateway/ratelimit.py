"""Token-bucket rate limits per tenant, as a pure policy: (config, state, cost, now_s) -> (decision, state).

Two buckets per tenant: one counts requests, one counts LLM tokens (prompt estimate + max_tokens × n). A
bucket holds at most `burst` tokens and refills at `rate_per_s`; a request that finds too few tokens is
refused with the exact time until enough will be there (`Retry-After`). LLM tokens are charged up front
(so admission is immediate) and settled when the request ends: `refund` gives back what was reserved but not
generated (never above the burst), or charges an overrun (a negative refund). Nothing here reads a clock or
mutates anything; `RateLimiter` is the thin stateful holder the middleware uses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace


@dataclass(frozen=True, slots=True)
class BucketConfig:
    """One token bucket's shape."""

    rate_per_s: float  # refill rate in tokens per second; 0 disables the bucket (unlimited)
    burst: float  # bucket capacity: the most tokens a tenant can spend at once

    def __post_init__(self) -> None:
        if self.rate_per_s < 0 or not math.isfinite(self.rate_per_s):
            raise ValueError(f"rate_per_s must be a finite number >= 0, got {self.rate_per_s}")
        if self.rate_per_s > 0 and (self.burst < 1 or not math.isfinite(self.burst)):
            raise ValueError(f"burst must be a finite number >= 1 when a rate is set, got {self.burst}")

    @property
    def enabled(self) -> bool:
        return self.rate_per_s > 0


@dataclass(frozen=True, slots=True)
class BucketState:
    """A bucket's level at a moment."""

    tokens: float  # tokens available at `updated_s`
    updated_s: float  # monotonic time the level was computed at


@dataclass(frozen=True, slots=True)
class BucketDecision:
    """The answer for one take from one bucket."""

    allowed: bool  # True: the tokens were taken
    retry_after_s: float  # 0 when allowed; else seconds until `cost` tokens will be there (inf: never)
    remaining: float  # tokens left after the take (or now, when refused)


def take(
    config: BucketConfig, state: BucketState | None, cost: float, now_s: float
) -> tuple[BucketDecision, BucketState | None]:
    """Try to take `cost` tokens at `now_s`; no state is a full bucket; a disabled bucket always allows."""
    if cost < 0:
        raise ValueError(f"cost must be >= 0, got {cost}")
    if not config.enabled:
        return BucketDecision(True, 0.0, math.inf), state
    if state is None:
        level = config.burst
    else:
        elapsed_s = max(0.0, now_s - state.updated_s)  # a clock that steps back never adds tokens
        level = min(config.burst, state.tokens + elapsed_s * config.rate_per_s)
    if cost <= level:
        return BucketDecision(True, 0.0, level - cost), BucketState(level - cost, now_s)
    retry_s = math.inf if cost > config.burst else (cost - level) / config.rate_per_s
    return BucketDecision(False, retry_s, level), BucketState(level, now_s)


def give_back(
    config: BucketConfig, state: BucketState | None, amount: float, now_s: float
) -> BucketState | None:
    """Put `amount` tokens back at `now_s` (a refund), capped at `burst`; a negative amount takes more.

    A charge beyond what is there leaves the bucket below zero (a debt the refill pays off before the next
    request fits). No state is a full bucket, which a refund cannot raise; a disabled bucket is untouched.
    """
    if not math.isfinite(amount):
        raise ValueError(f"amount must be finite, got {amount}")
    if not config.enabled or (state is None and amount >= 0):
        return state
    if state is None:
        level = config.burst
    else:
        elapsed_s = max(0.0, now_s - state.updated_s)
        level = min(config.burst, state.tokens + elapsed_s * config.rate_per_s)
    return BucketState(min(config.burst, level + amount), now_s)


@dataclass(frozen=True, slots=True)
class RateLimitConfig:
    """A tenant's limits (0 rate = unlimited)."""

    requests: BucketConfig = field(default_factory=lambda: BucketConfig(0.0, 0.0))  # requests per second
    llm_tokens: BucketConfig = field(default_factory=lambda: BucketConfig(0.0, 0.0))  # LLM tokens per second

    @staticmethod
    def of(
        requests_per_s: float = 0.0,
        request_burst: float = 0.0,
        llm_tokens_per_s: float = 0.0,
        llm_token_burst: float = 0.0,
    ) -> RateLimitConfig:
        """Convenience constructor; a burst of 0 defaults to one second's worth (at least 1)."""
        return RateLimitConfig(
            BucketConfig(requests_per_s, request_burst or max(1.0, requests_per_s)),
            BucketConfig(llm_tokens_per_s, llm_token_burst or max(1.0, llm_tokens_per_s)),
        )


@dataclass(frozen=True, slots=True)
class TenantState:
    """Both buckets of one tenant."""

    requests: BucketState | None = None  # request bucket (None = full)
    llm_tokens: BucketState | None = None  # LLM token bucket (None = full)


@dataclass(frozen=True, slots=True)
class AdmitDecision:
    """Whether one request of a tenant may proceed, and if not, why and for how long."""

    allowed: bool  # True: both buckets had enough
    retry_after_s: float  # seconds until a retry can succeed (inf: this request can never fit)
    limit: str  # "" when allowed, else which bucket refused: "requests" or "llm_tokens"


def admit(
    config: RateLimitConfig, state: TenantState, llm_tokens: float, now_s: float
) -> tuple[AdmitDecision, TenantState]:
    """One request: 1 request token and `llm_tokens` LLM tokens. All or nothing: a refusal takes none."""
    req_dec, req_state = take(config.requests, state.requests, 1.0, now_s)
    if not req_dec.allowed:
        return AdmitDecision(False, req_dec.retry_after_s, "requests"), replace(state, requests=req_state)
    if llm_tokens > 0:
        tok_dec, tok_state = take(config.llm_tokens, state.llm_tokens, llm_tokens, now_s)
        if not tok_dec.allowed:  # give the request token back: nothing was admitted
            refund = state.requests
            if config.requests.enabled and req_state is not None:
                refund = BucketState(req_state.tokens + 1.0, now_s)
            return AdmitDecision(False, tok_dec.retry_after_s, "llm_tokens"), TenantState(refund, tok_state)
        return AdmitDecision(True, 0.0, ""), TenantState(req_state, tok_state)
    return AdmitDecision(True, 0.0, ""), replace(state, requests=req_state)


def refund(config: RateLimitConfig, state: TenantState, llm_tokens: float, now_s: float) -> TenantState:
    """Settle an admitted request's LLM tokens: give back `llm_tokens` unused (negative: charge the overrun)."""
    return replace(state, llm_tokens=give_back(config.llm_tokens, state.llm_tokens, llm_tokens, now_s))


class RateLimiter:
    """Holds every tenant's bucket state; the decisions are `admit`'s. Not thread-safe (one event loop)."""

    def __init__(
        self,
        default: RateLimitConfig,
        per_tenant: Mapping[str, RateLimitConfig] | None = None,
        max_tracked_tenants: int = 10_000,
    ) -> None:
        self.default = default
        self.per_tenant = dict(per_tenant or {})
        self.max_tracked_tenants = max_tracked_tenants  # above this, full buckets are forgotten
        self._state: dict[str, TenantState] = {}

    def config_for(self, tenant: str) -> RateLimitConfig:
        return self.per_tenant.get(tenant, self.default)

    @property
    def enabled(self) -> bool:
        configs = [self.default, *self.per_tenant.values()]
        return any(c.requests.enabled or c.llm_tokens.enabled for c in configs)

    def check(self, tenant: str, llm_tokens: float, now_s: float) -> AdmitDecision:
        decision, new_state = admit(
            self.config_for(tenant), self._state.get(tenant, TenantState()), llm_tokens, now_s
        )
        self._state[tenant] = new_state
        if len(self._state) > self.max_tracked_tenants:
            self._forget_full(now_s)
        return decision

    def check_llm(self, tenant: str, llm_tokens: float, now_s: float) -> AdmitDecision:
        """Take `llm_tokens` from the tenant's LLM-token bucket only: a call whose request token was taken when
        it opened (gRPC, whose message is read after the interceptor)."""
        config, state = self.config_for(tenant), self._state.get(tenant, TenantState())
        decision, new_state = take(config.llm_tokens, state.llm_tokens, llm_tokens, now_s)
        self._state[tenant] = replace(state, llm_tokens=new_state)
        return AdmitDecision(decision.allowed, decision.retry_after_s, "" if decision.allowed else "llm_tokens")

    def refund(self, tenant: str, llm_tokens: float, now_s: float) -> None:
        """Settle LLM tokens charged by `check` (see `refund`); a forgotten tenant's bucket is already full."""
        state = self._state.get(tenant)
        if state is None and llm_tokens >= 0:
            return
        self._state[tenant] = refund(self.config_for(tenant), state or TenantState(), llm_tokens, now_s)

    def _forget_full(self, now_s: float) -> None:
        """Drop tenants whose buckets have refilled: forgetting them changes no future decision."""

        def full(b: BucketState | None, c: BucketConfig) -> bool:
            return b is None or not c.enabled or b.tokens + (now_s - b.updated_s) * c.rate_per_s >= c.burst

        for tenant in [
            t
            for t, s in self._state.items()
            if full(s.requests, self.config_for(t).requests)
            and full(s.llm_tokens, self.config_for(t).llm_tokens)
        ]:
            del self._state[tenant]
