"""Refusal pacing: a client that re-sends at once on a 503 cannot turn refusals into most of the server's work.

Admission refuses a request in microseconds, but each refusal still costs the server an HTTP parse, an answer
and a turn of the event loop, which holds the GIL that the model's threads need for their Python parts. A client
that ignores `Retry-After` and re-sends the moment it is refused (a retry loop without backoff) gets refused as
fast as the server can answer, and that work crowds out the requests it admitted: 64 such connections against
minilm left it 57-176 accepted requests/s of ~650 (session 16's measurement).

So while refusals outnumber admissions more than `STORM_RATIO` to 1 over the last second (an offered load over
`1 + STORM_RATIO` times what is served, far past the 2x that admission answers at once), a refusal is *held*
before it is sent: at least for the backlog's drain time scaled by how far past the ratio the refusals are, and
longer (`GAIN` more per refusal) for as long as they stay past it, since a client that is paced re-sends less
often and the hold that brings the refusals back to the ratio is what it converges to; at least `MIN_HOLD_S`,
at most `MAX_HOLD_S`, the shortest `Retry-After` an answer carries (whole seconds, >= 1). Once refusals are
within the ratio the hold shrinks by `GAIN` per refusal and halves every `LEVEL_HALF_LIFE_S`. (Holding for the
rates' hold alone, with no memory, left a 64-connection storm at ~1,000 refusals/s and minilm at ~40% of its
capacity; the feedback brings it to ~450/s and 50-60%, on a 2-core Zen 3 EPYC. The ratio is 8, not 4: an open
loop at 2x on that machine, whose accepted rate sagged under the refusals' cost, refused ~3 per admission on
average and past 4 at times, and the holds that followed took its rejection p99 to 1 s; at 8 a storm still
settles near 50% of capacity. See BENCHMARKS.md.) A held
refusal costs the server a timer, not CPU. A client that waits for its answer before re-sending (any
HTTP/1.1 connection, any closed loop) is paced by it; a client that honours `Retry-After` never meets it; and
below the ratio nothing is held, so an ordinary overload is still refused at once, fast enough for a router or a
client to go elsewhere.

This is policy only: `RefusalPacing` holds two one-second counters and the hold's level, updated with explicit
times; `hold_s` is a pure function of the rates, the backlog's drain time and the settings. The batcher feeds it
admissions and refusals and puts the hold on the `Overloaded` it raises; the transports wait
`HeadroomError.hold_s` before they answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: Refusals per admission (over the last second) above which refusals are held.
STORM_RATIO = 8.0
#: The shortest hold: long enough to pace a client that re-sends within microseconds.
MIN_HOLD_S = 0.01
#: The longest hold: the shortest Retry-After an answer carries (the header is in whole seconds, at least 1).
MAX_HOLD_S = 1.0
#: The hold's relative step per refusal: up while refusals stay past the ratio, down once they are within it.
GAIN = 0.05
#: ... and it halves every this many seconds, so a storm that has passed leaves no hold behind.
LEVEL_HALF_LIFE_S = 1.0
#: Admissions per second assumed when none were counted (a stalled model): refusals are held past the ratio
#: of this, not at the first one.
ADMITTED_FLOOR_PER_S = 1.0


@dataclass(slots=True)
class WindowCounter:
    """Events per second over a sliding window, from two fixed buckets (the previous one weighted by how
    much of it is still inside the window): O(1) memory and time per event, exact for a steady rate."""

    window_s: float = 1.0
    start_s: float = -math.inf  # start of the current bucket
    current: int = 0  # events in the current bucket
    previous: int = 0  # events in the bucket before it

    def __post_init__(self) -> None:
        if not 0.0 < self.window_s < math.inf:
            raise ValueError(f"window_s must be a positive number of seconds, got {self.window_s}")

    def _roll(self, now_s: float) -> None:
        if now_s < self.start_s + self.window_s:
            return
        buckets = math.floor((now_s - self.start_s) / self.window_s) if self.start_s > -math.inf else 2
        self.previous = self.current if buckets == 1 else 0
        self.current = 0
        self.start_s = now_s if buckets > 1 else self.start_s + self.window_s

    def add(self, now_s: float, n: int = 1) -> None:
        """Count `n` events at `now_s` (times never go backwards for one counter)."""
        self._roll(now_s)
        self.current += n

    def rate_per_s(self, now_s: float) -> float:
        """Events per second over the window that ends at `now_s`."""
        self._roll(now_s)
        inside = 1.0 - min(max((now_s - self.start_s) / self.window_s, 0.0), 1.0)
        return (self.current + self.previous * inside) / self.window_s


def hold_s(
    refused_per_s: float,
    admitted_per_s: float,
    drain_s: float,
    ratio: float = STORM_RATIO,
    min_hold_s: float = MIN_HOLD_S,
    max_hold_s: float = MAX_HOLD_S,
) -> float:
    """How long to hold a refusal: 0 while refusals stay within `ratio` x admissions; past it, the backlog's
    drain time (`drain_s`: its Retry-After before rounding) x the excess, within [min_hold_s, max_hold_s]."""
    allowed_per_s = ratio * max(admitted_per_s, ADMITTED_FLOOR_PER_S)
    if refused_per_s <= allowed_per_s:
        return 0.0
    excess = refused_per_s / allowed_per_s
    return min(max_hold_s, max(min_hold_s, max(drain_s, 0.0) * excess))


@dataclass(slots=True)
class RefusalPacing:
    """One queue's admissions and refusals over the last second, and the hold they call for."""

    ratio: float = STORM_RATIO
    admitted: WindowCounter = field(default_factory=WindowCounter)
    refused: WindowCounter = field(default_factory=WindowCounter)
    held: int = 0  # refusals given a hold (lifetime)
    level_s: float = 0.0  # the hold now: raised while refusals stay past the ratio, lowered once they are not
    level_at_s: float = -math.inf  # when `level_s` was last written (it halves every LEVEL_HALF_LIFE_S since)

    def __post_init__(self) -> None:
        if not 0.0 < self.ratio < math.inf:
            raise ValueError(f"ratio must be a positive number, got {self.ratio}")

    def on_admitted(self, now_s: float) -> None:
        self.admitted.add(now_s)

    def on_refused(self, now_s: float, drain_s: float) -> float:
        """Count a refusal at `now_s` and return how long to hold it (seconds; 0: answer now)."""
        self.refused.add(now_s)
        if self.level_s > 0.0:
            self.level_s *= math.exp2(-max(now_s - self.level_at_s, 0.0) / LEVEL_HALF_LIFE_S)
        self.level_at_s = now_s
        target = hold_s(self.refused.rate_per_s(now_s), self.admitted.rate_per_s(now_s), drain_s, self.ratio)
        if target > 0.0:  # past the ratio: at least the rates' hold, and more while it does not bring them back
            self.level_s = min(MAX_HOLD_S, max(self.level_s * (1.0 + GAIN), target))
        else:
            self.level_s = 0.0 if self.level_s * (1.0 - GAIN) < MIN_HOLD_S else self.level_s * (1.0 - GAIN)
        self.held += self.level_s > 0.0
        return self.level_s
