from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from headroom.loadgen.arrivals import (
    ArrivalSpec,
    constant,
    from_trace_csv,
    gamma,
    make_schedule,
    mean_rate_per_s,
    on_off,
    poisson,
    ramp,
    steps,
)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_poisson_count_mean_and_variance_match_theory() -> None:
    rate, duration = 200.0, 200.0
    times = poisson(rate, duration, _rng(1))
    # Count ~ Poisson(rate * duration): mean 40000, sd 200; 5 sd tolerance.
    assert abs(times.size - rate * duration) < 5 * np.sqrt(rate * duration)
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.02)
    assert gaps.var() == pytest.approx(1 / rate**2, rel=0.05)  # exponential: var = mean^2
    # Counts per 1 s window: Poisson, so variance ~ mean (index of dispersion ~ 1).
    counts = np.histogram(times, bins=int(duration), range=(0, duration))[0]
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.25)


def test_schedules_are_sorted_in_range_and_reproduce_with_a_seed() -> None:
    for spec in (
        ArrivalSpec(kind="poisson", rate_per_s=50, duration_s=5),
        ArrivalSpec(kind="gamma", rate_per_s=50, cv=3, duration_s=5),
        ArrivalSpec(kind="on_off", rate_per_s=100, on_s=0.5, off_s=0.5, duration_s=5),
        ArrivalSpec(kind="ramp", rate_per_s=10, end_rate_per_s=90, duration_s=5),
        ArrivalSpec(kind="steps", rates_per_s=(10, 50, 0, 20), step_s=1),
    ):
        a = make_schedule(spec, _rng(7))
        b = make_schedule(spec, _rng(7))
        c = make_schedule(spec, _rng(8))
        assert np.array_equal(a, b), spec.kind
        assert not np.array_equal(a, c), spec.kind
        assert np.all(np.diff(a) >= 0) and a.min() >= 0
        assert a.max() < (spec.duration_s if spec.kind != "steps" else len(spec.rates_per_s) * spec.step_s)


def test_constant_is_evenly_spaced() -> None:
    times = constant(4.0, 2.0)
    assert np.allclose(times, np.arange(8) / 4.0)


def test_gamma_cv_controls_burstiness() -> None:
    gaps_bursty = np.diff(gamma(100, 3.0, 200, _rng(2)))
    gaps_smooth = np.diff(gamma(100, 0.3, 200, _rng(2)))
    assert gaps_bursty.mean() == pytest.approx(0.01, rel=0.1)
    assert gaps_smooth.mean() == pytest.approx(0.01, rel=0.02)
    assert gaps_bursty.std() / gaps_bursty.mean() == pytest.approx(3.0, rel=0.15)
    assert gaps_smooth.std() / gaps_smooth.mean() == pytest.approx(0.3, rel=0.05)


def test_on_off_sends_nothing_in_off_phases() -> None:
    times = on_off(200, 1.0, 1.0, 10.0, _rng(3))
    phase = np.floor(times).astype(int) % 2
    assert np.all(phase == 0)
    assert times.size == pytest.approx(200 * 5, rel=0.1)


def test_ramp_and_steps_follow_their_rates() -> None:
    times = ramp(0.0, 400.0, 10.0, _rng(4))
    first, second = np.sum(times < 5), np.sum(times >= 5)
    # Expected 500 and 1500.
    assert first == pytest.approx(500, rel=0.15)
    assert second == pytest.approx(1500, rel=0.1)
    st = steps((100, 0, 300), 2.0, _rng(5))
    assert np.sum((st >= 2) & (st < 4)) == 0
    assert np.sum(st < 2) == pytest.approx(200, rel=0.25)
    assert np.sum(st >= 4) == pytest.approx(600, rel=0.15)
    assert mean_rate_per_s(ArrivalSpec(kind="steps", rates_per_s=(100, 0, 300))) == pytest.approx(400 / 3)


def test_trace_replay_with_header_and_error_message(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("timestamp_s,other\n10.5,x\n10.0,y\n11.25,z\n")
    assert np.allclose(from_trace_csv(path), [0.0, 0.5, 1.25])
    spec = ArrivalSpec(kind="trace", trace_path=str(path), max_requests=2)
    assert np.allclose(make_schedule(spec, _rng()), [0.0, 0.5])
    bad = tmp_path / "bad.csv"
    bad.write_text("1.0\noops\n")
    with pytest.raises(ValueError, match=r"bad\.csv:2"):
        from_trace_csv(bad)


def test_invalid_arguments_explain_themselves() -> None:
    with pytest.raises(ValueError, match="rate_per_s"):
        poisson(0.0, 1.0, _rng())
    with pytest.raises(ValueError, match="choose one of"):
        ArrivalSpec(kind="weibull")
