"""The Model contract every backend implements, and the load-time context it receives.

Call order and threads:
  load()                          once, in a worker thread; report cold-start stages through `ctx.stage`
  warmup_inputs(batch_size)       at load, per warmup batch size: one request's wire inputs (synthetic)
  preprocess(inputs, params)      per request, in a worker thread, overlapping the running batch
  collate(items) -> batch         per batch: join preprocessed requests (default: concat on axis 0)
  predict(batch) -> outputs       per batch, in a worker thread; the only call that sees the whole batch
  split(outputs, sizes) -> items  per batch: cut outputs back into per-request pieces (default: axis 0)
  postprocess(outputs, params)    per request, in a worker thread
  unload()                        once

Every per-request array has the request's own batch dimension first when the model batches
(`max_batch_size > 0`). Bad input raises `InvalidRequest` from preprocess, never from predict.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from headroom.core.types import V2_TO_NUMPY
from headroom.models.config import ModelConfig

Arrays = Mapping[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class ColdStartStage:
    """One timed stage of loading a model."""

    name: str  # "read_weights", "build_session", "warmup", ...
    duration_s: float  # wall time the stage took


class LoadContext:
    """What a model gets at load time: its config, its version directory, and a stage timer."""

    def __init__(self, config: ModelConfig, version_dir: Path, on_stage: Callable[[ColdStartStage], None]):
        self.config = config
        self.version_dir = version_dir
        self._on_stage = on_stage

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time a cold-start stage: `with ctx.stage("read_weights"): ...`."""
        start = time.monotonic()
        try:
            yield
        finally:
            self._on_stage(ColdStartStage(name=name, duration_s=time.monotonic() - start))


class Model:
    """Base class with pass-through defaults; backends override what they need.

    `cheap_preprocess = True` tells the batcher that `preprocess` is cheap enough (microseconds) to run on the
    event loop instead of hopping to a worker thread (minilm: UTF-8 decode only; tokenising is in `collate`).
    """

    cheap_preprocess: bool = False  # run preprocess inline on the event loop (no thread hop)

    def __init__(self, config: ModelConfig) -> None:
        self.config = config

    def load(self, ctx: LoadContext) -> None:
        """Read weights and build the runtime. Raise to fail the load (the old version keeps serving)."""

    def warmup_inputs(self, batch_size: int) -> Arrays:
        """Synthetic wire inputs for one request of `batch_size` items, built from the declared input specs.

        Variable dimensions (-1) become 1, numbers are zeros, BYTES are b"warmup". Override when zeros are
        not a valid input (e.g. a text model that wants real sentences).
        """
        lead = (batch_size,) if self.config.max_batch_size > 0 else ()
        arrays: dict[str, np.ndarray] = {}
        for spec in self.config.inputs:
            shape = lead + tuple(1 if d == -1 else d for d in spec.shape)
            dtype = V2_TO_NUMPY[spec.datatype]
            if spec.datatype == "BYTES":
                arrays[spec.name] = np.full(shape, b"warmup", dtype=object)
            else:
                arrays[spec.name] = np.zeros(shape, dtype=dtype)
        return arrays

    def preprocess(self, inputs: Arrays, parameters: Mapping[str, object]) -> Arrays:
        """Per-request transform of decoded wire tensors into model inputs."""
        return inputs

    def collate(self, items: Sequence[Arrays]) -> Arrays:
        """Join per-request model inputs into one batch (default: concatenate along axis 0)."""
        if len(items) == 1:
            return items[0]
        return {k: np.concatenate([it[k] for it in items], axis=0) for k in items[0]}

    def predict(self, batch: Arrays) -> Arrays:
        """The batched model call."""
        raise NotImplementedError

    def split(self, outputs: Arrays, sizes: Sequence[int]) -> list[Arrays]:
        """Cut batched outputs back into per-request pieces of the given leading sizes."""
        if len(sizes) == 1:
            return [outputs]
        bounds = np.cumsum(sizes)[:-1]
        parts = {k: np.split(v, bounds, axis=0) for k, v in outputs.items()}
        return [{k: parts[k][i] for k in outputs} for i in range(len(sizes))]

    def postprocess(self, outputs: Arrays, parameters: Mapping[str, object]) -> Arrays:
        """Per-request transform of model outputs into wire tensors."""
        return outputs

    def batch_key(self, inputs: Arrays) -> tuple[object, ...]:
        """Requests share a batch only when their keys are equal (Triton's dynamic batcher): by default each
        preprocessed input's dimensions past the batch one, except inputs the config declares
        `allow_ragged_batch` (their model's `collate` must then join differing sizes itself)."""
        ragged = {s.name for s in self.config.inputs if s.allow_ragged_batch}
        return tuple((name, a.shape[1:]) for name, a in inputs.items() if name not in ragged)

    def request_batch_size(self, inputs: Arrays) -> int:
        """How many batch items one preprocessed request carries (its leading dimension)."""
        if self.config.max_batch_size == 0:
            return 1
        first = next(iter(inputs.values()))
        return int(first.shape[0]) if first.ndim else 1

    def unload(self) -> None:
        """Release runtime resources."""
