"""The delay calibration's feedback loop: misses raise the factor, close calls that made it lower it, requests
the current factor would refuse are ignored, and the loop settles where the miss rate is the target."""

from __future__ import annotations

import math

import numpy as np
import pytest

from headroom.batching.calibration import (
    FACTOR_RANGE,
    INITIAL_FACTOR,
    MISS_RATE,
    NEAR_BUDGET,
    UP,
    DelayCalibration,
    is_close_call,
)

DOWN = UP * MISS_RATE / (1 - MISS_RATE)


def test_the_defaults() -> None:
    assert (UP, MISS_RATE, INITIAL_FACTOR, FACTOR_RANGE, NEAR_BUDGET) == (0.05, 0.0025, 1.5, (1.0, 4.0), 0.5)
    assert DelayCalibration().factor == 1.5


def test_a_miss_raises_the_factor_and_a_close_call_that_made_it_lowers_it() -> None:
    cal = DelayCalibration(factor=1.0)
    cal.observe(delay_s=0.12, budget_s=0.1, expected_s=0.01)  # a miss counts, close call or not
    assert cal.factor == pytest.approx(1.05) and cal.misses == 1
    cal.observe(delay_s=0.09, budget_s=0.1, expected_s=0.06)  # 1.05 x 60 ms >= half the budget
    assert cal.factor == pytest.approx(1.05 * (1 - DOWN)) and cal.close_calls == 1
    assert cal.down == pytest.approx(DOWN)


def test_requests_with_budget_to_spare_or_without_a_budget_or_prediction_move_nothing() -> None:
    cal = DelayCalibration(factor=1.0)
    for delay_s in np.linspace(0.0, 0.1, 50):  # predicted 49 ms of 100: not a close call, and within budget
        cal.observe(delay_s=float(delay_s), budget_s=0.1, expected_s=0.049)
    for budget_s in (math.inf, 0.0, -1.0, math.nan):
        cal.observe(delay_s=5.0, budget_s=budget_s, expected_s=0.06)
    cal.observe(delay_s=5.0, budget_s=0.1, expected_s=0.0)
    assert cal.factor == 1.0 and cal.misses == 0 and cal.close_calls == 0


def test_requests_the_current_factor_would_refuse_are_ignored() -> None:
    """A queue admitted at factor 1 misses all at once: the first misses raise the factor, and the rest, which
    the raised factor would have refused, say nothing about it (they no longer drive it to its ceiling)."""
    cal = DelayCalibration(factor=1.0)
    for _ in range(40):  # admitted at 90 ms of 100 at factor 1; 1.05^3 x 90 > 100
        cal.observe(delay_s=0.13, budget_s=0.1, expected_s=0.09)
    assert cal.misses == 3 and cal.factor == pytest.approx(1.05 ** 3)


def test_the_factor_stays_within_its_range_however_long_the_streak() -> None:
    cal = DelayCalibration()
    for _ in range(1000):
        cal.observe(delay_s=1.0, budget_s=0.1, expected_s=0.001)
    assert cal.factor == FACTOR_RANGE[1]
    for _ in range(20_000):  # ~11,000 steps down take it from the top to the bottom
        cal.observe(delay_s=0.001, budget_s=0.1, expected_s=0.06 / cal.factor)  # a close call at every factor
    assert cal.factor == FACTOR_RANGE[0]


@pytest.mark.parametrize("kwargs", [dict(miss_rate=0.0), dict(miss_rate=0.5), dict(miss_rate=-0.1),
                                    dict(miss_rate=math.nan), dict(up=0.0), dict(up=1.0), dict(up=math.inf),
                                    dict(factor=0.9), dict(factor=4.1), dict(factor=math.nan)])
def test_settings_are_validated(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        DelayCalibration(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("predicted_s", "budget_s", "close"), [
    (0.05, 0.1, True), (0.0499, 0.1, False), (0.2, 0.1, True), (0.05, math.inf, False), (0.05, 0.0, False),
    (0.05, -1.0, False), (0.0, 0.1, False), (0.05, math.nan, False),
])
def test_close_calls(predicted_s: float, budget_s: float, close: bool) -> None:
    assert NEAR_BUDGET == 0.5
    assert is_close_call(predicted_s, budget_s) is close


@pytest.mark.parametrize(("miss_rate", "cv"), [(0.0025, 0.3), (0.01, 0.3), (0.01, 0.8), (0.05, 0.5)])
def test_the_loop_settles_at_the_quantile_that_misses_the_target_rate(miss_rate: float, cv: float) -> None:
    """Requests admitted right at the boundary (predicted = budget) whose delay is their mean prediction times
    lognormal noise: one misses when the noise exceeds the factor. The factor converges to the noise's
    (1 - miss_rate) quantile, and the share of misses to miss_rate."""
    rng = np.random.default_rng(11)
    sigma = math.sqrt(math.log(1 + cv * cv))
    noise = rng.lognormal(-sigma * sigma / 2, sigma, size=400_000)
    cal = DelayCalibration(miss_rate=miss_rate, up=0.01)  # small steps: the equilibrium, not the noise
    misses = 0
    for i, r in enumerate(noise):
        expected_s = 0.0999 / cal.factor  # admitted where factor x expected just fits a 100 ms budget
        misses += bool(r * expected_s > 0.1) and i >= 100_000  # the same test `observe` makes
        cal.observe(delay_s=float(r) * expected_s, budget_s=0.1, expected_s=expected_s)
    quantile = float(np.quantile(noise, 1 - miss_rate))
    assert cal.factor == pytest.approx(quantile, rel=0.12)
    assert misses / 300_000 == pytest.approx(miss_rate, rel=0.2)
