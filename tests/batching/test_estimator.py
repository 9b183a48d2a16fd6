"""The load estimators on explicit (fake) times: unbiased arrival rate that decays, warm-started service."""

from __future__ import annotations

import numpy as np
import pytest

from headroom.batching.estimator import ArrivalRateEstimator, ServiceTimeEstimator
from headroom.core.clock import FakeClock


@pytest.mark.parametrize("rate_per_s", [10.0, 100.0, 1000.0])
def test_poisson_arrival_rate_reads_true_on_average(rate_per_s: float) -> None:
    """An EWMA of 1/gap read ~368/s for a Poisson 100/s stream (issue 18); 1/EWMA(gap) reads the rate."""
    rng = np.random.default_rng(7)
    clock = FakeClock(0.0)
    est = ArrivalRateEstimator()
    readings = []
    for gap in rng.exponential(1.0 / rate_per_s, size=20_000):
        clock.advance(float(gap))
        est.observe(clock.now_s())
        readings.append(est.rate_per_s(clock.now_s()))
    assert np.mean(readings[100:]) == pytest.approx(rate_per_s, rel=0.15)


def test_arrival_rate_decays_with_quiet_time_not_only_on_arrivals() -> None:
    clock = FakeClock(0.0)
    est = ArrivalRateEstimator()
    for _ in range(200):  # a burst at 1000/s
        clock.advance(0.001)
        est.observe(clock.now_s())
    assert est.rate_per_s(clock.now_s()) == pytest.approx(1000.0)
    clock.advance(5.0)
    assert est.rate_per_s(clock.now_s()) <= 0.2  # the gap in progress counts


def test_no_rate_before_two_arrivals() -> None:
    est = ArrivalRateEstimator()
    assert est.rate_per_s(1.0) == 0.0
    est.observe(1.0)
    assert est.rate_per_s(2.0) == 0.0


def test_service_time_fits_fixed_plus_per_item_cost() -> None:
    est = ServiceTimeEstimator()
    assert est.fit() == (0.0, 0.0) and est.mean_s == 0.0
    for n in [1, 8, 32] * 5 + list(range(1, 33)):  # warmup's sizes, then every size
        est.observe(0.004 + 0.002 * n, n)
    fixed_s, per_item_s = est.fit()
    assert fixed_s == pytest.approx(0.004) and per_item_s == pytest.approx(0.002)


def test_service_time_of_one_batch_size_is_all_per_item_and_follows_recent_batches() -> None:
    """At steady overload every batch is full: the fit has no spread and charges all time per item."""
    est = ServiceTimeEstimator()
    est.observe(0.05, 1)  # a warm start
    assert est.fit() == (0.0, 0.05) and est.mean_s == 0.05  # the first measurement, not 20% of it
    for _ in range(60):
        est.observe(0.32, 32)
    fixed_s, per_item_s = est.fit()
    assert fixed_s + 32 * per_item_s == pytest.approx(0.32, rel=1e-3)
    assert est.mean_s == pytest.approx(0.32, rel=1e-3)


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.5])
def test_alpha_is_validated(alpha: float) -> None:
    with pytest.raises(ValueError):
        ArrivalRateEstimator(alpha=alpha)
    with pytest.raises(ValueError):
        ServiceTimeEstimator(alpha=alpha)
