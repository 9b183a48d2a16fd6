"""Warmup: run every configured batch size once through the whole per-batch pipeline before serving.

Warmup also checks the model's contract on real data: after postprocess every declared output must be
present with the request's leading size, so a misnamed output fails the load instead of the first request.
"""

from __future__ import annotations

import time

from headroom.models.artifacts import ModelLoadError
from headroom.models.base import Arrays, Model


def warmup_batch_sizes(model: Model) -> tuple[int, ...]:
    """The configured warmup sizes, clipped to what the model accepts (1 for a non-batching model)."""
    cap = model.config.max_batch_size
    if cap == 0:
        return (1,)
    sizes = sorted({min(max(b, 1), cap) for b in model.config.warmup.batch_sizes})
    return tuple(sizes) or (1,)


def run_pipeline(model: Model, inputs: Arrays) -> Arrays:
    """preprocess -> collate -> predict -> split -> postprocess for one request, as the batcher runs it."""
    item = model.preprocess(inputs, {})
    batch = model.collate([item])
    outputs = model.predict(batch)
    (part,) = model.split(outputs, [model.request_batch_size(item)])
    return model.postprocess(part, {})


def run_warmup(model: Model) -> tuple[tuple[int, float], ...]:
    """Execute each warmup batch size once; returns (size, seconds the whole pipeline took) per size run, the
    batcher's first service-time estimate. Raises ModelLoadError on a bad contract."""
    sizes = warmup_batch_sizes(model)
    runs: list[tuple[int, float]] = []
    for size in sizes:
        start_s = time.monotonic()
        result = run_pipeline(model, model.warmup_inputs(size))
        runs.append((size, time.monotonic() - start_s))
        missing = [spec.name for spec in model.config.outputs if spec.name not in result]
        if missing:
            raise ModelLoadError(
                f"model {model.config.name!r}: warmup produced outputs {sorted(result)} but config.yaml "
                f"declares {missing}; make the outputs' names in config.yaml match what the model returns"
            )
        if model.config.max_batch_size > 0:
            wrong = {k: v.shape for k, v in result.items() if v.ndim == 0 or v.shape[0] != size}
            if wrong:
                raise ModelLoadError(
                    f"model {model.config.name!r}: at warmup batch size {size} outputs {wrong} do not have "
                    f"{size} rows; a batching model must return one row per input row"
                )
    return tuple(runs)
