"""INT8 variants of ONNX models (onnxruntime dynamic or static quantization) and the accuracy gate.

    dynamic  weights quantized offline, activation ranges computed per batch at run time (no calibration)
    static   weights and activations quantized offline; activation ranges come from a calibration set of
             representative inputs (QDQ format, MinMax calibration). A calibration set that does not look like
             real traffic (all zeros, one odd sample) gives wrong ranges, and the gate catches it.

The gate is a pure comparison: a variant whose quality metric falls more than `max_loss` below the FP32
reference is refused with `AccuracyGateError`, which says how far it fell and what to do about it.

    cfg = QuantizeConfig(mode="static")
    quantize_onnx(Path("model.onnx"), Path("model.int8.onnx"), cfg, calibration_batches(x_calib, 32))
    enforce_gate(check_gate("accuracy", fp32_acc, int8_acc, max_loss=0.01))
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

QUANT_MODES = ("dynamic", "static")
Feeds = Mapping[str, np.ndarray]  # one batch of graph inputs by name


class AccuracyGateError(ValueError):
    """A precision variant lost more quality than the configured threshold allows; it must not be served."""


@dataclass(frozen=True, slots=True)
class QuantizeConfig:
    """How to produce an INT8 variant."""

    mode: str = "static"  # dynamic | static (static needs a calibration set)
    per_channel: bool = True  # one scale per output channel of each weight (more accurate for convs)
    op_types: tuple[str, ...] = ()  # operator types to quantize; empty = onnxruntime's default set

    def __post_init__(self) -> None:
        if self.mode not in QUANT_MODES:
            raise ValueError(f"quantization mode {self.mode!r} is not one of {', '.join(QUANT_MODES)}")


@dataclass(frozen=True, slots=True)
class GateResult:
    """The accuracy gate's verdict on one variant."""

    metric: str  # what was compared ("accuracy", "cosine_similarity", ...); higher is better
    reference: float  # the FP32 model's value on the held-out set
    candidate: float  # the variant's value on the same set
    loss: float  # reference - candidate (negative when the variant happens to do better)
    max_loss: float  # the largest loss the gate accepts
    passed: bool  # loss <= max_loss


def check_gate(metric: str, reference: float, candidate: float, max_loss: float) -> GateResult:
    """Compare a variant with its FP32 reference (pure). NaN candidates never pass."""
    if max_loss < 0:
        raise ValueError(f"max_loss must be >= 0, got {max_loss}")
    loss = reference - candidate
    passed = bool(np.isfinite(candidate)) and loss <= max_loss
    return GateResult(metric, float(reference), float(candidate), float(loss), float(max_loss), passed)


def enforce_gate(result: GateResult, variant: str = "the INT8 variant") -> GateResult:
    """Return the result when it passed; raise AccuracyGateError explaining the refusal otherwise."""
    if not result.passed:
        raise AccuracyGateError(
            f"{variant} is refused: {result.metric} {result.candidate:.4f} vs FP32 {result.reference:.4f} "
            f"(loss {result.loss:.4f} > allowed {result.max_loss:.4f}). Calibrate on representative inputs "
            f"(real training samples, not zeros or a handful of items), try per-channel or dynamic "
            f"quantization, or serve FP32."
        )
    return result


def calibration_batches(arrays: Feeds, batch_size: int) -> list[dict[str, np.ndarray]]:
    """Cut aligned input arrays (same leading size) into feed dicts of at most `batch_size` rows."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    sizes = {int(v.shape[0]) for v in arrays.values()}
    if len(sizes) != 1:
        raise ValueError(f"calibration arrays must share their leading size, got {sorted(sizes)}")
    (total,) = sizes
    return [{k: v[i : i + batch_size] for k, v in arrays.items()} for i in range(0, total, batch_size)]


class _Reader(CalibrationDataReader):  # type: ignore[misc]
    """onnxruntime's calibration protocol over a list of feed dicts."""

    def __init__(self, batches: Sequence[Feeds]) -> None:
        self._batches: Iterator[Feeds] = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._batches, None)
        return None if batch is None else {k: np.ascontiguousarray(v) for k, v in batch.items()}


def quantize_onnx(src: Path, dst: Path, cfg: QuantizeConfig, calibration: Sequence[Feeds] = ()) -> Path:
    """Write an INT8 copy of `src` to `dst` (atomically: a failed run leaves no `dst`)."""
    if not src.is_file():
        raise FileNotFoundError(f"{src}: no ONNX model to quantize; build the FP32 model first")
    if cfg.mode == "static" and not calibration:
        raise ValueError("static quantization needs a calibration set: pass batches of representative inputs")
    dst.parent.mkdir(parents=True, exist_ok=True)
    op_types = list(cfg.op_types) or None
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=".quantize-") as tmp:
        staging = Path(tmp) / dst.name
        if cfg.mode == "dynamic":
            quantize_dynamic(
                str(src),
                str(staging),
                weight_type=QuantType.QInt8,
                per_channel=cfg.per_channel,
                op_types_to_quantize=op_types,
            )
        else:
            quantize_static(
                str(src),
                str(staging),
                _Reader(calibration),
                quant_format=QuantFormat.QDQ,
                per_channel=cfg.per_channel,
                op_types_to_quantize=op_types,
            )
        os.replace(staging, dst)
    return dst
