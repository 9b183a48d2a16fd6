"""Per-token latencies of simulated LLM requests (continuous batching): TTFT, TPOT and ITL.

Definitions follow vLLM's metrics (and `headroom.llm.metrics`):

    TTFT  arrival -> end of the iteration that produced the first output token (queue + prefill + one step)
    TPOT  (finish - first token) / (output tokens - 1), one value per request with more than one token
    ITL   gap between two consecutive output tokens of one request, one value per token after the first

A macro-step (`headroom.sim.continuous`) runs k iterations back to back with a fixed running set: its
first iteration lasts `step + prefill of the sequences it admits`, every later one `step`. So the ITLs of a
macro-step are two values with integer weights, and the simulator records (value, weight) pairs instead of
one float per token; `weighted_percentiles` gives exactly what `np.percentile` would on the expanded array.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

PERCENTILES = (50.0, 90.0, 99.0)
Floats = Sequence[float] | npt.NDArray[np.float64]  # seconds, as a list or an array


def weighted_percentiles(values: Floats, weights: Sequence[int] | npt.NDArray[np.int64],
                         qs: Sequence[float] = PERCENTILES) -> list[float]:
    """Percentiles `qs` (0-100) of `values` repeated `weights` times, with numpy's default (linear) method:
    equal to ``np.percentile(np.repeat(values, weights), qs)`` without building the repeated array.
    All nan when the total weight is 0."""
    if len(values) != len(weights):
        raise ValueError(f"values and weights differ in length ({len(values)} vs {len(weights)})")
    w = np.asarray(weights, dtype=np.int64)
    if np.any(w < 0):
        raise ValueError("weights must be >= 0")
    v = np.asarray(values, dtype=np.float64)
    keep = w > 0
    v, w = v[keep], w[keep]
    total = int(w.sum())
    if total == 0:
        return [math.nan] * len(qs)
    order = np.argsort(v, kind="stable")
    v, cum = v[order], np.cumsum(w[order])
    out: list[float] = []
    for q in qs:
        if not 0.0 <= q <= 100.0:
            raise ValueError(f"percentile must be in [0, 100], got {q}")
        pos = q / 100.0 * (total - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        # The element at 0-based index i of the expanded array is v[first j with cum[j] > i].
        v_lo = float(v[int(np.searchsorted(cum, lo, side="right"))])
        v_hi = float(v[int(np.searchsorted(cum, hi, side="right"))])
        out.append(v_lo + (v_hi - v_lo) * (pos - lo))
    return out


def percentiles(values: Floats, qs: Sequence[float] = PERCENTILES) -> list[float]:
    """`np.percentile(values, qs)` as floats; all nan for no values."""
    if len(values) == 0:
        return [math.nan] * len(qs)
    return [float(x) for x in np.percentile(np.asarray(values, dtype=np.float64), list(qs))]


class TokenStats:
    """What the continuous-batching replicas record (mutable; owned by one `Simulator`)."""

    __slots__ = ("itl_s", "itl_weights", "tpot_s", "ttft_s")

    def __init__(self) -> None:
        self.ttft_s: list[float] = []  # one per measured request
        self.tpot_s: list[float] = []  # one per measured request with more than one output token
        self.itl_s: list[float] = []  # inter-token gaps ...
        self.itl_weights: list[int] = []  # ... and how many tokens (after their request's first) had each

    def summary(self) -> dict[str, float]:
        """mean and p50/p90/p99 of TTFT, TPOT and ITL in seconds (nan when nothing was measured)."""
        out: dict[str, float] = {}
        ttft = np.asarray(self.ttft_s, dtype=np.float64)
        tpot = np.asarray(self.tpot_s, dtype=np.float64)
        itl = np.asarray(self.itl_s, dtype=np.float64)
        weights = np.asarray(self.itl_weights, dtype=np.int64)
        total = int(weights.sum())
        for name, pct, mean in (
            ("ttft", percentiles(ttft), float(ttft.mean()) if ttft.size else math.nan),
            ("tpot", percentiles(tpot), float(tpot.mean()) if tpot.size else math.nan),
            ("itl", weighted_percentiles(itl, weights), float(itl @ weights) / total if total else math.nan),
        ):
            out[f"mean_{name}_s"] = mean
            for q, value in zip(PERCENTILES, pct, strict=True):
                out[f"{name}_p{q:g}_s"] = value
        return out

