"""Input-drift monitor on digits: shifted inputs push PSI over the threshold, in-distribution ones stay under."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from headroom.lifecycle.drift import DriftConfig, DriftMonitor, fit_reference, psi
from headroom.models.builtin.digits_build import DigitsTrainingConfig, held_out_split


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    """(training images, held-out images) as raw wire pixels [N, 8, 8] in 0..16."""
    x_train, _, x_test, _ = held_out_split(DigitsTrainingConfig())
    return x_train, x_test


def test_psi_is_zero_on_the_reference_itself_and_large_for_a_shift() -> None:
    rng = np.random.default_rng(0)
    train = rng.normal(0.0, 1.0, size=(5000, 3))
    reference = fit_reference(train, num_bins=10, feature_names=["a", "b", "c"])
    assert np.allclose(psi(reference, train), 0.0)
    shifted = train + np.array([0.0, 1.0, 3.0])
    values = psi(reference, shifted)
    assert values[0] == pytest.approx(0.0, abs=1e-9)
    assert 0.2 < values[1] < values[2]


def test_constant_features_and_bad_shapes(digits: tuple[np.ndarray, np.ndarray]) -> None:
    x_train, _ = digits
    reference = fit_reference(x_train)  # corners of the digits are always 0: constant features
    assert reference.edges.shape == (64, 11) and np.allclose(reference.expected.sum(axis=1), 1.0)
    with pytest.raises(ValueError, match="64 features"):
        psi(reference, np.zeros((10, 63)))
    with pytest.raises(ValueError, match="at least 2 rows"):
        fit_reference(np.zeros((1, 4)))


def test_in_distribution_digits_stay_under_the_threshold(digits: tuple[np.ndarray, np.ndarray]) -> None:
    x_train, x_test = digits
    registry = CollectorRegistry()
    monitor = DriftMonitor("digits", fit_reference(x_train), DriftConfig(window_rows=400, min_rows=100), registry)
    statuses = [monitor.observe(x_test[i : i + 40]) for i in range(0, len(x_test), 40)]
    assert statuses[0] is None and statuses[1] is None  # fewer than min_rows rows: no verdict yet
    final = statuses[-1]
    assert final is not None and final.rows == len(x_test)
    assert not final.drifting and final.psi_mean < 0.2
    assert registry.get_sample_value("headroom_input_drift_psi_mean", {"model": "digits"}) == pytest.approx(
        final.psi_mean
    )
    assert registry.get_sample_value("headroom_input_drift_alerts_total", {"model": "digits"}) == 0.0


@pytest.mark.parametrize(
    "shift",
    [
        lambda x: np.roll(x, 2, axis=2),  # digits drawn off-centre
        lambda x: x * 0.6,  # a camera that is darker than the scanner used for training
        lambda x: 16.0 - x,  # an inverted upstream conversion (dark ink on light paper)
    ],
    ids=["translated", "dimmed", "inverted"],
)
def test_shifted_digits_raise_psi_over_the_threshold_and_warn_once(
    digits: tuple[np.ndarray, np.ndarray], shift: object, caplog: pytest.LogCaptureFixture
) -> None:
    x_train, x_test = digits
    registry = CollectorRegistry()
    monitor = DriftMonitor("digits", fit_reference(x_train), DriftConfig(window_rows=200, min_rows=100), registry)
    assert callable(shift)
    shifted = np.asarray(shift(x_test))
    with caplog.at_level(logging.WARNING, logger="headroom.lifecycle.drift"):
        statuses = [monitor.observe(shifted[i : i + 50]) for i in range(0, len(shifted), 50)]
    final = statuses[-1]
    assert final is not None and final.drifting and final.psi_mean > 0.2
    assert len([r for r in caplog.records if "input drift" in r.getMessage()]) == 1
    assert registry.get_sample_value("headroom_input_drift_alerts_total", {"model": "digits"}) == 1.0
    worst = registry.get_sample_value("headroom_input_drift_psi", {"model": "digits", "feature": "f0"})
    assert worst is not None


def test_window_recovers_when_traffic_returns_to_normal(digits: tuple[np.ndarray, np.ndarray]) -> None:
    x_train, x_test = digits
    monitor = DriftMonitor("digits", fit_reference(x_train), DriftConfig(window_rows=150, min_rows=100))
    drifting = monitor.observe(np.roll(x_test[:150], 2, axis=2))
    assert drifting is not None and drifting.drifting
    recovered = monitor.observe(x_test[150:])
    assert recovered is not None and recovered.rows == 150 and not recovered.drifting
