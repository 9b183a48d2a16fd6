"""The server-side drift feed: reference files, sampling off the event loop, shared metrics per model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from headroom.lifecycle.digits_reference import write_drift_reference
from headroom.lifecycle.drift import DriftConfig, fit_reference
from headroom.lifecycle.drift_feed import (
    REFERENCE_FILE,
    DriftFeed,
    DriftFeedConfig,
    load_reference,
    resolve_features,
    save_reference,
)
from headroom.models.builtin.digits_build import DigitsTrainingConfig, held_out_split
from headroom.models.builtin.digits_drift import FEATURE_NAMES, summary_features


def _version_with_reference(root: Path, name: str) -> Path:
    rng = np.random.default_rng(0)
    version_dir = root / name / "1"
    version_dir.mkdir(parents=True)
    save_reference(version_dir / REFERENCE_FILE, fit_reference(rng.normal(size=(2000, 3))), "x")
    return version_dir


def test_reference_files_round_trip_and_bad_ones_say_how_to_fix(tmp_path: Path) -> None:
    version_dir = _version_with_reference(tmp_path, "m")
    served = load_reference(version_dir / REFERENCE_FILE)
    assert served.input_name == "x" and served.features == "flatten"
    assert served.reference.feature_names == ("f0", "f1", "f2") and served.reference.edges.shape == (3, 11)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="build-models"):
        load_reference(tmp_path / "bad.npz")
    with pytest.raises(ValueError, match="module:function"):
        resolve_features("nonsense")


def test_feed_samples_requests_and_exports_psi_per_model(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    cfg = DriftFeedConfig(sample_every=2, monitor=DriftConfig(window_rows=1000, min_rows=100, threshold_psi=0.2))
    feed = DriftFeed(cfg, registry)
    a, b = _version_with_reference(tmp_path, "a"), _version_with_reference(tmp_path, "b")
    plain = tmp_path / "plain" / "1"
    plain.mkdir(parents=True)
    rng = np.random.default_rng(1)
    try:
        for _ in range(20):  # 20 requests of 50 rows each; every 2nd is sampled -> 500 rows per model
            feed.offer("a", a, {"x": rng.normal(size=(50, 3))})
            feed.offer("b", b, {"x": rng.normal(size=(50, 3)) + 3.0})  # shifted
            feed.offer("plain", plain, {"x": rng.normal(size=(50, 3))})  # no reference: ignored
        feed.flush()
        low = registry.get_sample_value("headroom_input_drift_psi_mean", {"model": "a"})
        high = registry.get_sample_value("headroom_input_drift_psi_mean", {"model": "b"})
        assert low is not None and high is not None and low < 0.2 < high
        assert registry.get_sample_value("headroom_input_drift_alerts_total", {"model": "b"}) == 1
        assert registry.get_sample_value("headroom_input_drift_alerts_total", {"model": "a"}) == 0
        monitor = feed.monitor("a")
        status = monitor.observe(np.zeros((0, 3))) if monitor is not None else None
        assert status is not None and status.rows == 500
        assert feed.monitor("plain") is None
    finally:
        feed.close()


def test_digits_reference_separates_held_out_from_inverted_images(tmp_path: Path) -> None:
    path = write_drift_reference(tmp_path)
    served = load_reference(path)
    assert served.reference.feature_names == FEATURE_NAMES and path.stat().st_size < 10_000
    features = resolve_features(served.features)
    _, _, x_test, _ = held_out_split(DigitsTrainingConfig())
    assert features(x_test[:3]).tolist() == summary_features(x_test[:3]).tolist()
    from headroom.lifecycle.drift import psi

    assert psi(served.reference, features(x_test)).mean() < 0.1
    assert psi(served.reference, features(16.0 - x_test)).mean() > 1.0
