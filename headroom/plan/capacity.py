"""Replicas for a peak rate under a tail-latency SLO, with headroom and N+k redundancy (napkin math 1.3).

Steps, as in the textbook's ResNet-50 example (5,000 QPS, p99 50 ms, 5 ms service):

1. safe utilisation from equation 6: ``rho_max = 1 - f * S / SLO`` (f = 4.6 for p99) -> 0.54
2. required service rate ``lambda / rho_max`` -> 9,259.3 req/s
3. replicas ``ceil(required / per-replica rate)`` -> 46.3 -> 47
4. headroom ``ceil(47 * (1 + h))`` -> 61.1 -> 62
5. after k failures: utilisation ``lambda / (rate * (62 - k))`` -> 41.0 %, below rho_max, so N+1 holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from headroom.plan.queueing import tail_factor

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """The replica count for a load and an SLO, and how it behaves when replicas fail."""

    peak_rate_per_s: float  # lambda at peak
    slo_s: float  # the tail-latency target
    percentile: float  # the SLO's percentile (0.99 for p99)
    service_time_s: float  # per-request service time of one replica
    per_replica_rate_per_s: float  # mu = 1 / S (or a measured throughput)
    tail_factor: float  # ln(1 / (1 - p)), rounded to 4.6 for p99 unless exact
    max_utilisation: float  # rho_max = 1 - tail_factor * S / SLO
    required_rate_per_s: float  # lambda / rho_max
    base_replicas: int  # ceil(required / mu)
    headroom: float  # extra fraction for spikes (0.3 = 30 %)
    replicas_with_headroom: int  # ceil(base * (1 + headroom))
    redundancy: int  # k of N+k: simultaneous failures to survive
    min_replicas_n_plus_k: int  # base + k: survives k failures at rho_max, no headroom
    headroom_after_k_failures: int  # with_headroom + k: keeps the headroom even after k failures
    recommended_replicas: int  # max(with_headroom, base + k): headroom now and rho_max after k failures
    utilisation_at_peak: float  # lambda / (mu * recommended)
    utilisation_after_k_failures: float  # lambda / (mu * (recommended - k))
    survives_k_failures: bool  # utilisation after k failures <= rho_max


def max_utilisation(slo_s: float, service_time_s: float, percentile: float = 0.99, exact: bool = False) -> float:
    """Equation 6 solved for rho: ``1 - f * S / SLO``; raises if the SLO is unreachable even when idle."""
    if slo_s <= 0 or service_time_s <= 0:
        raise ValueError("slo_s and service_time_s must be > 0")
    f = tail_factor(percentile, exact)
    rho = 1.0 - f * service_time_s / slo_s
    if rho <= 0:
        raise ValueError(
            f"an SLO of {slo_s * 1e3:g} ms is below {f:g} x the {service_time_s * 1e3:g} ms service time: no "
            f"utilisation meets it; relax the SLO to > {f * service_time_s * 1e3:g} ms or cut the service time"
        )
    return rho


def plan_capacity(peak_rate_per_s: float, slo_s: float, service_time_s: float, headroom: float = 0.3,
                  redundancy: int = 1, percentile: float = 0.99, per_replica_rate_per_s: float | None = None,
                  exact: bool = False) -> CapacityPlan:
    """Size a replica pool for `peak_rate_per_s` with a tail SLO, `headroom` and N+`redundancy`."""
    if peak_rate_per_s <= 0:
        raise ValueError(f"peak_rate_per_s must be > 0, got {peak_rate_per_s}")
    if headroom < 0:
        raise ValueError(f"headroom is a fraction >= 0 (0.3 = 30 %), got {headroom}")
    if redundancy < 0:
        raise ValueError(f"redundancy (k of N+k) must be >= 0, got {redundancy}")
    mu = per_replica_rate_per_s if per_replica_rate_per_s is not None else 1.0 / service_time_s
    if mu <= 0:
        raise ValueError(f"per_replica_rate_per_s must be > 0, got {mu}")
    f = tail_factor(percentile, exact)
    rho_max = max_utilisation(slo_s, service_time_s, percentile, exact)
    required = peak_rate_per_s / rho_max
    base = math.ceil(required / mu - _EPS)
    with_headroom = math.ceil(base * (1.0 + headroom) - _EPS)
    recommended = max(with_headroom, base + redundancy)
    survivors = recommended - redundancy
    after = peak_rate_per_s / (mu * survivors) if survivors > 0 else math.inf
    return CapacityPlan(
        peak_rate_per_s=peak_rate_per_s, slo_s=slo_s, percentile=percentile, service_time_s=service_time_s,
        per_replica_rate_per_s=mu, tail_factor=f, max_utilisation=rho_max, required_rate_per_s=required,
        base_replicas=base, headroom=headroom, replicas_with_headroom=with_headroom, redundancy=redundancy,
        min_replicas_n_plus_k=base + redundancy, headroom_after_k_failures=with_headroom + redundancy,
        recommended_replicas=recommended, utilisation_at_peak=peak_rate_per_s / (mu * recommended),
        utilisation_after_k_failures=after, survives_k_failures=after <= rho_max + _EPS,
    )


def utilisation_after_failures(peak_rate_per_s: float, per_replica_rate_per_s: float, replicas: int,
                               failures: int) -> float:
    """``lambda / (mu * (N - k))``: the load each survivor carries after k replicas fail."""
    survivors = replicas - failures
    if survivors <= 0:
        raise ValueError(f"{failures} failures leave no replica out of {replicas}")
    return peak_rate_per_s / (per_replica_rate_per_s * survivors)
