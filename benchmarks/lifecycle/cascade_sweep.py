"""Precision cascade on digits: accuracy and FP32 recompute share as τ varies (INT8 static first, FP32 when unsure).

    .venv/bin/python benchmarks/lifecycle/cascade_sweep.py [--models-dir models]

Quantizes a temporary copy of digits (gated), then for each τ runs the held-out set through `CascadeModel` in
batches of 32 and records accuracy, the recomputed share, and the median batch time (one intra-op thread).
Writes benchmarks/results/lifecycle/cascade-<UTC time>.json and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from headroom.lifecycle.cascade import CascadeModel
from headroom.lifecycle.int8_builtin import quantize_digits
from headroom.lifecycle.quantize import QuantizeConfig
from headroom.models.base import LoadContext
from headroom.models.builtin.digits import DigitsModel
from headroom.models.builtin.digits_build import DigitsTrainingConfig, held_out_split
from headroom.models.config import load_model_config

RESULTS = Path(__file__).resolve().parents[1] / "results" / "lifecycle"
TAUS = (0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 0.999, 1.0)


def loaded(model_dir: Path, model_file: str) -> DigitsModel:
    config = load_model_config(model_dir)
    config = dataclasses.replace(config, parameters={**config.parameters, "model_file": model_file})
    model = DigitsModel(config)
    model.load(LoadContext(config, model_dir / "1", lambda stage: None))
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models-dir", type=Path, default=Path("models"), help="repository with built digits")
    args = parser.parse_args()
    _, _, x_test, y_test = held_out_split(DigitsTrainingConfig())
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "digits"
        shutil.copytree(args.models_dir / "digits", model_dir)
        quantize_digits(model_dir / "1", QuantizeConfig(mode="static"))
        fast, accurate = loaded(model_dir, "model.int8.onnx"), loaded(model_dir, "model.onnx")
        for tau in TAUS:
            cascade = CascadeModel(fast, accurate, tau)
            predictions: list[np.ndarray] = []
            times: list[float] = []
            for _ in range(5):
                predictions = []
                for start in range(0, len(x_test), 32):
                    batch = cascade.preprocess({"input": x_test[start : start + 32, None]}, {})
                    begin = time.perf_counter()
                    out = cascade.predict(batch)
                    times.append((time.perf_counter() - begin) * 1000.0)
                    predictions.append(np.argmax(out["probabilities"], axis=1))
            counts = cascade.counts()
            accuracy = float((np.concatenate(predictions) == y_test).mean())
            rows.append(
                {
                    "tau": tau,
                    "accuracy": accuracy,
                    "recompute_fraction": counts.recompute_fraction,
                    "batch32_p50_ms": statistics.median(times),
                }
            )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out_path = RESULTS / f"cascade-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    doc = {"benchmark": "cascade", "date_utc": datetime.now(UTC).isoformat(timespec="seconds"), "rows": rows}
    out_path.write_text(json.dumps(doc, indent=2) + "\n")
    print("| τ | accuracy | recomputed in FP32 | batch-32 p50 ms |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['tau']} | {r['accuracy']:.4f} | {r['recompute_fraction']:.1%} | {r['batch32_p50_ms']:.3f} |")
    print(f"\nwrote {out_path}")


if __name__ == "__main__":
    main()
