"""Seeded arrival schedules: pure functions returning sorted send offsets in seconds from the run's start.

Every generator takes its randomness from an injected `numpy.random.Generator`, so the same seed always gives
the same schedule (the load generator and the discrete-event simulator share these). Offsets are float64,
sorted ascending, all in ``[0, duration_s)``.

    poisson(rate_per_s, duration_s, rng)           exponential gaps, mean 1/rate (MLPerf Server scenario)
    constant(rate_per_s, duration_s)               evenly spaced, no randomness
    gamma(rate_per_s, cv, duration_s, rng)         gamma gaps with coefficient of variation `cv`
                                                   (cv=1: Poisson, cv>1: bursty, cv<1: smoother)
    on_off(on_rate_per_s, on_s, off_s, duration_s, rng, off_rate_per_s=0)  bursts: Poisson at on_rate
                                                   for on_s seconds, then off_rate for off_s seconds, repeat
    ramp(start_rate_per_s, end_rate_per_s, duration_s, rng)  Poisson whose rate moves linearly
    steps(rates_per_s, step_s, rng)                Poisson at each rate for step_s seconds in turn
    from_trace_csv(path)                           replay timestamps (seconds) from a CSV's first column

`ArrivalSpec` describes any of them as data; `make_schedule(spec, rng)` builds it.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

ARRIVAL_KINDS: tuple[str, ...] = ("poisson", "constant", "gamma", "on_off", "ramp", "steps", "trace")


def _check_positive(name: str, value: float) -> None:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def _check_non_negative(name: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")


def _empty() -> FloatArray:
    return np.zeros(0, dtype=np.float64)


def _renewal(draw_gaps: Callable[[int], FloatArray], mean_gap_s: float, duration_s: float) -> FloatArray:
    """Cumulative sums of i.i.d. gaps, truncated to ``[0, duration_s)``; drawn in chunks past the end."""
    expected = duration_s / mean_gap_s
    chunk = max(16, int(expected + 6.0 * math.sqrt(expected) + 16))
    parts: list[FloatArray] = []
    last_s = 0.0
    while last_s < duration_s:
        times = last_s + np.cumsum(draw_gaps(chunk))
        parts.append(times)
        last_s = float(times[-1])
    out = np.concatenate(parts) if parts else _empty()
    return np.asarray(out[out < duration_s], dtype=np.float64)


def poisson(rate_per_s: float, duration_s: float, rng: np.random.Generator) -> FloatArray:
    """Poisson process: exponential inter-arrival gaps with mean ``1 / rate_per_s``."""
    _check_positive("rate_per_s", rate_per_s)
    _check_non_negative("duration_s", duration_s)
    mean_gap_s = 1.0 / rate_per_s
    return _renewal(lambda n: rng.exponential(mean_gap_s, size=n), mean_gap_s, duration_s)


def constant(rate_per_s: float, duration_s: float) -> FloatArray:
    """Evenly spaced sends at ``k / rate_per_s`` for k = 0, 1, ... while below ``duration_s``."""
    _check_positive("rate_per_s", rate_per_s)
    _check_non_negative("duration_s", duration_s)
    count = math.ceil(duration_s * rate_per_s - 1e-9)
    out = np.arange(max(count, 0), dtype=np.float64) / rate_per_s
    return np.asarray(out[out < duration_s], dtype=np.float64)


def gamma(rate_per_s: float, cv: float, duration_s: float, rng: np.random.Generator) -> FloatArray:
    """Gamma renewal process with mean gap ``1 / rate_per_s`` and coefficient of variation ``cv``.

    The gamma shape is ``1 / cv**2`` (vLLM's ``--burstiness`` is that shape); cv = 1 is Poisson.
    """
    _check_positive("rate_per_s", rate_per_s)
    _check_positive("cv", cv)
    _check_non_negative("duration_s", duration_s)
    shape = 1.0 / (cv * cv)
    mean_gap_s = 1.0 / rate_per_s
    scale = mean_gap_s / shape
    return _renewal(lambda n: rng.gamma(shape, scale, size=n), mean_gap_s, duration_s)


def _piecewise_poisson(segments: Sequence[tuple[float, float, float]], rng: np.random.Generator) -> FloatArray:
    """Poisson within each (start_s, end_s, rate_per_s) segment; a rate of 0 sends nothing there."""
    parts: list[FloatArray] = []
    for start_s, end_s, rate_per_s in segments:
        if rate_per_s <= 0 or end_s <= start_s:
            continue
        parts.append(start_s + poisson(rate_per_s, end_s - start_s, rng))
    return np.concatenate(parts) if parts else _empty()


def on_off(
    on_rate_per_s: float,
    on_s: float,
    off_s: float,
    duration_s: float,
    rng: np.random.Generator,
    off_rate_per_s: float = 0.0,
) -> FloatArray:
    """Bursts: Poisson at ``on_rate_per_s`` for ``on_s``, then ``off_rate_per_s`` for ``off_s``; repeat."""
    _check_positive("on_rate_per_s", on_rate_per_s)
    _check_positive("on_s", on_s)
    _check_non_negative("off_s", off_s)
    _check_non_negative("off_rate_per_s", off_rate_per_s)
    _check_non_negative("duration_s", duration_s)
    segments: list[tuple[float, float, float]] = []
    t_s = 0.0
    while t_s < duration_s:
        segments.append((t_s, min(t_s + on_s, duration_s), on_rate_per_s))
        t_s += on_s
        if off_s > 0 and t_s < duration_s:
            segments.append((t_s, min(t_s + off_s, duration_s), off_rate_per_s))
        t_s += off_s
    return _piecewise_poisson(segments, rng)


def ramp(start_rate_per_s: float, end_rate_per_s: float, duration_s: float, rng: np.random.Generator) -> FloatArray:
    """Inhomogeneous Poisson whose rate moves linearly from ``start_rate_per_s`` to ``end_rate_per_s``.

    Built by thinning a Poisson process at the peak rate, so the count in any window is exact in law.
    """
    _check_non_negative("start_rate_per_s", start_rate_per_s)
    _check_non_negative("end_rate_per_s", end_rate_per_s)
    _check_non_negative("duration_s", duration_s)
    peak = max(start_rate_per_s, end_rate_per_s)
    if peak <= 0:
        raise ValueError("ramp needs start_rate_per_s or end_rate_per_s above 0")
    if duration_s == 0:
        return _empty()
    candidates = poisson(peak, duration_s, rng)
    rate_at = start_rate_per_s + (end_rate_per_s - start_rate_per_s) * (candidates / duration_s)
    keep = rng.random(candidates.size) < rate_at / peak
    return np.asarray(candidates[keep], dtype=np.float64)


def steps(rates_per_s: Sequence[float], step_s: float, rng: np.random.Generator) -> FloatArray:
    """Poisson at each rate in turn for ``step_s`` seconds each (a rate of 0 is a pause)."""
    _check_positive("step_s", step_s)
    if len(rates_per_s) == 0:
        raise ValueError("steps needs at least one rate, e.g. rates_per_s=(10, 20, 40)")
    for rate in rates_per_s:
        _check_non_negative("each rate in rates_per_s", rate)
    segments = [(i * step_s, (i + 1) * step_s, float(r)) for i, r in enumerate(rates_per_s)]
    return _piecewise_poisson(segments, rng)


def from_trace_csv(path: str | Path) -> FloatArray:
    """Send times (seconds, first column) of a CSV shifted to start at 0; a non-numeric first row: header.

    Example file::

        timestamp_s
        0.000
        0.013
        0.020
    """
    trace_path = Path(path)
    if not trace_path.is_file():
        raise ValueError(f"trace file {trace_path} does not exist; pass a CSV whose first column is seconds")
    values: list[float] = []
    with trace_path.open(newline="") as fh:
        for row_number, row in enumerate(csv.reader(fh), start=1):
            if not row or not row[0].strip() or row[0].lstrip().startswith("#"):
                continue
            try:
                values.append(float(row[0]))
            except ValueError:
                if values or row_number > 1:
                    raise ValueError(f"{trace_path}:{row_number}: {row[0]!r} is not a number of seconds") from None
    if not values:
        raise ValueError(f"trace file {trace_path} holds no timestamps")
    out = np.sort(np.asarray(values, dtype=np.float64))
    if not np.all(np.isfinite(out)):
        raise ValueError(f"trace file {trace_path} holds non-finite timestamps")
    return np.asarray(out - out[0], dtype=np.float64)


@dataclass(frozen=True, slots=True)
class ArrivalSpec:
    """An arrival process as data; `make_schedule` turns it into send offsets."""

    kind: str = "poisson"  # one of ARRIVAL_KINDS
    rate_per_s: float = 10.0  # mean rate (poisson, constant, gamma); the on-phase rate for on_off
    duration_s: float = 10.0  # length of the schedule in seconds (ignored by steps and trace)
    cv: float = 1.0  # gamma: coefficient of variation of the gaps (1 = Poisson, >1 bursty)
    on_s: float = 1.0  # on_off: seconds of each burst
    off_s: float = 1.0  # on_off: seconds of each quiet phase
    off_rate_per_s: float = 0.0  # on_off: rate during the quiet phase
    end_rate_per_s: float = 0.0  # ramp: rate at the end (starts at rate_per_s)
    rates_per_s: tuple[float, ...] = field(default_factory=tuple)  # steps: the rate of each step in order
    step_s: float = 1.0  # steps: seconds per step
    trace_path: str = ""  # trace: CSV whose first column holds send times in seconds
    max_requests: int = 0  # if > 0, keep only the first max_requests sends

    def __post_init__(self) -> None:
        if self.kind not in ARRIVAL_KINDS:
            raise ValueError(f"unknown arrival kind {self.kind!r}; choose one of {', '.join(ARRIVAL_KINDS)}")
        if self.max_requests < 0:
            raise ValueError(f"max_requests must be >= 0, got {self.max_requests}")


def make_schedule(spec: ArrivalSpec, rng: np.random.Generator) -> FloatArray:
    """Build the send offsets (seconds, sorted) that `spec` describes, drawing randomness from `rng`."""
    out: FloatArray
    if spec.kind == "poisson":
        out = poisson(spec.rate_per_s, spec.duration_s, rng)
    elif spec.kind == "constant":
        out = constant(spec.rate_per_s, spec.duration_s)
    elif spec.kind == "gamma":
        out = gamma(spec.rate_per_s, spec.cv, spec.duration_s, rng)
    elif spec.kind == "on_off":
        out = on_off(spec.rate_per_s, spec.on_s, spec.off_s, spec.duration_s, rng, spec.off_rate_per_s)
    elif spec.kind == "ramp":
        out = ramp(spec.rate_per_s, spec.end_rate_per_s, spec.duration_s, rng)
    elif spec.kind == "steps":
        out = steps(spec.rates_per_s, spec.step_s, rng)
    else:
        out = from_trace_csv(spec.trace_path)
    if spec.max_requests > 0:
        out = out[: spec.max_requests]
    return out


def mean_rate_per_s(spec: ArrivalSpec) -> float:
    """The expected long-run send rate of `spec` (reports, simulator); a trace's rate comes from its file."""
    if spec.kind in ("poisson", "constant", "gamma"):
        return spec.rate_per_s
    if spec.kind == "on_off":
        period_s = spec.on_s + spec.off_s
        return (spec.rate_per_s * spec.on_s + spec.off_rate_per_s * spec.off_s) / period_s
    if spec.kind == "ramp":
        return 0.5 * (spec.rate_per_s + spec.end_rate_per_s)
    if spec.kind == "steps":
        return float(np.mean(spec.rates_per_s)) if spec.rates_per_s else 0.0
    times = from_trace_csv(spec.trace_path)
    span_s = float(times[-1]) if times.size > 1 else 0.0
    return (times.size - 1) / span_s if span_s > 0 else 0.0
