"""Windows over a Prometheus registry: readings of every sample, and the deltas between two of them.

    read_registry(registry, t)  ->  Reading (every sample now)
    Readings.take()             ->  (the reading about one window ago, now), keeping just enough old readings
    SeriesWindow(before, after, label).rate / increase / quantiles / gauge  ->  one label value's numbers

Rates are counter deltas over the window (a counter that went down restarted from 0); percentiles come from
histogram bucket deltas (`headroom.core.quantiles`). Used by the server's live dashboard (`headroom.dashboard`)
and the router's fleet view (`headroom.router.fleet_view`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from headroom.core.clock import Clock
from headroom.core.quantiles import window_quantiles

Labels = tuple[tuple[str, str], ...]  # sorted (label, value) pairs of one sample
NO_LABELS: Mapping[Labels, float] = {}


@dataclass(frozen=True, slots=True)
class Reading:
    """Every sample of a registry at one instant."""

    time_s: float  # clock time of the reading (monotonic seconds)
    values: Mapping[str, Mapping[Labels, float]]  # sample name -> its label sets -> value


def read_registry(registry: CollectorRegistry, time_s: float) -> Reading:
    """A `Reading` of every sample in `registry` (`_created` timestamps left out)."""
    values: dict[str, dict[Labels, float]] = {}
    for family in registry.collect():
        for s in family.samples:
            if not s.name.endswith("_created"):
                values.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = float(s.value)
    return Reading(time_s, values)


def sum_by(r: Reading, name: str, label: str, keep: Callable[[dict[str, str]], bool] | None = None
            ) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, v in r.values.get(name, NO_LABELS).items():
        d = dict(labels)
        if label in d and (keep is None or keep(d)):
            out[d[label]] = out.get(d[label], 0.0) + v
    return out


def _buckets_by(r: Reading, histogram: str, label: str) -> dict[str, dict[float, float]]:
    out: dict[str, dict[float, float]] = {}
    for labels, v in r.values.get(histogram + "_bucket", NO_LABELS).items():
        d = dict(labels)
        if label in d and "le" in d:
            by_le = out.setdefault(d[label], {})
            le = float(d["le"])
            by_le[le] = by_le.get(le, 0.0) + v
    return out


def _increase(before: float, after: float) -> float:
    return after - before if after >= before else after  # a reset: the counter restarted from 0


class SeriesWindow:
    """Deltas of one label's series between two readings."""

    def __init__(self, before: Reading, after: Reading, label: str) -> None:
        self.before, self.after, self.label = before, after, label
        self.dt_s = after.time_s - before.time_s

    def rate(self, name: str, model: str, keep: Callable[[dict[str, str]], bool] | None = None) -> float | None:
        if self.dt_s <= 0:
            return None
        b = sum_by(self.before, name, self.label, keep).get(model, 0.0)
        a = sum_by(self.after, name, self.label, keep).get(model, 0.0)
        return _increase(b, a) / self.dt_s

    def increase(self, name: str, model: str) -> float:
        b = sum_by(self.before, name, self.label).get(model, 0.0)
        return _increase(b, sum_by(self.after, name, self.label).get(model, 0.0))

    def quantiles(self, histogram: str, model: str) -> list[float | None]:
        after = _buckets_by(self.after, histogram, self.label).get(model)
        if after is None or self.dt_s <= 0:
            return [None, None]
        before = _buckets_by(self.before, histogram, self.label).get(model, {})
        return window_quantiles(before, after, (0.5, 0.99))

    def gauge(self, name: str, model: str) -> float | None:
        return sum_by(self.after, name, self.label).get(model)


class Readings:
    """Readings of one registry on demand, kept just long enough to reach one window back."""

    def __init__(self, registry: CollectorRegistry, clock: Clock, window_s: float = 5.0,
                 max_readings: int = 1000) -> None:
        if not window_s > 0 or max_readings < 2:
            raise ValueError(f"window_s must be > 0 and max_readings >= 2, got {window_s}, {max_readings}")
        self._registry = registry
        self._clock = clock
        self._window_s = window_s
        self.t0_s = clock.now_s()
        # Oldest first; [0] is the newest reading at least one window old (or the oldest there is).
        self._readings: deque[Reading] = deque([read_registry(registry, self.t0_s)], maxlen=max_readings)

    def take(self) -> tuple[Reading, Reading]:
        """Read the registry now: (the reading about one window ago, now)."""
        now = read_registry(self._registry, self._clock.now_s())
        readings = self._readings
        readings.append(now)
        while len(readings) > 2 and readings[1].time_s <= now.time_s - self._window_s:
            readings.popleft()
        return readings[0], now
