"""The built-in digits model's training reference for the input-drift monitor.

`write_drift_reference(version_dir)` fits the histograms of digits' summary features
(`headroom.models.builtin.digits_drift`) on the training split (the same split the model was trained on) and
writes `drift_reference.npz` next to model.onnx; `headroom serve` picks it up.
"""

from __future__ import annotations

from pathlib import Path

from headroom.lifecycle.drift import fit_reference
from headroom.lifecycle.drift_feed import REFERENCE_FILE, save_reference
from headroom.models.builtin.digits_build import DigitsTrainingConfig, held_out_split
from headroom.models.builtin.digits_drift import FEATURE_NAMES, FEATURES_SPEC, NUM_BINS, summary_features


def write_drift_reference(version_dir: Path, cfg: DigitsTrainingConfig | None = None) -> Path:
    """Fit the reference on the training images and write `<version_dir>/drift_reference.npz`."""
    x_train, _, _, _ = held_out_split(cfg or DigitsTrainingConfig())
    reference = fit_reference(summary_features(x_train), NUM_BINS, FEATURE_NAMES)
    path = version_dir / REFERENCE_FILE
    save_reference(path, reference, "input", FEATURES_SPEC)
    return path
