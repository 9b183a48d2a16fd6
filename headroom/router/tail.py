"""Tail tolerance as pure policies: hedging, retry budget, adaptive concurrency limit, coordinated shedding.

* Hedging (Dean & Barroso, "The Tail at Scale"): send a backup copy to another replica once a request has
  waited longer than the `hedge_percentile` (p95) of recent latencies; the first answer wins and the loser is
  cancelled. A token bucket keeps hedges <= `budget_fraction` (5%) of requests: every request deposits
  `budget_fraction` of a token, every hedge spends one.
* Retry budget (Finagle `RetryBudget` / Envoy `retry_budget`, 20%): requests that never started on a
  replica (connection refused, replica not ready or draining) are retried, and so are idempotent ones whose
  connection was reset before any answer reached the client; each retry spends a token, every request
  deposits `budget_fraction` (0.2) tokens, and a small floor of `min_retries_per_s` refills with time so a
  quiet router can still retry. Overload never turns into a retry storm: retries <= 20% of load + the floor.
* Adaptive concurrency limit, Vegas style (Netflix concurrency-limits `VegasLimit`): queue estimate
  `limit x (1 - minRTT/RTT)`; grow by beta-ish steps while the queue is short, shrink when it is long.
* Coordinated shedding (textbook, "coordinated load shedding"): the router sees the aggregate load of every
  replica against their summed capacity and rejects the same uniform fraction of new requests everywhere,
  ramping linearly from `start_utilisation` to 100% (random early detection), with a Retry-After.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from headroom.router.snapshot import ReplicaSnapshot

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


# ----------------------------------------------------------------------------------- adaptive concurrency


@dataclass(frozen=True, slots=True)
class VegasConfig:
    """Netflix concurrency-limits VegasLimit defaults unless noted."""

    initial_limit: int = 20  # Netflix: initial limit 20
    min_limit: int = 1  # lowest limit (Netflix uses 1 as the floor)
    max_limit: int = 1000  # Netflix: max limit 1000
    probe_multiplier: int = 30  # re-measure minRTT about every probe_multiplier x limit samples (Netflix: 30)
    probe_concurrency: int = 3  # concurrency pinned while re-measuring minRTT (Envoy gradient controller: 3)

    def __post_init__(self) -> None:
        if not 1 <= self.min_limit <= self.initial_limit <= self.max_limit:
            raise ValueError("need 1 <= min_limit <= initial_limit <= max_limit")
        if self.probe_multiplier < 1 or self.probe_concurrency < 1:
            raise ValueError("probe_multiplier and probe_concurrency must be >= 1")


@dataclass(frozen=True, slots=True)
class VegasState:
    """The limiter's estimate."""

    limit: float = 20.0  # learned concurrency limit (restored after a probe)
    min_rtt_s: float = 0.0  # no-load RTT measured by the last probe (0 = unknown)
    samples_since_probe: int = 0  # samples since the last probe
    probing: bool = True  # re-measuring minRTT: admit only `probe_concurrency` until a sample arrives

    def effective_limit(self, cfg: VegasConfig) -> int:
        """What the admission check should enforce right now."""
        return cfg.probe_concurrency if self.probing else max(1, int(self.limit))


def vegas_initial(cfg: VegasConfig) -> VegasState:
    """Start by probing minRTT at pinned low concurrency, then grow from `initial_limit`."""
    return VegasState(limit=float(cfg.initial_limit))


def vegas_update(state: VegasState, rtt_s: float, inflight: int, dropped: bool,
                 cfg: VegasConfig) -> VegasState:
    """Fold one finished request (its RTT, the in-flight count when it started, whether it was dropped).

    While probing, the first sample taken at <= `probe_concurrency` in flight becomes the new minRTT (as
    Envoy's gradient controller re-measures minRTT at pinned concurrency); samples at higher concurrency
    (requests admitted before the probe began) are ignored.
    """
    if rtt_s <= 0:
        raise ValueError(f"rtt_s must be > 0, got {rtt_s}")
    if state.probing:
        if inflight <= cfg.probe_concurrency:
            return VegasState(state.limit, rtt_s, 0, False)
        return state
    samples = state.samples_since_probe + 1
    if samples >= cfg.probe_multiplier * max(state.limit, 1.0):
        return VegasState(state.limit, state.min_rtt_s, 0, True)
    min_rtt = min(state.min_rtt_s, rtt_s)
    limit = state.limit
    log_limit = max(math.log10(max(limit, 1.0)), 1.0)
    alpha, beta, threshold = 3 * log_limit, 6 * log_limit, log_limit
    if dropped:
        new = limit - log_limit
    elif inflight * 2 < limit:
        new = limit  # app-limited: not enough traffic to learn anything
    else:
        queue = limit * (1.0 - min_rtt / rtt_s)
        if queue <= threshold:
            new = limit + beta
        elif queue < alpha:
            new = limit + log_limit
        elif queue > beta:
            new = limit - log_limit
        else:
            new = limit
    return VegasState(min(float(cfg.max_limit), max(float(cfg.min_limit), new)), min_rtt, samples, False)


# ------------------------------------------------------------------------------------------------ shedding


@dataclass(frozen=True, slots=True)
class ShedConfig:
    """Coordinated shedding knobs."""

    start_utilisation: float = 0.8  # start rejecting above this aggregate load/capacity (RED-style ramp)
    full_utilisation: float = 1.0  # reject everything new at or above this
    min_retry_after_s: float = 1.0  # Retry-After floor (HTTP Retry-After is whole seconds)

    def __post_init__(self) -> None:
        if not 0.0 <= self.start_utilisation < self.full_utilisation:
            raise ValueError("need 0 <= start_utilisation < full_utilisation")


@dataclass(frozen=True, slots=True)
class ShedDecision:
    """Whether to reject this request."""

    reject: bool  # answer 503 overloaded now, without touching a replica
    fraction: float  # the uniform rejection probability in force
    utilisation: float  # aggregate load / aggregate capacity of routable replicas
    retry_after_s: float  # what to put in Retry-After when rejecting


def shed(snapshots: Sequence[ReplicaSnapshot], now_s: float, rng: random.Random, cfg: ShedConfig,
         undispatched: int = 0) -> ShedDecision:
    """Decide for one arriving request from the aggregate load of ready, non-ejected replicas.

    `undispatched` counts requests the router has admitted but not yet sent to a replica; they are load too.
    """
    live = [s for s in snapshots if s.ready and not s.ejected(now_s)]
    capacity = sum(s.capacity for s in live)
    if capacity == 0:
        return ShedDecision(False, 0.0, 0.0, cfg.min_retry_after_s)  # routing answers not_ready instead
    load = sum(s.load() for s in live) + max(0, undispatched)
    util = load / capacity
    span = cfg.full_utilisation - cfg.start_utilisation
    fraction = min(1.0, max(0.0, (util - cfg.start_utilisation) / span))
    latencies = [s.ewma_latency_s for s in live if s.ewma_latency_s > 0]
    mean_latency_s = sum(latencies) / len(latencies) if latencies else 0.0
    retry_after = max(cfg.min_retry_after_s, math.ceil(mean_latency_s * util))
    reject = fraction >= 1.0 or (fraction > 0.0 and rng.random() < fraction)
    return ShedDecision(reject, fraction, util, float(retry_after))
