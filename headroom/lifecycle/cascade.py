"""Precision cascade: serve the INT8 model, recompute in FP32 exactly the items it is unsure about.

The decision is a pure function of the fast model's per-item confidence and the threshold τ
(`recompute_mask`); `CascadeModel` is the thin mechanism around it: it holds both models, implements the
Model contract (pre/post-processing are the fast model's), and counts what it did.

    cascade = CascadeModel(fast=int8_model, accurate=fp32_model, tau=0.9)
    outputs = cascade.predict(batch)        # rows with max probability < 0.9 come from FP32
    cascade.counts()                        # CascadeCounts(batches=..., items=..., recomputed=...)

As a served model: `parameters.model_class: headroom.lifecycle.cascade:DigitsCascadeModel` with
`fast_model_file: model.int8.onnx`, `accurate_model_file: model.onnx`, `cascade_tau: 0.9`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from headroom.models.artifacts import ModelLoadError
from headroom.models.base import Arrays, LoadContext, Model
from headroom.models.builtin.digits import DigitsModel

Confidence = Callable[[Arrays], np.ndarray]  # model outputs -> one confidence in [0, 1] per row


def top1_confidence(output: str = "probabilities") -> Confidence:
    """Confidence = the largest class probability of each row of `output`."""

    def confidence(outputs: Arrays) -> np.ndarray:
        return np.asarray(np.max(outputs[output], axis=-1), dtype=np.float64)

    return confidence


def recompute_mask(confidence: np.ndarray, tau: float) -> np.ndarray:
    """Which items go to the accurate model: confidence strictly below τ (NaN counts as unsure). Pure."""
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"the cascade threshold tau must be within 0..1, got {tau}")
    conf = np.asarray(confidence, dtype=np.float64)
    return np.asarray(~(conf >= tau), dtype=bool)


@dataclass(frozen=True, slots=True)
class CascadeCounts:
    """What the cascade did since it was created (exported as metrics by the server)."""

    batches: int  # predict() calls
    items: int  # rows served
    recomputed: int  # rows recomputed by the accurate (FP32) model

    @property
    def recompute_fraction(self) -> float:
        """Share of rows that needed FP32 (0 when nothing was served yet)."""
        return self.recomputed / self.items if self.items else 0.0


class CascadeModel(Model):
    """Runs `fast` on the batch, then `accurate` on exactly the rows whose confidence is below `tau`."""

    def __init__(self, fast: Model, accurate: Model, tau: float, confidence: Confidence | None = None) -> None:
        super().__init__(fast.config)
        recompute_mask(np.zeros(0), tau)  # validates tau
        self.fast, self.accurate, self.tau = fast, accurate, tau
        self.confidence = confidence or top1_confidence()
        self._lock = threading.Lock()
        self._counts = CascadeCounts(0, 0, 0)

    def load(self, ctx: LoadContext) -> None:
        self.fast.load(ctx)
        self.accurate.load(ctx)

    def warmup_inputs(self, batch_size: int) -> Arrays:
        return self.fast.warmup_inputs(batch_size)

    def preprocess(self, inputs: Arrays, parameters: Mapping[str, object]) -> Arrays:
        return self.fast.preprocess(inputs, parameters)

    def collate(self, items: Sequence[Arrays]) -> Arrays:
        return self.fast.collate(items)

    def predict(self, batch: Arrays) -> Arrays:
        outputs = {k: np.array(v, copy=True) for k, v in self.fast.predict(batch).items()}
        mask = recompute_mask(self.confidence(outputs), self.tau)
        rows = int(mask.sum())
        if rows:
            redo = self.accurate.predict({k: v[mask] for k, v in batch.items()})
            for name, value in outputs.items():
                value[mask] = redo[name]
        with self._lock:
            c = self._counts
            self._counts = CascadeCounts(c.batches + 1, c.items + len(mask), c.recomputed + rows)
        return outputs

    def split(self, outputs: Arrays, sizes: Sequence[int]) -> list[Arrays]:
        return self.fast.split(outputs, sizes)

    def postprocess(self, outputs: Arrays, parameters: Mapping[str, object]) -> Arrays:
        return self.fast.postprocess(outputs, parameters)

    def request_batch_size(self, inputs: Arrays) -> int:
        return self.fast.request_batch_size(inputs)

    def batch_key(self, inputs: Arrays) -> tuple[object, ...]:
        return self.fast.batch_key(inputs)

    def counts(self) -> CascadeCounts:
        with self._lock:
            return self._counts

    def unload(self) -> None:
        self.fast.unload()
        self.accurate.unload()


class DigitsCascadeModel(DigitsModel):
    """digits served as a cascade (loadable through `parameters.model_class`): INT8 first, FP32 when unsure.

    Parameters: `fast_model_file` (default model.int8.onnx), `accurate_model_file` (default model.onnx),
    `cascade_tau` (default 0.9), plus the usual onnxruntime ones, shared by both sessions.
    """

    cascade: CascadeModel | None = None

    def load(self, ctx: LoadContext) -> None:
        params = dict(self.config.parameters)
        tau = params.get("cascade_tau", 0.9)
        if not isinstance(tau, int | float) or not 0.0 <= float(tau) <= 1.0:
            raise ModelLoadError(f"model {self.config.name!r}.parameters.cascade_tau: a number in 0..1, got {tau!r}")
        fast_file = str(params.get("fast_model_file", "model.int8.onnx"))
        accurate_file = str(params.get("accurate_model_file", "model.onnx"))
        fast = DigitsModel(dataclasses.replace(self.config, parameters={**params, "model_file": fast_file}))
        accurate = DigitsModel(dataclasses.replace(self.config, parameters={**params, "model_file": accurate_file}))
        cascade = CascadeModel(fast, accurate, float(tau))
        cascade.load(ctx)
        self.labels = fast.labels
        self.cascade = cascade

    def predict(self, batch: Arrays) -> Arrays:
        if self.cascade is None:
            raise RuntimeError(f"model {self.config.name!r} used before load()")
        return self.cascade.predict(batch)

    def unload(self) -> None:
        if self.cascade is not None:
            self.cascade.unload()
        self.cascade = None
