"""HdrHistogram per metric: values in seconds in, percentiles in milliseconds out.

Values are stored as integer microseconds from 1 us to 1 hour with 3 significant digits, so every percentile
is within 0.1% of the true value and memory stays constant however long the run is.
"""

from __future__ import annotations

import base64
import math

from hdrh.histogram import HdrHistogram

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)
_LOWEST_US = 1
_HIGHEST_US = 3600 * 1_000_000
_SIGNIFICANT_DIGITS = 3


def percentile_key(p: float) -> str:
    """`50.0 -> "p50"`, `99.9 -> "p99.9"`."""
    return "p" + (f"{p:g}")


class LatencyHistogram:
    """A latency distribution in HdrHistogram; record seconds, read milliseconds."""

    def __init__(self) -> None:
        self._hist = HdrHistogram(_LOWEST_US, _HIGHEST_US, _SIGNIFICANT_DIGITS)
        self._sum_s = 0.0
        self._sum_sq_s2 = 0.0  # for the standard deviation (hdrh's own iterates every bucket: too slow)

    def record_s(self, value_s: float) -> None:
        """Record one latency in seconds (clamped into 1 us .. 1 h)."""
        value_us = min(max(round(value_s * 1e6), _LOWEST_US), _HIGHEST_US)
        self._hist.record_value(value_us)
        self._sum_s += max(value_s, 0.0)
        self._sum_sq_s2 += max(value_s, 0.0) ** 2

    @property
    def count(self) -> int:
        return int(self._hist.get_total_count())

    def percentile_ms(self, percentile: float) -> float:
        """The value at `percentile` (0..100) in ms; 0.0 when empty."""
        if self.count == 0:
            return 0.0
        return float(self._hist.get_value_at_percentile(percentile)) / 1000.0

    def mean_ms(self) -> float:
        return self._sum_s * 1000.0 / self.count if self.count else 0.0

    def max_ms(self) -> float:
        return float(self._hist.get_max_value()) / 1000.0 if self.count else 0.0

    def min_ms(self) -> float:
        return float(self._hist.get_min_value()) / 1000.0 if self.count else 0.0

    def stddev_ms(self) -> float:
        n = self.count
        if n == 0:
            return 0.0
        mean_s = self._sum_s / n
        return math.sqrt(max(self._sum_sq_s2 / n - mean_s * mean_s, 0.0)) * 1000.0

    def summary(self) -> dict[str, float]:
        """count, mean, min, max, stddev and the standard percentiles (ms)."""
        out: dict[str, float] = {
            "count": float(self.count),
            "mean_ms": self.mean_ms(),
            "min_ms": self.min_ms(),
            "max_ms": self.max_ms(),
            "stddev_ms": self.stddev_ms(),
        }
        for p in PERCENTILES:
            out[percentile_key(p) + "_ms"] = self.percentile_ms(p)
        return out

    def encode(self) -> str:
        """The standard compressed HdrHistogram encoding (base64), for keeping beside the JSON result."""
        if self.count == 0:
            return ""
        raw = self._hist.encode()
        return raw.decode("ascii") if isinstance(raw, bytes) else str(raw)

    @staticmethod
    def is_encoding(text: str) -> bool:
        """Cheap check that `text` looks like an encoded histogram."""
        try:
            base64.b64decode(text, validate=True)
        except ValueError:
            return False
        return bool(text)
