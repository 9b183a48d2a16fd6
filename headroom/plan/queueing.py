"""Queueing formulas: Little's law, M/M/1, M/D/1, M/G/1 (Pollaczek-Khinchine) and M/M/c (Erlang C).

Notation (the textbook's): arrival rate ``lambda`` in requests/s, mean service time ``S`` in seconds,
``mu = 1 / S``, utilisation ``rho = lambda * S / c`` for ``c`` servers. ``Wq`` is the mean wait in the queue
and ``W = Wq + S`` the mean time in the system. Every function raises ValueError on an unstable queue
(rho >= 1) with a hint on how to fix it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal, localcontext

#: Utilisations of the textbook's "utilisation knee" table (table 7).
KNEE_UTILISATIONS: tuple[float, ...] = (0.5, 0.7, 0.8, 0.9, 0.95)


def _check_rate(name: str, value: float) -> None:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def _check_percentile(p: float) -> None:
    if not 0 < p < 1:
        raise ValueError(f"percentile must be a fraction in (0, 1), e.g. 0.99 for p99; got {p!r}")


def tail_factor(percentile: float = 0.99, exact: bool = False) -> float:
    """``ln(1 / (1 - p))``: the M/M/1 response-time quantile in units of the mean (equation 6).

    The textbook rounds it to one decimal (4.6 for p99); pass ``exact=True`` for ln(100) = 4.605...
    """
    _check_percentile(percentile)
    factor = math.log(1.0 / (1.0 - percentile))
    return factor if exact else round(factor, 1)


def littles_law_in_system(arrival_rate_per_s: float, time_in_system_s: float) -> float:
    """Equation 3: mean number of requests in the system, ``Q = lambda * T``."""
    return arrival_rate_per_s * time_in_system_s


def littles_law_rate_per_s(in_system: float, time_in_system_s: float) -> float:
    """Equation 3 solved for the rate: ``lambda = Q / T``."""
    _check_rate("time_in_system_s", time_in_system_s)
    return in_system / time_in_system_s


def littles_law_time_s(in_system: float, arrival_rate_per_s: float) -> float:
    """Equation 3 solved for the time: ``T = Q / lambda``."""
    _check_rate("arrival_rate_per_s", arrival_rate_per_s)
    return in_system / arrival_rate_per_s


@dataclass(frozen=True, slots=True)
class QueueResult:
    """Mean behaviour of one queueing model at one load."""

    model: str  # Kendall notation: "M/M/1", "M/D/1", "M/G/1", "M/M/c"
    arrival_rate_per_s: float  # lambda
    service_time_s: float  # mean service time S of one server
    servers: int  # c
    utilisation: float  # rho = lambda * S / c
    prob_wait: float  # probability an arrival has to queue (rho for one server, Erlang C for c)
    mean_wait_s: float  # Wq, mean time in the queue
    mean_time_in_system_s: float  # W = Wq + S
    mean_in_queue: float  # Lq = lambda * Wq (Little)
    mean_in_system: float  # L = lambda * W (Little)


def _utilisation(arrival_rate_per_s: float, service_time_s: float, servers: int) -> float:
    _check_rate("arrival_rate_per_s", arrival_rate_per_s)
    _check_rate("service_time_s", service_time_s)
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    rho = arrival_rate_per_s * service_time_s / servers
    if rho >= 1.0:
        need = math.floor(arrival_rate_per_s * service_time_s) + 1
        raise ValueError(
            f"unstable queue: utilisation {rho:.3f} >= 1 (arrivals {arrival_rate_per_s:g}/s exceed capacity "
            f"{servers / service_time_s:g}/s); lower the rate, shorten the service time or use >= {need} servers"
        )
    return rho


def _result(model: str, lam: float, s: float, c: int, rho: float, pw: float, wq: float) -> QueueResult:
    w = wq + s
    return QueueResult(model=model, arrival_rate_per_s=lam, service_time_s=s, servers=c, utilisation=rho,
                       prob_wait=pw, mean_wait_s=wq, mean_time_in_system_s=w, mean_in_queue=lam * wq,
                       mean_in_system=lam * w)


def mg1(arrival_rate_per_s: float, service_time_s: float, service_cv: float) -> QueueResult:
    """M/G/1, Pollaczek-Khinchine: ``Wq = rho * S * (1 + cv^2) / (2 (1 - rho))``.

    `service_cv` is the coefficient of variation of the service time (std / mean): 1 is M/M/1, 0 is M/D/1.
    """
    if not math.isfinite(service_cv) or service_cv < 0:
        raise ValueError(f"service_cv must be >= 0 (0: deterministic, 1: exponential), got {service_cv!r}")
    rho = _utilisation(arrival_rate_per_s, service_time_s, 1)
    wq = rho * service_time_s * (1.0 + service_cv**2) / (2.0 * (1.0 - rho))
    return _result("M/G/1", arrival_rate_per_s, service_time_s, 1, rho, rho, wq)


def mm1(arrival_rate_per_s: float, service_time_s: float) -> QueueResult:
    """M/M/1 (equation 5): ``W = S / (1 - rho)``, ``Wq = rho * S / (1 - rho)``."""
    r = mg1(arrival_rate_per_s, service_time_s, 1.0)
    return _result("M/M/1", r.arrival_rate_per_s, r.service_time_s, 1, r.utilisation, r.prob_wait,
                   r.mean_wait_s)


def md1(arrival_rate_per_s: float, service_time_s: float) -> QueueResult:
    """M/D/1: ``Wq = rho * S / (2 (1 - rho))``, half the M/M/1 wait."""
    r = mg1(arrival_rate_per_s, service_time_s, 0.0)
    return _result("M/D/1", r.arrival_rate_per_s, r.service_time_s, 1, r.utilisation, r.prob_wait,
                   r.mean_wait_s)


def erlang_c(servers: int, offered_load: float) -> float:
    """Probability an arrival waits in M/M/c with offered load ``a = lambda * S`` (Erlang C).

    Computed through the numerically stable Erlang B recursion ``B(k) = a B(k-1) / (k + a B(k-1))``.
    """
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    if offered_load <= 0:
        return 0.0
    rho = offered_load / servers
    if rho >= 1.0:
        raise ValueError(f"unstable: offered load {offered_load:g} Erlangs needs more than {servers} servers")
    b = 1.0
    for k in range(1, servers + 1):
        b = offered_load * b / (k + offered_load * b)
    return b / (1.0 - rho * (1.0 - b))


def mmc(arrival_rate_per_s: float, service_time_s: float, servers: int) -> QueueResult:
    """M/M/c: ``Wq = C(c, a) / (c * mu - lambda)`` with Erlang C probability of waiting ``C(c, a)``."""
    rho = _utilisation(arrival_rate_per_s, service_time_s, servers)
    pw = erlang_c(servers, arrival_rate_per_s * service_time_s)
    wq = pw / (servers / service_time_s - arrival_rate_per_s)
    return _result("M/M/c", arrival_rate_per_s, service_time_s, servers, rho, pw, wq)


def mm1_response_percentile_s(arrival_rate_per_s: float, service_time_s: float, percentile: float) -> float:
    """Exact M/M/1 response-time quantile: ``T ~ Exp(mu - lambda)``, so ``t_p = ln(1/(1-p)) * W``."""
    _check_percentile(percentile)
    r = mm1(arrival_rate_per_s, service_time_s)
    return math.log(1.0 / (1.0 - percentile)) * r.mean_time_in_system_s


def mmc_wait_percentile_s(arrival_rate_per_s: float, service_time_s: float, servers: int,
                          percentile: float) -> float:
    """M/M/c waiting-time quantile: ``P(Wq > t) = C e^{-(c mu - lambda) t}`` (M/M/1 when c = 1)."""
    _check_percentile(percentile)
    r = mmc(arrival_rate_per_s, service_time_s, servers)
    tail = 1.0 - percentile
    if r.prob_wait <= tail:
        return 0.0
    return math.log(r.prob_wait / tail) / (servers / service_time_s - arrival_rate_per_s)


def md1_wait_cdf(arrival_rate_per_s: float, service_time_s: float, wait_s: float) -> float:
    """M/D/1 waiting-time CDF (Erlang's formula), summed in 80-digit decimals to survive the alternating
    series: ``P(Wq <= t) = (1 - rho) sum_{k=0}^{floor(t/D)} (lambda (kD - t))^k / k! e^{-lambda (kD - t)}``."""
    rho = _utilisation(arrival_rate_per_s, service_time_s, 1)
    if wait_s < 0:
        return 0.0
    with localcontext() as ctx:
        ctx.prec = 80
        lam, d, t = Decimal(arrival_rate_per_s), Decimal(service_time_s), Decimal(wait_s)
        total = Decimal(0)
        fact = Decimal(1)
        for k in range(int(wait_s // service_time_s) + 1):
            if k > 0:
                fact *= k
            x = lam * (k * d - t)
            power = Decimal(1) if k == 0 else x**k
            total += power / fact * (-x).exp()
        value = float(Decimal(1 - rho) * total)
    return min(1.0, max(0.0, value))


def md1_wait_percentile_s(arrival_rate_per_s: float, service_time_s: float, percentile: float) -> float:
    """M/D/1 waiting-time quantile by bisection on `md1_wait_cdf` (to 1e-6 of the service time)."""
    _check_percentile(percentile)
    rho = _utilisation(arrival_rate_per_s, service_time_s, 1)
    if 1.0 - rho >= percentile:
        return 0.0
    lo, hi = 0.0, service_time_s
    while md1_wait_cdf(arrival_rate_per_s, service_time_s, hi) < percentile:
        hi *= 2.0
    while hi - lo > 1e-6 * service_time_s:
        mid = 0.5 * (lo + hi)
        if md1_wait_cdf(arrival_rate_per_s, service_time_s, mid) < percentile:
            lo = mid
        else:
            hi = mid
    return hi


@dataclass(frozen=True, slots=True)
class KneeRow:
    """One row of the utilisation-knee table (textbook table 7 and equation 6)."""

    utilisation: float  # rho
    latency_multiple: float  # W / S = 1 / (1 - rho) for M/M/1
    mean_latency_s: float  # W for the given service time
    p99_latency_s: float  # tail_factor * S / (1 - rho) (equation 6)


def knee_table(service_time_s: float, utilisations: tuple[float, ...] = KNEE_UTILISATIONS,
               percentile: float = 0.99, exact: bool = False) -> list[KneeRow]:
    """Mean and tail M/M/1 latency at each utilisation: how latency explodes near saturation."""
    _check_rate("service_time_s", service_time_s)
    factor = tail_factor(percentile, exact)
    rows = []
    for rho in utilisations:
        if not 0 <= rho < 1:
            raise ValueError(f"utilisations must lie in [0, 1), got {rho!r}")
        multiple = 1.0 / (1.0 - rho)
        rows.append(KneeRow(utilisation=rho, latency_multiple=multiple,
                            mean_latency_s=multiple * service_time_s,
                            p99_latency_s=factor * multiple * service_time_s))
    return rows
