"""Batching math (textbook equations 4 and 8-15): formation delay, batch-size distribution, B_max under an
SLO, the conservative tail envelope and the adaptive-window heuristic.

Service time of a batch of size B comes from any callable ``service_time_s(B)``; `LinearServiceTime` is the
textbook's ``T_svc(B) = fixed + per_item * B`` (ResNet-50 on a V100: 5 ms + 0.6 ms per image).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

ServiceTimeFn = Callable[[int], float]


@dataclass(frozen=True, slots=True)
class LinearServiceTime:
    """``T_svc(B) = fixed_s + per_item_s * B`` (textbook: 5 ms + 0.6 ms * B)."""

    fixed_s: float  # cost of a batch regardless of its size (launches, weight reads)
    per_item_s: float  # extra cost per item in the batch

    def __post_init__(self) -> None:
        if self.fixed_s < 0 or self.per_item_s < 0:
            raise ValueError("fixed_s and per_item_s must be >= 0")
        if self.fixed_s + self.per_item_s <= 0:
            raise ValueError("a batch must take some time: set fixed_s or per_item_s above 0")

    def __call__(self, batch_size: int) -> float:
        return self.fixed_s + self.per_item_s * batch_size


def _check_positive(name: str, value: float) -> None:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def formation_delay_s(batch_size: int, arrival_rate_per_s: float) -> float:
    """Equation 4's first term: mean wait for a size-triggered batch of B to fill, ``(B - 1) / (2 lambda)``."""
    _check_positive("arrival_rate_per_s", arrival_rate_per_s)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return (batch_size - 1) / (2.0 * arrival_rate_per_s)


def size_triggered_latency_s(batch_size: int, arrival_rate_per_s: float, inference_s: float) -> float:
    """Equation 4: ``(B - 1) / (2 lambda) + T_inf(B)``."""
    return formation_delay_s(batch_size, arrival_rate_per_s) + inference_s


def window_mean_wait_s(window_s: float) -> float:
    """Equation 8: with a fixed window, the mean wait is half the window."""
    if window_s < 0:
        raise ValueError(f"window_s must be >= 0, got {window_s}")
    return window_s / 2.0


def poisson_pmf(k: int, mean: float) -> float:
    """Equation 9: ``P(batch = k) = m^k e^{-m} / k!`` with ``m = lambda * T_window``."""
    if k < 0:
        return 0.0
    if mean <= 0:
        return 1.0 if k == 0 else 0.0
    return math.exp(k * math.log(mean) - mean - math.lgamma(k + 1))


def poisson_cdf(k: int, mean: float) -> float:
    """``P(batch <= k)``."""
    return min(1.0, sum(poisson_pmf(i, mean) for i in range(k + 1)))


def poisson_quantile(p: float, mean: float) -> int:
    """Smallest k with ``P(batch <= k) >= p``."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    k, cdf = 0, poisson_pmf(0, mean)
    while cdf < p:
        k += 1
        cdf += poisson_pmf(k, mean)
    return k


@dataclass(frozen=True, slots=True)
class BatchSizeStats:
    """How the batch a fixed window collects varies (one row of textbook table 10)."""

    arrival_rate_per_s: float  # lambda
    window_s: float  # T_window
    mean: float  # lambda * T_window (equation 14)
    std: float  # sqrt(mean): a Poisson count's variance equals its mean
    prob_empty: float  # P(batch = 0): windows that launch nothing
    prob_at_least_double: float  # P(batch >= 2 * mean)


def batch_size_stats(arrival_rate_per_s: float, window_s: float) -> BatchSizeStats:
    """Mean, spread, empty-window and double-size probabilities of a Poisson window count."""
    _check_positive("arrival_rate_per_s", arrival_rate_per_s)
    _check_positive("window_s", window_s)
    m = arrival_rate_per_s * window_s
    threshold = math.ceil(2.0 * m - 1e-12)
    return BatchSizeStats(arrival_rate_per_s=arrival_rate_per_s, window_s=window_s, mean=m, std=math.sqrt(m),
                          prob_empty=poisson_pmf(0, m),
                          prob_at_least_double=1.0 - poisson_cdf(threshold - 1, m))


def effective_capacity_per_s(batch_size: int, service_time_s: ServiceTimeFn) -> float:
    """Equation 10: saturated capacity ``mu_eff(B) = B / T_svc(B)``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return batch_size / service_time_s(batch_size)


def served_throughput_per_s(arrival_rate_per_s: float, batch_size: int, service_time_s: ServiceTimeFn) -> float:
    """Equation 10: ``min(lambda, mu_eff(B))``."""
    return min(arrival_rate_per_s, effective_capacity_per_s(batch_size, service_time_s))


def max_batch_under_slo(slo_s: float, window_s: float, service_time_s: ServiceTimeFn,
                        limit: int = 4096) -> int:
    """Equation 12: the largest B with ``T_window / 2 + T_svc(B) <= SLO`` (0 if even B = 1 misses it)."""
    _check_positive("slo_s", slo_s)
    best = 0
    for b in range(1, limit + 1):
        if window_mean_wait_s(window_s) + service_time_s(b) <= slo_s + 1e-12:
            best = b
        else:
            break
    return best


@dataclass(frozen=True, slots=True)
class Envelope:
    """Equation 13: the conservative latency envelope of a fixed window (not a request p99)."""

    arrival_rate_per_s: float  # lambda
    window_s: float  # T_window
    mean_batch_seen: float  # E[B_req] = 1 + lambda * T_window: the batch a request shares
    p99_batch_seen: int  # 1 + the p99 of Poisson(lambda * T_window), capped at max_batch_size
    mean_latency_s: float  # T_window / 2 + T_svc(E[B_req])
    envelope_s: float  # T_window + T_svc(B_req,p99)
    saturated_capacity_per_s: float  # efficiency * B_max / T_svc(B_max)
    served_per_s: float  # min(lambda, saturated capacity)


def envelope(arrival_rate_per_s: float, window_s: float, service_time_s: ServiceTimeFn,
             max_batch_size: int = 1_000_000, percentile: float = 0.99, efficiency: float = 1.0) -> Envelope:
    """A request's batch is itself plus the Poisson arrivals of its window; combine the full window with the
    p99 batch it sees. `efficiency` discounts the saturated capacity of `max_batch_size` (table 14: 0.89)."""
    _check_positive("arrival_rate_per_s", arrival_rate_per_s)
    _check_positive("window_s", window_s)
    m = arrival_rate_per_s * window_s
    mean_seen = 1.0 + m
    p99_seen = min(max_batch_size, 1 + poisson_quantile(percentile, m))
    cap = efficiency * effective_capacity_per_s(max_batch_size, service_time_s) \
        if max_batch_size < 1_000_000 else math.inf
    return Envelope(arrival_rate_per_s=arrival_rate_per_s, window_s=window_s, mean_batch_seen=mean_seen,
                    p99_batch_seen=p99_seen,
                    mean_latency_s=window_s / 2.0 + service_time_s(round(mean_seen)),
                    envelope_s=window_s + service_time_s(p99_seen), saturated_capacity_per_s=cap,
                    served_per_s=min(arrival_rate_per_s, cap))


@dataclass(frozen=True, slots=True)
class AdaptiveWindow:
    """Equation 15 at one arrival rate (one row of textbook table 15)."""

    arrival_rate_per_s: float  # lambda
    window_s: float  # min(SLO - T_svc, sqrt(T_svc / lambda))
    mean_batch: float  # lambda * window (equation 14)
    latency_budget_s: float  # T_svc + window: an estimated budget, not a measured p99


def adaptive_window(arrival_rate_per_s: float, slo_s: float, service_s: float) -> AdaptiveWindow:
    """Equation 15: ``T_window = min(SLO - T_svc, sqrt(T_svc / lambda))``; faster traffic, shorter window,
    larger batches."""
    _check_positive("arrival_rate_per_s", arrival_rate_per_s)
    _check_positive("service_s", service_s)
    window = max(0.0, min(slo_s - service_s, math.sqrt(service_s / arrival_rate_per_s)))
    return AdaptiveWindow(arrival_rate_per_s=arrival_rate_per_s, window_s=window,
                          mean_batch=arrival_rate_per_s * window, latency_budget_s=service_s + window)


def batch_efficiency(batch_size: int, fixed_s: float, per_item_s: float) -> float:
    """Example 1.7: the share of a batch's time spent on per-item work, ``per_item * B / T_svc(B)``."""
    total = fixed_s + per_item_s * batch_size
    _check_positive("batch service time", total)
    return per_item_s * batch_size / total
