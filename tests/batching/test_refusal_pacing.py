"""Refusal pacing: the one-second counters, the hold as a function of the rates, and the state fed by a trace
on explicit times (no clock, no sleeps)."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headroom.batching.refusal_pacing import (
    ADMITTED_FLOOR_PER_S,
    MAX_HOLD_S,
    MIN_HOLD_S,
    STORM_RATIO,
    RefusalPacing,
    WindowCounter,
    hold_s,
)


def test_window_counter_reads_a_steady_rate_and_forgets_after_two_windows() -> None:
    c = WindowCounter()
    for i in range(3000):  # 1000/s for 3 s
        c.add(10.0 + i / 1000)
    assert c.rate_per_s(12.9995) == pytest.approx(1000, rel=0.01)
    assert c.rate_per_s(13.5) == pytest.approx(500, rel=0.01)  # half of the last full second still inside
    assert c.rate_per_s(15.0) == 0.0
    c.add(20.0)
    assert c.rate_per_s(20.0) == 1.0


def test_window_counter_refuses_a_window_that_is_not_a_positive_number() -> None:
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="window_s"):
            WindowCounter(window_s=bad)


@given(admitted=st.floats(0, 1e5), refused=st.floats(0, 1e6), drain=st.floats(0, 100))
def test_hold_is_zero_within_the_ratio_and_bounded_past_it(admitted: float, refused: float, drain: float) -> None:
    h = hold_s(refused, admitted, drain)
    if refused <= STORM_RATIO * max(admitted, ADMITTED_FLOOR_PER_S):
        assert h == 0.0
    else:
        assert MIN_HOLD_S <= h <= MAX_HOLD_S


def test_hold_grows_with_the_excess_and_the_backlog() -> None:
    assert hold_s(799, 100, 0.05) == 0.0  # the default ratio (8): an overload of ~9x what is served is refused at once
    assert hold_s(399, 100, 0.05, ratio=4) == 0.0
    assert hold_s(800, 100, 0.05, ratio=4) == pytest.approx(0.1)  # twice the ratio: twice the drain time
    assert hold_s(8000, 100, 0.05, ratio=4) == MAX_HOLD_S  # capped at the shortest Retry-After an answer carries
    assert hold_s(800, 100, 0.0, ratio=4) == MIN_HOLD_S  # nothing to drain: the floor still paces a tight loop
    assert hold_s(5, 0, 0.05, ratio=4) == pytest.approx(0.0625)  # nothing admitted: judged against 1/s


def test_a_storm_is_held_and_an_ordinary_overload_is_not() -> None:
    """An open loop at 2x what is served (1 refusal per admission) is never held. A storm (20 refusals per
    admission) starts being held within its first second; the hold grows while the refusals stay past the ratio
    (up to the 1 s cap), and once they are back within it the hold shrinks to nothing."""
    p = RefusalPacing()
    t = 100.0
    for i in range(2000):  # 2 s: 500 admitted/s and 500 refused/s
        p.on_admitted(t + i / 1000)
        assert p.on_refused(t + i / 1000 + 0.0005, 0.08) == 0.0
    t += 2.0
    holds = []
    for i in range(2000):  # 1 s: 100 admitted/s, 2000 refused/s
        if i % 20 == 0:
            p.on_admitted(t + i / 2000)
        holds.append(p.on_refused(t + i / 2000, 0.08))
    first = next(i for i, h in enumerate(holds) if h > 0)  # once the window holds more storm than before ...
    assert first < 1900 and all(h > 0 for h in holds[first:])  # ... every later refusal is held,
    assert holds[first] >= MIN_HOLD_S and holds[-1] == MAX_HOLD_S  # longer while it goes on
    assert all(b >= a for a, b in itertools.pairwise(holds[first:]))
    assert p.held == len(holds) - first
    t += 3.0  # the storm is over: the 2 s since its end halve the hold twice; refusals within the ratio take 5% each
    after = []
    for i in range(200):
        p.on_admitted(t + i / 100)
        after.append(p.on_refused(t + i / 100 + 0.001, 0.08))
    assert after[0] == pytest.approx(MAX_HOLD_S / 4 * 0.95, rel=0.01) and after[-1] == 0.0
    assert all(b <= a for a, b in itertools.pairwise(after))


def test_pacing_refuses_a_ratio_that_is_not_a_positive_number() -> None:
    for bad in (0.0, -2.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="ratio"):
            RefusalPacing(ratio=bad)
