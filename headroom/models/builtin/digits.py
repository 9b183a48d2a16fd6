"""The served digits model: ONNX inference framed by the shared transform and top-k postprocessing.

Wire contract (config.yaml): input `input` FP32 [-1, 1, 8, 8] of pixel intensities in 0..16 with bright
ink (scikit-learn's digits scale), output `probabilities` FP32 [-1, 10]. Raw PNG/JPEG bytes come in
through `image_inputs` (see headroom.models.classification) or `classify_image_bytes`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np

from headroom.models.backends.onnx import OnnxModel
from headroom.models.base import Arrays, LoadContext
from headroom.models.builtin.digits_transform import decode_image, to_model_input
from headroom.models.classification import Prediction, classification_response, top_k_predictions
from headroom.models.repository import LoadedModel
from headroom.models.warmup import run_pipeline

DEFAULT_LABELS = tuple(str(d) for d in range(10))  # class i is the digit i


class DigitsModel(OnnxModel):
    """OnnxModel + the digits transform in preprocess + the ImageClassifier protocol."""

    labels: Sequence[str] = DEFAULT_LABELS

    def load(self, ctx: LoadContext) -> None:
        raw = self.config.parameters.get("labels", DEFAULT_LABELS)
        if not isinstance(raw, list | tuple) or len(raw) != 10:
            raise ValueError(f"model {self.config.name!r}: parameters.labels must list 10 class names")
        self.labels = tuple(str(label) for label in raw)
        super().load(ctx)

    def preprocess(self, inputs: Arrays, parameters: Mapping[str, object]) -> Arrays:
        return {"input": to_model_input(inputs["input"])}

    def image_inputs(self, data: bytes) -> Arrays:
        return {"input": decode_image(data)[None, None, :, :]}

    def classify(self, outputs: Arrays, top_k: int, min_confidence: float) -> list[Prediction]:
        return top_k_predictions(outputs["probabilities"][0], self.labels, top_k, min_confidence)


def classify_image_bytes(
    loaded: LoadedModel, data: bytes, top_k: int = 3, min_confidence: float = 0.0
) -> dict[str, object]:
    """Classify one encoded image directly (no batcher): the listing-1 response body."""
    model = loaded.model
    if not isinstance(model, DigitsModel):
        raise TypeError(f"model {loaded.name!r} is not an image classifier")
    start = time.monotonic()
    outputs = run_pipeline(model, model.image_inputs(data))
    elapsed_ms = (time.monotonic() - start) * 1000.0
    return classification_response(
        model.classify(outputs, top_k, min_confidence), loaded.name, loaded.version, elapsed_ms
    )


def predict_digits(loaded: LoadedModel, images: np.ndarray) -> np.ndarray:
    """Predicted digit per image ([N, 8, 8] or [N, 1, 8, 8] in 0..16) through the loaded model's pipeline."""
    x = np.asarray(images, dtype=np.float32).reshape(len(images), 1, 8, 8)
    outputs = run_pipeline(loaded.model, {"input": x})
    return np.asarray(np.argmax(outputs["probabilities"], axis=1))
