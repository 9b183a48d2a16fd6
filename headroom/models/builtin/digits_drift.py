"""digits' training reference for the input-drift monitor: a few summary statistics per image.

Eight features per 8×8 image (raw wire scale 0..16, bright ink), cheap to compute and easy to read on a
dashboard: mean intensity, contrast (std), ink share (pixels > 8), brightest pixel, the ink's centre of mass
(row, column) and its share in the top and left halves. Inverted or dimmed images move the first four, shifted
or mirrored ones the last four.

The reference itself is fitted and written by `headroom.lifecycle.digits_reference.write_drift_reference`
(the drift monitor's code); this module only holds the features, which the server finds by FEATURES_SPEC.
"""

from __future__ import annotations

import numpy as np

FEATURE_NAMES = ("mean", "std", "ink_share", "max", "row_centre", "col_centre", "top_share", "left_share")
FEATURES_SPEC = "headroom.models.builtin.digits_drift:summary_features"  # how the server finds the function
NUM_BINS = 10  # histogram bins per feature


def summary_features(images: np.ndarray) -> np.ndarray:
    """[N, 8, 8] (or [N, 1, 8, 8]) raw pixels -> [N, 8] summary features (see FEATURE_NAMES)."""
    x = np.asarray(images, dtype=np.float64).reshape(len(images), 8, 8)
    flat = x.reshape(len(x), -1)
    mass = np.maximum(flat.sum(axis=1), 1e-9)
    idx = np.arange(8, dtype=np.float64)
    rows = x.sum(axis=2) @ idx / mass
    cols = x.sum(axis=1) @ idx / mass
    top = x[:, :4, :].reshape(len(x), -1).sum(axis=1) / mass
    left = x[:, :, :4].reshape(len(x), -1).sum(axis=1) / mass
    return np.stack([flat.mean(axis=1), flat.std(axis=1), (flat > 8).mean(axis=1), flat.max(axis=1),
                     rows, cols, top, left], axis=1)
