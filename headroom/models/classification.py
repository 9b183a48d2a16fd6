"""Classifier postprocessing (the textbook's listing 1): probabilities -> top-k labelled predictions.

A model that can take raw image bytes implements `ImageClassifier`; the server's raw-image route then runs

    inputs  = model.image_inputs(body)                  # decode + shared transform -> a V2-shaped request
    outputs = <the normal batched pipeline>(inputs)     # preprocess, batch, predict, postprocess
    body    = classification_response(model.classify(outputs, top_k, min_confidence), version, elapsed_ms)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from headroom.core.errors import InvalidRequest
from headroom.models.base import Arrays


@dataclass(frozen=True, slots=True)
class Prediction:
    """One labelled class of a classification result."""

    label: str  # human-readable class name
    index: int  # class index in the model's output
    confidence: float  # probability in 0..1


@runtime_checkable
class ImageClassifier(Protocol):
    """A model that accepts encoded images and reports labelled classes."""

    def image_inputs(self, data: bytes) -> Arrays:
        """Decode image bytes into one request's wire inputs (batch dimension 1); InvalidRequest if bad."""
        ...

    def classify(self, outputs: Arrays, top_k: int, min_confidence: float) -> list[Prediction]:
        """The top-k predictions of one image's (postprocessed) outputs."""
        ...


def top_k_predictions(
    probabilities: np.ndarray, labels: Sequence[str], top_k: int = 5, min_confidence: float = 0.0
) -> list[Prediction]:
    """Highest-probability classes first, at most `top_k`, dropping those below `min_confidence`."""
    if top_k < 1:
        raise InvalidRequest(f"top_k must be >= 1, got {top_k}")
    if not 0.0 <= min_confidence <= 1.0:
        raise InvalidRequest(f"min_confidence must be within 0..1, got {min_confidence}")
    probs = np.asarray(probabilities, dtype=np.float64).reshape(-1)
    if len(probs) != len(labels):
        raise ValueError(f"{len(probs)} probabilities but {len(labels)} labels")
    order = np.argsort(-probs, kind="stable")[:top_k]
    return [
        Prediction(label=labels[i], index=int(i), confidence=float(probs[i]))
        for i in order
        if probs[i] >= min_confidence
    ]


def classification_response(
    predictions: Sequence[Prediction], model_name: str, model_version: str, inference_time_ms: float
) -> dict[str, object]:
    """The JSON body of listing 1; `abstained` is true when no class reached the confidence threshold."""
    return {
        "predictions": [{"label": p.label, "confidence": p.confidence} for p in predictions],
        "abstained": not predictions,
        "model_name": model_name,
        "model_version": model_version,
        "inference_time_ms": inference_time_ms,
    }
