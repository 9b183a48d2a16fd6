"""Tail tolerance as pure policies: hedging, the retry and hedge budgets, which outcomes are retried.

* Hedging (Dean & Barroso, "The Tail at Scale"): send a backup copy to another replica once a request has
  waited longer than the `hedge_percentile` (p95) of recent latencies; the first answer wins and the loser is
  cancelled. A token bucket keeps hedges <= `budget_fraction` (5%) of requests: every request deposits
  `budget_fraction` of a token, every hedge spends one.
* Retry budget (Finagle `RetryBudget` / Envoy `retry_budget`, 20%): requests that never started on a
  replica (connection refused, replica not ready or draining) are retried, and so are idempotent ones whose
  connection was reset before any answer reached the client; each retry spends a token, every request
  deposits `budget_fraction` (0.2) tokens, and a small floor of `min_retries_per_s` refills with time so a
  quiet router can still retry. Overload never turns into a retry storm: retries <= 20% of load + the floor.
  Retries off a replica that left rotation (refused, draining: `OUT_OF_ROTATION`) are free.

Admission (coordinated shedding, the adaptive concurrency limit) lives in `headroom.router.shed`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# ----------------------------------------------------------------------------------------------- latency


@dataclass(frozen=True, slots=True)
class LatencyWindow:
    """The most recent latencies, oldest first (bounded)."""

    samples_s: tuple[float, ...] = ()  # recent end-to-end latencies in seconds
    max_samples: int = 1000  # ring size

    def add(self, sample_s: float) -> LatencyWindow:
        kept = self.samples_s[-(self.max_samples - 1):] if self.max_samples > 1 else ()
        return LatencyWindow((*kept, sample_s), self.max_samples)

    def percentile_s(self, q: float) -> float | None:
        """Nearest-rank percentile (q in (0, 1]); None when empty."""
        if not self.samples_s:
            return None
        ordered = sorted(self.samples_s)
        rank = max(1, math.ceil(q * len(ordered)))
        return ordered[rank - 1]


# ------------------------------------------------------------------------------------------------ budgets


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    """A token bucket that limits extra requests (hedges or retries) to a fraction of requests."""

    budget_fraction: float  # tokens deposited per request (0.05 hedges: Tail at Scale; 0.2 retries: Envoy)
    max_tokens: float = 10.0  # bucket size: the largest burst of extra requests allowed
    min_per_s: float = 0.0  # floor refill per second (Finagle's minRetriesPerSec idea; 0 = none)
    initial_tokens: float = 0.0  # what a fresh bucket holds

    def __post_init__(self) -> None:
        if not 0.0 <= self.budget_fraction <= 1.0 or self.max_tokens < 1 or self.min_per_s < 0:
            raise ValueError("need 0 <= budget_fraction <= 1, max_tokens >= 1, min_per_s >= 0")
        if not 0.0 <= self.initial_tokens <= self.max_tokens:
            raise ValueError("need 0 <= initial_tokens <= max_tokens")

    def fresh(self, now_s: float) -> BudgetState:
        """A new bucket at `now_s`."""
        return BudgetState(self.initial_tokens, now_s)


#: Retries of never-started requests: 20% of load (Envoy retry_budget budget_percent; Linkerd 0.2 ratio).
#: A fresh router may retry 3 at once (Envoy min_retry_concurrency 3), and 1 more per second of quiet.
RETRY_BUDGET = BudgetConfig(budget_fraction=0.2, max_tokens=10.0, min_per_s=1.0, initial_tokens=3.0)
#: Hedges: about 5% extra requests (Tail at Scale: hedging after p95 costs ~5%; the textbook's default).
HEDGE_BUDGET = BudgetConfig(budget_fraction=0.05, max_tokens=5.0, min_per_s=0.0)


@dataclass(frozen=True, slots=True)
class BudgetState:
    """The bucket's level."""

    tokens: float = 0.0  # extra requests currently affordable
    updated_s: float = 0.0  # last time the floor refill was applied


def budget_deposit(state: BudgetState, now_s: float, cfg: BudgetConfig) -> BudgetState:
    """One ordinary request arrived: deposit `budget_fraction` (plus the time-based floor)."""
    refill = cfg.min_per_s * max(0.0, now_s - state.updated_s)
    return BudgetState(min(cfg.max_tokens, state.tokens + cfg.budget_fraction + refill), now_s)


def budget_withdraw(state: BudgetState, now_s: float, cfg: BudgetConfig) -> tuple[bool, BudgetState]:
    """Try to spend one token on an extra request; (allowed, new state)."""
    refill = cfg.min_per_s * max(0.0, now_s - state.updated_s)
    tokens = min(cfg.max_tokens, state.tokens + refill)
    if tokens >= 1.0:
        return True, BudgetState(tokens - 1.0, now_s)
    return False, BudgetState(tokens, now_s)


# ------------------------------------------------------------------------------------------------ hedging


@dataclass(frozen=True, slots=True)
class HedgeConfig:
    """When to send a backup request."""

    percentile: float = 0.95  # hedge after this percentile of recent latency (Tail at Scale: p95)
    min_samples: int = 20  # no hedging until the window holds this many samples
    min_delay_s: float = 0.001  # never hedge sooner than this (tied requests use ~1 ms)

    def __post_init__(self) -> None:
        if not 0.0 < self.percentile < 1.0 or self.min_samples < 1 or self.min_delay_s < 0:
            raise ValueError("need 0 < percentile < 1, min_samples >= 1, min_delay_s >= 0")


def hedge_delay_s(window: LatencyWindow, cfg: HedgeConfig) -> float | None:
    """How long to wait for the primary before hedging; None = do not hedge (too little history)."""
    if len(window.samples_s) < cfg.min_samples:
        return None
    p = window.percentile_s(cfg.percentile)
    return None if p is None else max(cfg.min_delay_s, p)


# ---------------------------------------------------------------------------------------------- retrying

#: Upstream outcomes that prove the request never started on that replica: connection refused, the replica
#: answered 503 not_ready (loading), or 503 with `x-headroom-draining: 1` (it is shutting down).
NEVER_STARTED = frozenset({"connect_error", "not_ready", "draining"})
#: The connection was reset or closed before the response reached the client (a replica killed mid-request,
#: a pooled keep-alive connection the replica had closed). The request may have run on that replica.
LOST_BEFORE_RESPONSE = "connection_lost"
#: Never-started outcomes that also take the replica out of rotation (`Pipeline.finish` marks it unready, and
#: its readiness probe keeps failing): a dead replica (connection refused) or a draining one. Retrying them is
#: not charged to the retry budget: the first attempt did no work on any replica, and only the requests already
#: sent there before it left rotation can be retried this way, so it cannot grow into a retry storm (gRPC's
#: transparent retries of RPCs that never reached the server application are not throttled either). A 503
#: not_ready (loading) stays budgeted: it does not take the replica out of rotation.
OUT_OF_ROTATION = frozenset({"connect_error", "draining"})
#: Routes whose requests may run twice without harm: V2 tensor inference, embeddings, and the LLM routes
#: (generation is retried only while no byte of the answer has reached the client).
_REPLAYABLE_POST = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$|^/v1/(embeddings|completions|"
                              r"chat/completions)$")


def replayable(method: str, path: str) -> bool:
    """Whether a request on this route may be sent again after it may have started on a replica."""
    if method in ("GET", "HEAD", "OPTIONS"):
        return True
    return method == "POST" and _REPLAYABLE_POST.match(path) is not None


def retryable(outcome: str, replayable_request: bool = False) -> bool:
    """Never-started requests are always retried; one whose connection was lost before any byte of the
    answer reached the client is retried when its route is replayable (see `replayable`).

    A 503 "overloaded" is not retried (Google SRE ch. 21: "overloaded; don't retry"), nor are timeouts or
    5xx answers (the replica ran it and said so), nor anything non-idempotent that may have run.
    """
    return outcome in NEVER_STARTED or (replayable_request and outcome == LOST_BEFORE_RESPONSE)


#: Outcomes of a finished attempt that count against the replica for outlier ejection (a 503 shed, not-ready,
#: draining or a client error does not): refused connections, timeouts, lost connections and server errors
#: (`http_5xx` on HTTP, `grpc_<status>` for INTERNAL / UNKNOWN / DATA_LOSS on gRPC).
_FAILED = frozenset({"connect_error", "timeout", "connection_lost"})


def counts_as_failure(outcome: str) -> bool:
    """Whether an attempt's outcome counts against its replica (health, `failures`)."""
    return outcome in _FAILED or outcome.startswith(("http_5", "grpc_"))
