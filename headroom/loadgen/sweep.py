"""Sweeps as pure policies: bisection for the highest VALID rate, and the latency-throughput Pareto frontier.

`BisectState` + `next_probe` / `observe` decide which rate to try next from the verdicts so far (no I/O);
`find_peak_rate` drives them with any async `probe(rate) -> valid`. The frontier keeps the runs that no other
run beats on both throughput (higher) and p99 latency (lower).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class BisectConfig:
    """Search bounds and stopping rule."""

    low_rate_per_s: float = 1.0  # lowest rate to consider; if it is invalid the search reports 0
    high_rate_per_s: float = 100.0  # first upper guess; doubled while it is still valid
    max_rate_per_s: float = 1e6  # never probe above this
    rel_tolerance: float = 0.05  # stop when (high - low) <= rel_tolerance * low
    max_probes: int = 20  # stop after this many probes whatever the bracket

    def __post_init__(self) -> None:
        if not 0 < self.low_rate_per_s <= self.high_rate_per_s <= self.max_rate_per_s:
            raise ValueError("need 0 < low_rate_per_s <= high_rate_per_s <= max_rate_per_s")
        if self.rel_tolerance <= 0 or self.max_probes < 1:
            raise ValueError("rel_tolerance must be > 0 and max_probes >= 1")


@dataclass(frozen=True, slots=True)
class BisectState:
    """What the search knows so far."""

    best_valid_per_s: float = 0.0  # highest rate seen VALID (0 = none yet)
    lowest_invalid_per_s: float = 0.0  # lowest rate seen invalid (0 = none yet)
    probes: tuple[tuple[float, bool], ...] = ()  # (rate, valid) in probe order


def next_probe(state: BisectState, config: BisectConfig) -> float | None:
    """The next rate to try, or None when the search is done."""
    if len(state.probes) >= config.max_probes:
        return None
    if not state.probes:
        return config.high_rate_per_s
    lo, hi = state.best_valid_per_s, state.lowest_invalid_per_s
    if hi == 0.0:  # everything so far was valid: expand
        nxt = min(lo * 2.0, config.max_rate_per_s)
        return None if nxt <= lo else nxt
    if lo == 0.0:  # nothing valid yet: try lower, down to the floor
        if any(rate <= config.low_rate_per_s for rate, _ in state.probes):
            return None
        return max(hi / 2.0, config.low_rate_per_s)
    if hi - lo <= config.rel_tolerance * lo:
        return None
    return 0.5 * (lo + hi)


def observe(state: BisectState, rate_per_s: float, valid: bool) -> BisectState:
    """Fold one probe's verdict into the state."""
    probes = (*state.probes, (rate_per_s, valid))
    if valid:
        return replace(state, best_valid_per_s=max(state.best_valid_per_s, rate_per_s), probes=probes)
    lowest = rate_per_s if state.lowest_invalid_per_s == 0.0 else min(state.lowest_invalid_per_s, rate_per_s)
    return replace(state, lowest_invalid_per_s=lowest, probes=probes)


async def find_peak_rate(
    probe: Callable[[float], Awaitable[bool]],
    config: BisectConfig,
    on_probe: Callable[[float, bool, BisectState], None] | None = None,
) -> BisectState:
    """Run probes until `next_probe` says stop; `best_valid_per_s` is the answer (0 when none was valid)."""
    state = BisectState()
    while (rate := next_probe(state, config)) is not None:
        valid = await probe(rate)
        state = observe(state, rate, valid)
        if on_probe is not None:
            on_probe(rate, valid, state)
    return state


@dataclass(frozen=True, slots=True)
class ParetoPoint:
    """One run on the latency-throughput plane."""

    label: str  # e.g. "max_queue_delay_ms=2"
    throughput_per_s: float  # achieved (goodput or ok) requests per second
    p99_ms: float  # p99 end-to-end latency
    on_frontier: bool = False  # set by pareto_frontier


def pareto_frontier(points: Sequence[ParetoPoint]) -> list[ParetoPoint]:
    """Mark each point that no other point dominates (>= throughput and <= p99, one strictly better)."""

    def dominated(p: ParetoPoint) -> bool:
        return any(
            q is not p
            and q.throughput_per_s >= p.throughput_per_s
            and q.p99_ms <= p.p99_ms
            and (q.throughput_per_s > p.throughput_per_s or q.p99_ms < p.p99_ms)
            for q in points
        )

    marked = [replace(p, on_frontier=not dominated(p)) for p in points]
    return sorted(marked, key=lambda p: (p.throughput_per_s, p.p99_ms))
