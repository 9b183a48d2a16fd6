"""Duty cycle over a sliding window: the share of the last `window_s` seconds that a model's executor
instances spent running batches.

A cumulative average (busy since load / wall time since load) goes stale: after an hour at 90 % and a quiet
minute it still reads ~90 %. This reads what happened in the window, evaluated when it is read (a scrape), so
an idle model decays to 0 without any event. Batches are counted when they end (their whole interval,
clipped to the window), so a batch still running is not in it yet. For rates over any range, Prometheus can
also take `rate(headroom_busy_seconds_total[...])` of the busy counter.
"""

from __future__ import annotations

import threading
from collections import deque

DEFAULT_WINDOW_S = 60.0


class DutyCycleWindow:
    """Busy intervals of the last `window_s` seconds; `duty_cycle(now_s)` in [0, 1]. Written by the event
    loop (batch ends), read by the metrics scrape: guarded by a lock."""

    def __init__(self, instances: int = 1, window_s: float = DEFAULT_WINDOW_S) -> None:
        if instances < 1:
            raise ValueError(f"instances must be >= 1, got {instances}")
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.instances = instances
        self.window_s = window_s
        self._intervals: deque[tuple[float, float]] = deque()  # (start_s, end_s) in end order
        self._lock = threading.Lock()

    def add_busy(self, end_s: float, busy_s: float) -> None:
        """One instance was busy for `busy_s` seconds until `end_s`."""
        if busy_s < 0:
            raise ValueError(f"busy_s must be >= 0, got {busy_s}")
        with self._lock:
            self._intervals.append((end_s - busy_s, end_s))
            self._trim(end_s)

    def duty_cycle(self, now_s: float) -> float:
        """Busy instance-seconds inside (now_s - window_s, now_s] / (window_s x instances)."""
        start = now_s - self.window_s
        with self._lock:
            self._trim(now_s)
            busy = sum(max(0.0, min(e, now_s) - max(s, start)) for s, e in self._intervals)
        return min(1.0, busy / (self.window_s * self.instances))

    def _trim(self, now_s: float) -> None:
        start = now_s - self.window_s
        while self._intervals and self._intervals[0][1] <= start:
            self._intervals.popleft()
