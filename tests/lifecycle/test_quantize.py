"""INT8 variants and the accuracy gate: a good calibration is accepted, a broken one refused (and not installed)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from headroom.lifecycle.int8_builtin import (
    INT8_FILE,
    build_int8_variants,
    gate_digits_bf16,
    minilm_sentences,
    quantize_digits,
    quantize_minilm,
)
from headroom.lifecycle.quantize import (
    AccuracyGateError,
    QuantizeConfig,
    calibration_batches,
    check_gate,
    enforce_gate,
    quantize_onnx,
)
from headroom.models.builtin.digits_transform import to_model_input


def test_gate_passes_within_threshold_and_refuses_beyond_it() -> None:
    ok = check_gate("accuracy", 0.98, 0.975, max_loss=0.01)
    assert ok.passed and math.isclose(ok.loss, 0.005)
    assert enforce_gate(ok) is ok
    bad = check_gate("accuracy", 0.98, 0.90, max_loss=0.01)
    assert not bad.passed
    with pytest.raises(AccuracyGateError, match=r"refused: accuracy 0\.9000 vs FP32 0\.9800.*representative"):
        enforce_gate(bad)


def test_gate_never_passes_nan_and_rejects_negative_threshold() -> None:
    assert not check_gate("cosine_similarity", 1.0, float("nan"), max_loss=1.0).passed
    with pytest.raises(ValueError, match="max_loss"):
        check_gate("accuracy", 1.0, 1.0, max_loss=-0.1)


def test_calibration_batches_cut_aligned_arrays() -> None:
    batches = calibration_batches({"a": np.zeros((70, 2)), "b": np.ones((70,))}, 32)
    assert [len(b["a"]) for b in batches] == [32, 32, 6]
    assert [len(b["b"]) for b in batches] == [32, 32, 6]
    with pytest.raises(ValueError, match="leading size"):
        calibration_batches({"a": np.zeros((3, 2)), "b": np.zeros((4,))}, 2)


def test_config_and_static_without_calibration_fail_clearly(digits_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not one of"):
        QuantizeConfig(mode="int4")
    with pytest.raises(ValueError, match="calibration set"):
        quantize_onnx(digits_dir / "model.onnx", tmp_path / "x.onnx", QuantizeConfig(mode="static"))
    assert not (tmp_path / "x.onnx").exists()


def test_static_int8_with_training_calibration_is_accepted(digits_dir: Path, tmp_path: Path) -> None:
    report = quantize_digits(digits_dir, QuantizeConfig(mode="static"), out_file="static.int8.onnx")
    assert report.gate.passed and report.gate.metric == "accuracy"
    assert report.gate.candidate >= 0.95
    assert report.calibration_items == 256
    assert report.path == digits_dir / "static.int8.onnx" and report.path.is_file()
    assert report.path.stat().st_size < (digits_dir / "model.onnx").stat().st_size / 2  # INT8 weights


def test_all_zero_calibration_is_refused_and_nothing_is_installed(digits_dir: Path) -> None:
    zeros = to_model_input(np.zeros((64, 8, 8), np.float32))
    with pytest.raises(AccuracyGateError, match="digits int8-static is refused"):
        quantize_digits(digits_dir, QuantizeConfig(mode="static"), calibration=zeros, out_file="zeros.int8.onnx")
    assert not (digits_dir / "zeros.int8.onnx").exists()
    assert not [p for p in digits_dir.iterdir() if p.name.startswith(".int8-")]  # staging cleaned up


def test_dynamic_int8_digits_is_accepted(digits_dir: Path) -> None:
    report = quantize_digits(digits_dir, QuantizeConfig(mode="dynamic"), out_file="dynamic.int8.onnx")
    assert report.gate.passed and report.calibration_items == 0
    assert report.precision == "int8-dynamic" and (digits_dir / "dynamic.int8.onnx").is_file()


def test_bf16_digits_is_gated_against_fp32(digits_dir: Path) -> None:
    report = gate_digits_bf16(digits_dir)
    assert report.precision == "bf16" and report.gate.passed and report.gate.candidate >= 0.95


def test_minilm_sentences_are_seeded_and_varied() -> None:
    assert minilm_sentences(50, seed=0) == minilm_sentences(50, seed=0)
    assert minilm_sentences(50, seed=0) != minilm_sentences(50, seed=1)
    assert len(set(minilm_sentences(300, seed=0))) > 200


def test_minilm_dynamic_int8_keeps_cosine_similarity(minilm_dir: Path, minilm_weights: Path, tmp_path: Path) -> None:
    out = tmp_path / "1"
    out.mkdir()
    (out / "model.onnx").symlink_to(minilm_dir / "model.onnx")
    report = quantize_minilm(out, minilm_weights, num_held_out=32)
    assert report.gate.metric == "cosine_similarity" and report.gate.reference == 1.0
    assert report.gate.candidate >= 0.97 and (out / INT8_FILE).is_file()


@pytest.mark.slow
def test_minilm_static_int8_is_refused_by_the_gate(minilm_dir: Path, minilm_weights: Path, tmp_path: Path) -> None:
    out = tmp_path / "1"
    out.mkdir()
    (out / "model.onnx").symlink_to(minilm_dir / "model.onnx")
    cfg = QuantizeConfig(mode="static", per_channel=True, op_types=("MatMul",))
    with pytest.raises(AccuracyGateError, match="cosine_similarity"):
        quantize_minilm(out, minilm_weights, cfg, num_held_out=32)
    assert not (out / INT8_FILE).exists()


def test_build_int8_variants_uses_the_recommended_mode_per_model(digits_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(digits_repo / "digits", repo / "digits")
    (report,) = build_int8_variants(repo, tmp_path, names=["digits"])
    assert report.precision == "int8-static" and (repo / "digits" / "1" / INT8_FILE).is_file()
    with pytest.raises(ValueError, match="no INT8 recipe for 'noop'"):
        build_int8_variants(repo, tmp_path, names=["noop"])
