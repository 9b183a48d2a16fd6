"""The load estimators on explicit (fake) times: unbiased arrival rate that decays, warm-started service."""

from __future__ import annotations

import math
import random

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
    with pytest.raises(ValueError):
        ServiceTimeEstimator(dispersion_alpha=alpha)


@pytest.mark.parametrize("tail_z", [-1.0, math.inf, math.nan])
def test_tail_z_is_validated(tail_z: float) -> None:
    with pytest.raises(ValueError):
        ServiceTimeEstimator(tail_z=tail_z)


def test_tail_factor_from_the_ratio_of_measured_to_fitted_time() -> None:
    """A batch twice as slow as the fit predicted: the ratio's mean moves 5% of the way (1.05), its mean absolute
    deviation to 0.05, so the p99 factor is 1.05 + 2.326 x sqrt(pi/2) x 0.05 = 1.1958."""
    est = ServiceTimeEstimator()
    est.observe(0.1, 1)
    assert est.tail_factor() == 1.0  # nothing to compare the first batch with
    est.observe(0.2, 1)
    assert est.ratio_mean == pytest.approx(1.05) and est.ratio_deviation == pytest.approx(0.05)
    assert est.tail_factor() == pytest.approx(1.05 + 2.326 * math.sqrt(math.pi / 2) * 0.05)
    assert ServiceTimeEstimator(tail_z=0.0, ratio_mean=1.05, ratio_deviation=0.05).tail_factor() == pytest.approx(1.05)


def test_one_stall_widens_the_tail_only_as_far_as_the_clip() -> None:
    """A 1000x stall counts as 4x (RATIO_CLIP): mean 1.15, deviation 0.15, factor 1.587, not 100+."""
    est = ServiceTimeEstimator()
    est.observe(0.1, 1)
    est.observe(100.0, 1)
    assert est.ratio_mean == pytest.approx(1.15) and est.ratio_deviation == pytest.approx(0.15)
    assert est.tail_factor() == pytest.approx(1.15 + 2.326 * math.sqrt(math.pi / 2) * 0.15)


def test_warmup_sizes_and_an_exact_fit_leave_the_tail_at_the_mean() -> None:
    """Warmup's batches (8 then 32 items) only guess from one size at the second: not counted. Batches exactly
    on a line are predicted exactly: no spread, factor 1."""
    est = ServiceTimeEstimator()
    est.observe(0.02, 8)
    est.observe(0.068, 32)
    assert est.ratio_mean == 1.0 and est.ratio_deviation == 0.0 and est.tail_factor() == 1.0
    for n in [1, 8, 32, 16] * 20:
        est.observe(0.004 + 0.002 * n, n)
    assert est.tail_factor() == pytest.approx(1.0, abs=1e-6)


def test_tail_factor_predicts_near_the_99th_percentile_of_noisy_batches() -> None:
    """Full batches whose time is the same mean times normal noise (10% sd): predicting fit x tail_factor, about
    1% of batches take longer (at the mean, about half would), and the factor reads ~1 + 2.33 x 0.1."""
    rng = random.Random(7)
    est = ServiceTimeEstimator()
    over_tail = over_mean = 0
    batches = 4000
    for i in range(batches):
        fixed_s, per_item_s = est.fit()
        fitted_s, tail = fixed_s + 32 * per_item_s, est.tail_factor()
        took_s = 0.08 * max(0.1, rng.gauss(1.0, 0.1))
        if i >= 200:  # once the estimates settled
            over_tail += took_s > fitted_s * tail
            over_mean += took_s > fitted_s
        est.observe(took_s, 32)
    settled = batches - 200
    assert 0.002 <= over_tail / settled <= 0.03, over_tail
    assert 0.4 <= over_mean / settled <= 0.6, over_mean
    assert 1.15 <= est.tail_factor() <= 1.35
