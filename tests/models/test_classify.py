"""Top-k postprocessing (listing 1) independent of any model."""

from __future__ import annotations

import numpy as np
import pytest

from headroom.core.errors import InvalidRequest
from headroom.models.classification import Prediction, classification_response, top_k_predictions

LABELS = ["cat", "dog", "fox", "owl"]


def test_top_k_is_sorted_and_labelled() -> None:
    got = top_k_predictions(np.array([0.1, 0.6, 0.05, 0.25]), LABELS, top_k=2)
    assert [(p.label, p.index) for p in got] == [("dog", 1), ("owl", 3)]
    assert [p.confidence for p in got] == pytest.approx([0.6, 0.25])
    assert all(isinstance(p, Prediction) for p in got)


def test_threshold_drops_unconfident_classes_and_can_abstain() -> None:
    probs = np.array([0.1, 0.6, 0.05, 0.25])
    assert [p.label for p in top_k_predictions(probs, LABELS, top_k=4, min_confidence=0.2)] == ["dog", "owl"]
    assert top_k_predictions(probs, LABELS, top_k=4, min_confidence=0.9) == []
    body = classification_response([], "m", "2", 1.5)
    assert body == {
        "predictions": [],
        "abstained": True,
        "model_name": "m",
        "model_version": "2",
        "inference_time_ms": 1.5,
    }


def test_ties_keep_class_order() -> None:
    assert [p.index for p in top_k_predictions(np.full(4, 0.25), LABELS, top_k=3)] == [0, 1, 2]


@pytest.mark.parametrize(("top_k", "threshold"), [(0, 0.0), (1, -0.1), (1, 1.5)])
def test_bad_arguments_are_bad_requests(top_k: int, threshold: float) -> None:
    with pytest.raises(InvalidRequest):
        top_k_predictions(np.full(4, 0.25), LABELS, top_k=top_k, min_confidence=threshold)
