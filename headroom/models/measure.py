"""Measure a repository model's own speed, without the server: `python -m headroom.models.measure`.

For each batch size it runs the full per-batch pipeline (preprocess, collate, predict, split,
postprocess) on the model's warmup inputs for a fixed time and reports items/s and per-batch latency.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from headroom.models.base import Model
from headroom.models.repository import ModelRepository


@dataclass(frozen=True, slots=True)
class SpeedResult:
    """Throughput of one model at one batch size."""

    batch_size: int  # items per call
    calls: int  # pipeline calls measured
    items_per_s: float  # batch_size * calls / elapsed
    p50_ms: float  # median wall time of one call
    predict_p50_ms: float  # median wall time of predict() alone


def measure(model: Model, batch_size: int, duration_s: float, min_calls: int = 5) -> SpeedResult:
    """Time the pipeline at `batch_size` for about `duration_s` seconds (at least `min_calls` calls)."""
    inputs = model.warmup_inputs(batch_size)
    totals: list[float] = []
    predicts: list[float] = []
    start = time.monotonic()
    while len(totals) < min_calls or time.monotonic() - start < duration_s:
        t0 = time.monotonic()
        items = [model.preprocess(inputs, {})]
        batch = model.collate(items)
        t1 = time.monotonic()
        outputs = model.predict(batch)
        t2 = time.monotonic()
        for part in model.split(outputs, [model.request_batch_size(items[0])]):
            model.postprocess(part, {})
        totals.append(time.monotonic() - t0)
        predicts.append(t2 - t1)
    elapsed = sum(totals)
    totals.sort()
    predicts.sort()
    return SpeedResult(
        batch_size=batch_size,
        calls=len(totals),
        items_per_s=batch_size * len(totals) / elapsed,
        p50_ms=totals[len(totals) // 2] * 1000,
        predict_p50_ms=predicts[len(predicts) // 2] * 1000,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-repository", type=Path, default=Path("models"), help="repository directory")
    parser.add_argument("--model", required=True, help="model name (directory under the repository)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32], help="batch sizes to time")
    parser.add_argument("--seconds", type=float, default=5.0, help="measuring time per batch size")
    args = parser.parse_args(argv)
    repo = ModelRepository(args.model_repository)
    loaded = repo.load(repo.scan([args.model]))[-1]
    table = Table(title=f"{loaded.name} v{loaded.version} ({loaded.config.backend})")
    for column in ("batch", "calls", "items/s", "p50 ms/call", "predict p50 ms"):
        table.add_column(column, justify="right")
    for size in args.batch_sizes:
        r = measure(loaded.model, size, args.seconds)
        table.add_row(str(size), str(r.calls), f"{r.items_per_s:.1f}", f"{r.p50_ms:.2f}", f"{r.predict_p50_ms:.2f}")
    Console().print(table)
    loaded.unload()


if __name__ == "__main__":
    main()
