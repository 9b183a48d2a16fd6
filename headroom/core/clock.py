"""Clocks are injected everywhere a policy or mechanism needs `now`.

`MonotonicClock` is the production clock (seconds from `time.monotonic()`); `FakeClock` is advanced by hand in
tests and by the discrete-event simulator, so the same policy code runs on real and virtual time.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of monotonic time in seconds."""

    def now_s(self) -> float:
        """Seconds on a monotonic scale; only differences are meaningful."""
        ...


class MonotonicClock:
    """Wall-clock durations from `time.monotonic()`."""

    def now_s(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to (tests, simulator)."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s

    def now_s(self) -> float:
        return self._now_s

    def advance(self, delta_s: float) -> None:
        """Move time forward by `delta_s` seconds (never backwards)."""
        if delta_s < 0:
            raise ValueError(f"cannot move a clock backwards (delta_s={delta_s})")
        self._now_s += delta_s

    def set(self, now_s: float) -> None:
        """Jump to an absolute time, which must not be in the past."""
        if now_s < self._now_s:
            raise ValueError(f"cannot move a clock backwards ({now_s} < {self._now_s})")
        self._now_s = now_s
