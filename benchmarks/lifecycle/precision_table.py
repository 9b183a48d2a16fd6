"""Latency/accuracy table of precision variants on this machine: digits and minilm, FP32 vs INT8 (vs BF16).

    .venv/bin/python benchmarks/lifecycle/precision_table.py [--models-dir models] [--repeats 200]

Quantizes into a temporary copy (the repository is not touched), runs every variant through the accuracy gate,
times `session.run` per batch size with one intra-op thread (median and p99 of `--repeats` calls after
warmup), and writes benchmarks/results/lifecycle/precision-<UTC time>.json plus a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import onnxruntime as ort
import torch
from safetensors.torch import load_file

from headroom.lifecycle.int8_builtin import (
    MiniLMFeeds,
    digits_bf16_accuracy,
    gate_digits_bf16,
    minilm_sentences,
    quantize_digits,
    quantize_minilm,
)
from headroom.lifecycle.quantize import AccuracyGateError, QuantizeConfig
from headroom.models.artifacts import resolve_artifact
from headroom.models.builtin.digits_build import DigitsTrainingConfig, held_out_split
from headroom.models.builtin.digits_net import DigitsNet
from headroom.models.builtin.digits_transform import to_model_input
from headroom.models.builtin.minilm import DEFAULT_WEIGHTS

RESULTS = Path(__file__).resolve().parents[1] / "results" / "lifecycle"


def machine() -> dict[str, object]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "onnxruntime": ort.__version__,
        "torch": torch.__version__,
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def timed_ms(call: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(median, p99) milliseconds of `repeats` calls after 5 warmup calls."""
    for _ in range(5):
        call()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1000.0)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(0.99 * len(samples)))]


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def digits_rows(version_dir: Path, repeats: int) -> list[dict[str, object]]:
    _, _, x_test, y_test = held_out_split(DigitsTrainingConfig())
    x = to_model_input(x_test)
    rows: list[dict[str, object]] = []
    variants: dict[str, tuple[Path, float]] = {}
    fp32_acc = float((session(version_dir / "model.onnx").run(None, {"input": x})[0].argmax(1) == y_test).mean())
    variants["fp32"] = (version_dir / "model.onnx", fp32_acc)
    for mode in ("static", "dynamic"):
        report = quantize_digits(version_dir, QuantizeConfig(mode=mode), out_file=f"int8-{mode}.onnx")
        assert report.path is not None
        variants[f"int8-{mode}"] = (report.path, report.gate.candidate)
    for name, (path, accuracy) in variants.items():
        sess = session(path)
        for batch in (1, 32):
            feed = {"input": x[:batch]}
            median, p99 = timed_ms(functools.partial(sess.run, None, feed), repeats)
            rows.append(
                {
                    "model": "digits",
                    "precision": name,
                    "runtime": "onnxruntime",
                    "batch_size": batch,
                    "metric": "accuracy",
                    "value": accuracy,
                    "p50_ms": median,
                    "p99_ms": p99,
                    "file_bytes": path.stat().st_size,
                }
            )
    gate_digits_bf16(version_dir)
    bf16_acc = digits_bf16_accuracy(version_dir, x_test, y_test)
    cfg = DigitsTrainingConfig()
    net = DigitsNet(cfg.channels, cfg.hidden)
    net.load_state_dict(load_file(str(version_dir / "model.safetensors")))
    torch.set_num_threads(1)  # like the onnxruntime sessions: one intra-op thread
    for dtype, label in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        module = net.to(dtype).eval()
        for batch in (1, 32):
            tensor = torch.from_numpy(x[:batch]).to(dtype)
            with torch.inference_mode():
                median, p99 = timed_ms(functools.partial(module, tensor), repeats)
            rows.append(
                {
                    "model": "digits",
                    "precision": label,
                    "runtime": "torch eager (1 thread)",
                    "batch_size": batch,
                    "metric": "accuracy",
                    "value": bf16_acc if label == "bf16" else fp32_acc,
                    "p50_ms": median,
                    "p99_ms": p99,
                    "file_bytes": None,
                }
            )
    return rows


def minilm_rows(version_dir: Path, repeats: int) -> list[dict[str, object]]:
    weights = resolve_artifact(DEFAULT_WEIGHTS, version_dir, "minilm")
    rows: list[dict[str, object]] = []
    variants: dict[str, tuple[Path, float]] = {"fp32": (version_dir / "model.onnx", 1.0)}
    report = quantize_minilm(version_dir, weights)
    assert report.path is not None
    variants["int8-dynamic"] = (report.path, report.gate.candidate)
    try:
        quantize_minilm(version_dir, weights, QuantizeConfig("static", True, ("MatMul",)), out_file="static.onnx")
    except AccuracyGateError as exc:
        print(f"minilm int8-static: {exc}")
    feeds = MiniLMFeeds(weights)
    sentences = minilm_sentences(8, seed=2)
    for name, (path, cosine) in variants.items():
        sess = session(path)
        for batch in (1, 8):
            feed = feeds(sentences[:batch])
            median, p99 = timed_ms(functools.partial(sess.run, None, feed), max(repeats // 4, 20))
            rows.append(
                {
                    "model": "minilm",
                    "precision": name,
                    "runtime": "onnxruntime",
                    "batch_size": batch,
                    "metric": "cosine_to_fp32",
                    "value": cosine,
                    "p50_ms": median,
                    "p99_ms": p99,
                    "file_bytes": path.stat().st_size,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models-dir", type=Path, default=Path("models"), help="repository with built models")
    parser.add_argument("--repeats", type=int, default=200, help="timed calls per cell (minilm uses a quarter)")
    parser.add_argument("--skip-minilm", action="store_true", help="digits only (fast)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        digits_dir = Path(tmp) / "digits"
        shutil.copytree(args.models_dir / "digits" / "1", digits_dir)
        rows = digits_rows(digits_dir, args.repeats)
        if not args.skip_minilm:
            minilm_dir = Path(tmp) / "minilm"
            minilm_dir.mkdir()
            (minilm_dir / "model.onnx").symlink_to((args.models_dir / "minilm" / "1" / "model.onnx").resolve())
            rows += minilm_rows(minilm_dir, args.repeats)
    result = {"benchmark": "precision", "machine": machine(), "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"precision-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("| model | precision | runtime | batch | quality | p50 ms | p99 ms | file MB |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        size = f"{r['file_bytes'] / 1e6:.2f}" if r["file_bytes"] else "-"  # type: ignore[operator]
        print(
            f"| {r['model']} | {r['precision']} | {r['runtime']} | {r['batch_size']} | {r['metric']} "
            f"{r['value']:.4f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {size} |"
        )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
