"""MLPerf LoadGen scenarios: how each one sends queries and when a run of it is VALID.

    server         open loop, Poisson (or any arrival) at the target rate; VALID when the p99 bound holds
                   with 99% confidence (MLPerf early stopping: >= 459 queries when none is over the bound)
    offline        every query at t = 0; the metric is throughput
    single-stream  one query at a time, back to back (closed loop); the metric is p90 latency
    multi-stream   one query of 8 samples at a time (closed loop); the metric is p99 query latency

The verdict is a pure function of the counts, so the sweep and the simulator can reuse it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SCENARIOS: tuple[str, ...] = ("server", "offline", "single-stream", "multi-stream")
TAIL_PERCENTILE = 99.0  # the Server scenario's bound applies to p99
CONFIDENCE = 0.99  # MLPerf early stopping confidence
MULTISTREAM_SAMPLES = 8  # MLPerf MultiStream samples per query


@dataclass(frozen=True, slots=True)
class ScenarioPlan:
    """How a scenario drives the dispatcher."""

    name: str  # one of SCENARIOS
    mode: str  # "open" or "closed"
    concurrency: int  # closed-loop workers
    samples_per_query: int  # samples per query
    all_at_once: bool  # offline: every query intended at t = 0
    metric: str  # the headline metric: "p99_ms", "p90_ms" or "throughput"
    percentile: float  # the percentile the latency claim is about (0 for offline: no latency claim)
    needs_bound: bool  # VALID requires a latency bound (server); others only need enough queries


def plan_scenario(name: str, concurrency: int = 1) -> ScenarioPlan:
    """The dispatch plan for scenario `name`; `concurrency` only matters for a plain closed-loop run."""
    if name == "server":
        return ScenarioPlan(name, "open", 1, 1, False, "p99_ms", 99.0, True)
    if name == "offline":
        return ScenarioPlan(name, "open", 1, 1, True, "throughput", 0.0, False)
    if name == "single-stream":
        return ScenarioPlan(name, "closed", 1, 1, False, "p90_ms", 90.0, False)
    if name == "multi-stream":
        return ScenarioPlan(name, "closed", 1, MULTISTREAM_SAMPLES, False, "p99_ms", 99.0, False)
    raise ValueError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}")


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (fine for the n of a benchmark run)."""
    if n < 0 or k < 0:
        return 0.0 if k < 0 else 1.0
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(min(k, n) + 1):
        log_term = math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
        total += math.exp(log_term)
    return min(total, 1.0)


def min_queries_for_tail(over_bound: int, percentile: float = TAIL_PERCENTILE, confidence: float = CONFIDENCE) -> int:
    """Fewest queries for which `over_bound` slow queries still prove the percentile bound (459 for 0 at p99)."""
    tail = 1.0 - percentile / 100.0
    n = over_bound + 1
    while binomial_cdf(over_bound, n, tail) > 1.0 - confidence:
        n += max(1, n // 64)
    while n > over_bound + 1 and binomial_cdf(over_bound, n - 1, tail) <= 1.0 - confidence:
        n -= 1
    return n


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a run supports its latency claim, and why not."""

    valid: bool  # the run is VALID in MLPerf's sense
    reasons: tuple[str, ...]  # human-readable reasons it is not (empty when valid)
    queries: int  # queries counted
    over_bound: int  # queries that failed or exceeded the bound
    min_queries: int  # queries needed for the claim given `over_bound`


def judge_tail(
    queries: int,
    over_bound: int,
    bound_ms: float,
    late_sends: int = 0,
    percentile: float = TAIL_PERCENTILE,
    confidence: float = CONFIDENCE,
    max_late_fraction: float = 0.01,
    require_bound: bool = True,
) -> Verdict:
    """VALID when, with `confidence`, at most (100 - percentile)% of queries exceed `bound_ms`.

    Without a bound (`bound_ms` <= 0, allowed when not `require_bound`) only failures count as over it, so
    the rule says whether there were enough queries to estimate the percentile. Failed queries count as
    over the bound. `confidence` <= 0 drops the early-stopping rule (a plain check
    of the observed fraction, for short smoke runs). A run whose generator sent more than `max_late_fraction` of its
    queries late is not VALID either: the offered load was not the one claimed.
    """
    reasons: list[str] = []
    tail = 1.0 - percentile / 100.0
    needed = min_queries_for_tail(over_bound, percentile, confidence) if confidence > 0 else 1
    if bound_ms <= 0 and require_bound:
        reasons.append("no latency bound given (pass --slo-p99-ms)")
    elif queries == 0:
        reasons.append("no query finished")
    elif over_bound / queries > tail:
        reasons.append(
            f"{over_bound} of {queries} queries ({100.0 * over_bound / queries:.2f}%) failed or took over "
            f"{bound_ms:g} ms; p{percentile:g} allows {100.0 * tail:.2g}%"
        )
    elif queries < needed:
        reasons.append(
            f"{queries} queries with {over_bound} over {bound_ms:g} ms cannot prove p{percentile:g} with "
            f"{100 * confidence:g}% confidence: need >= {needed} (run longer or at a higher rate)"
        )
    if queries and late_sends / queries > max_late_fraction:
        reasons.append(
            f"the generator sent {late_sends} of {queries} queries late; give it more CPU (--cpus) or lower the rate"
        )
    return Verdict(
        valid=not reasons, reasons=tuple(reasons), queries=queries, over_bound=over_bound, min_queries=needed
    )


def judge_offline(queries: int, failed: int) -> Verdict:
    """Offline makes no latency claim: VALID when every query succeeded."""
    reasons = () if queries and not failed else (f"{failed} of {queries} queries failed",)
    return Verdict(valid=not reasons, reasons=reasons, queries=queries, over_bound=failed, min_queries=1)
