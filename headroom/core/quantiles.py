"""Percentiles from Prometheus histogram buckets, over a window (pure functions).

A Prometheus histogram is a set of cumulative counters, one per upper bound `le` (the last is +Inf). Two
readings a window apart give the window's histogram by subtraction; its quantile is estimated like PromQL's
`histogram_quantile`: find the bucket holding the rank and interpolate linearly inside it, the first bucket
starting at 0; a rank in the +Inf bucket returns the largest finite bound (the estimate cannot say more).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

Buckets = Sequence[tuple[float, float]]  # (upper bound `le`, cumulative count), sorted by bound, +Inf last


def bucket_deltas(before: Mapping[float, float], after: Mapping[float, float]) -> list[tuple[float, float]]:
    """The window's cumulative buckets: `after - before` per bound (a bound missing before counts as 0).

    A counter that went down (the process restarted) makes the window's histogram `after` itself, as
    PromQL's `increase` does after a reset. Sorted by bound."""
    bounds = sorted(after)
    deltas = [(le, after[le] - before.get(le, 0.0)) for le in bounds]
    if any(d < 0 for _, d in deltas):
        return [(le, after[le]) for le in bounds]
    return deltas


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """The `q`-quantile (0..1) of cumulative `buckets`; None when they hold no observation.

    Raises ValueError for q outside [0, 1] or buckets that do not end with +Inf (a Prometheus histogram
    always does: pass every bucket)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1] (0.99 for p99), got {q}")
    if not buckets or not math.isinf(buckets[-1][0]):
        raise ValueError("buckets must end with the +Inf bucket (le=\"+Inf\")")
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_count = 0.0
    lower = 0.0
    for i, (upper, count) in enumerate(buckets):
        if count >= rank and count > prev_count:
            if math.isinf(upper):
                # Above the last finite bound: that bound is the best estimate (PromQL does the same).
                return buckets[i - 1][0] if i > 0 else None
            if i == 0 and upper <= 0:
                return upper
            return lower + (upper - lower) * (rank - prev_count) / (count - prev_count)
        prev_count = count
        lower = upper
    return None  # unreachable for cumulative buckets (the +Inf count is the total)


def window_quantiles(before: Mapping[float, float], after: Mapping[float, float],
                     qs: Sequence[float]) -> list[float | None]:
    """Quantiles `qs` of the observations that landed between two readings of one histogram."""
    deltas = bucket_deltas(before, after)
    if not deltas or not math.isinf(deltas[-1][0]):
        return [None] * len(qs)
    return [histogram_quantile(q, deltas) for q in qs]
