"""The delay calibration's feedback loop: misses raise the factor, close calls that made it lower it, requests
the current factor would refuse are ignored, and the loop settles where the miss rate is the target."""

from __future__ import annotations

import math

import numpy as np
import pytest

from headroom.batching.calibration import (
    FACTOR_RANGE,
    HALF_LIFE_S,
    INITIAL_FACTOR,
    MISS_RATE,
    NEAR_BUDGET,
    QUIET_S,
    UP,
    DelayCalibration,
    is_close_call,
)

DOWN = UP * MISS_RATE / (1 - MISS_RATE)


def test_the_defaults() -> None:
    assert (UP, MISS_RATE, INITIAL_FACTOR, FACTOR_RANGE, NEAR_BUDGET) == (0.05, 0.0025, 1.5, (1.0, 4.0), 0.5)
    assert (QUIET_S, HALF_LIFE_S) == (3.0, 2.0)
    assert DelayCalibration().factor == 1.5


def test_a_miss_raises_the_factor_and_a_close_call_that_made_it_lowers_it() -> None:
    cal = DelayCalibration(factor=1.0, set_s=0.0)
    cal.observe(delay_s=0.12, budget_s=0.1, expected_s=0.01, now_s=0.0)  # a miss counts, close call or not
    assert cal.factor == pytest.approx(1.05) and cal.misses == 1
    cal.observe(delay_s=0.09, budget_s=0.1, expected_s=0.06, now_s=0.0)  # 1.05 x 60 ms >= half the budget
    assert cal.factor == pytest.approx(1.05 * (1 - DOWN)) and cal.close_calls == 1
    assert cal.down == pytest.approx(DOWN)


def test_requests_with_budget_to_spare_or_without_a_budget_or_prediction_move_nothing() -> None:
    cal = DelayCalibration(factor=1.0, set_s=0.0)
    for delay_s in np.linspace(0.0, 0.1, 50):  # predicted 49 ms of 100: not a close call, and within budget
        cal.observe(delay_s=float(delay_s), budget_s=0.1, expected_s=0.049, now_s=0.0)
    for budget_s in (math.inf, 0.0, -1.0, math.nan):
        cal.observe(delay_s=5.0, budget_s=budget_s, expected_s=0.06, now_s=0.0)
    cal.observe(delay_s=5.0, budget_s=0.1, expected_s=0.0, now_s=0.0)
    assert cal.factor == 1.0 and cal.misses == 0 and cal.close_calls == 0


def test_requests_the_current_factor_would_refuse_are_ignored() -> None:
    """A queue admitted at factor 1 misses all at once: the first misses raise the factor, and the rest, which
    the raised factor would have refused, say nothing about it (they no longer drive it to its ceiling)."""
    cal = DelayCalibration(factor=1.0, set_s=0.0)
    for _ in range(40):  # admitted at 90 ms of 100 at factor 1; 1.05^3 x 90 > 100
        cal.observe(delay_s=0.13, budget_s=0.1, expected_s=0.09, now_s=0.0)
    assert cal.misses == 3 and cal.factor == pytest.approx(1.05 ** 3)


def test_the_factor_stays_within_its_range_however_long_the_streak() -> None:
    cal = DelayCalibration()
    for _ in range(1000):
        cal.observe(delay_s=1.0, budget_s=0.1, expected_s=0.001, now_s=0.0)
    assert cal.factor == FACTOR_RANGE[1]
    for _ in range(20_000):  # ~11,000 steps down take it from the top to the bottom
        cal.observe(delay_s=0.001, budget_s=0.1, expected_s=0.06 / cal.factor, now_s=0.0)  # always a close call
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
        cal.observe(delay_s=float(r) * expected_s, budget_s=0.1, expected_s=expected_s, now_s=0.0)
    quantile = float(np.quantile(noise, 1 - miss_rate))
    assert cal.factor == pytest.approx(quantile, rel=0.12)
    assert misses / 300_000 == pytest.approx(miss_rate, rel=0.2)


def test_the_factor_relaxes_back_to_its_start_3_s_after_the_last_miss() -> None:
    """Misses at t = 10 s raised the factor to 2.0; it holds for 3 s, then halves its distance from 1.5 every
    2 s. Requests with budget to spare move nothing; a close call lowers the relaxed value a step and the
    relaxation goes on from there: close calls do not hold it off (a raised factor predicts ordinary requests
    near the budget, and counting them kept it raised at moderate load)."""
    cal = DelayCalibration(factor=2.0, last_miss_s=10.0, set_s=10.0)
    assert cal.factor_at(12.0) == 2.0 and cal.factor_at(13.0) == 2.0
    assert cal.factor_at(15.0) == pytest.approx(1.75)
    assert cal.factor_at(17.0) == pytest.approx(1.625)
    assert cal.factor_at(1000.0) == pytest.approx(1.5)
    cal.observe(delay_s=0.01, budget_s=0.1, expected_s=0.01, now_s=15.0)  # 17.5 ms: budget to spare
    assert cal.set_s == 10.0 and cal.factor_at(15.0) == pytest.approx(1.75)
    cal.observe(delay_s=0.05, budget_s=0.1, expected_s=0.04, now_s=15.0)  # 1.75 x 40 ms: a close call
    assert cal.set_s == 15.0 and cal.last_miss_s == 10.0 and cal.factor == pytest.approx(1.75 * (1 - DOWN))
    assert cal.factor_at(17.0) == pytest.approx(1.5 + (1.75 * (1 - DOWN) - 1.5) / 2)  # relaxing on
    cal.observe(delay_s=0.2, budget_s=0.1, expected_s=0.04, now_s=17.0)  # a miss holds it for 3 s again
    assert cal.last_miss_s == 17.0 and cal.factor_at(19.9) == cal.factor
    assert cal.factor_at(22.0) == pytest.approx(1.5 + (cal.factor - 1.5) / 2)
    low = DelayCalibration(factor=1.0, set_s=0.0)  # it relaxes up towards the start as well
    assert low.factor_at(2.0) == pytest.approx(1.25)


def test_close_calls_at_moderate_load_let_a_raised_factor_come_down() -> None:
    """A factor of 2.6 left by an overload, then a steady stream of close calls that make their budget (the
    raised factor predicts them at 60% of it) and no miss: within 10 s it is back under 1.6."""
    cal = DelayCalibration(factor=2.6, last_miss_s=0.0, set_s=0.0)
    for i in range(3000):  # 300 close calls a second for 10 s
        now_s = i / 300
        cal.observe(delay_s=0.03, budget_s=0.09, expected_s=0.09 * 0.6 / cal.factor_at(now_s), now_s=now_s)
    assert cal.misses == 0 and cal.close_calls == 3000
    assert cal.factor_at(10.0) < 1.6


def test_the_current_factor_for_the_refusal_check_is_the_relaxed_one() -> None:
    """At 4.0 a request predicted at 30 ms x 4 = 120 ms would be refused and say nothing; 20 s of relaxing later
    the factor is ~1.5, it would be admitted, and its miss raises the relaxed value."""
    cal = DelayCalibration(factor=4.0, last_miss_s=0.0, set_s=0.0)
    cal.observe(delay_s=0.2, budget_s=0.1, expected_s=0.03, now_s=0.5)
    assert cal.misses == 0 and cal.factor == 4.0
    cal.observe(delay_s=0.2, budget_s=0.1, expected_s=0.03, now_s=23.0)
    assert cal.misses == 1 and cal.factor == pytest.approx(cal.factor_at(23.0))
    assert cal.factor == pytest.approx((1.5 + 2.5 * 2 ** -10) * 1.05)
