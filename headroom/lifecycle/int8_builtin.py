"""INT8 (and BF16) variants of the built-in models, each refused unless it passes the accuracy gate.

    digits  calibration: training images (model-input scale); gate: held-out accuracy vs FP32
    minilm  calibration: a few hundred generated sentences; gate: mean cosine similarity to FP32 embeddings
            on other generated sentences (the FP32 reference is 1.0)

A passing variant is installed next to the FP32 model as `model.int8.onnx` (serve it with
`parameters.model_file: model.int8.onnx`); a refused one is never written. `build_int8_variants` is what a
`headroom build-models --int8 [--int8-mode static|dynamic]` flag calls after the FP32 builds.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from safetensors.torch import load_file

from headroom.lifecycle.quantize import (
    GateResult,
    QuantizeConfig,
    calibration_batches,
    check_gate,
    enforce_gate,
    quantize_onnx,
)
from headroom.models.builtin.digits_build import DigitsTrainingConfig, held_out_split, onnx_accuracy
from headroom.models.builtin.digits_net import DigitsNet
from headroom.models.builtin.digits_transform import to_model_input
from headroom.models.builtin.minilm import DEFAULT_MAX_SEQ_LENGTH, load_tokenizer, mean_pool_normalise

INT8_FILE = "model.int8.onnx"  # the installed variant's file name inside the version directory
DEFAULT_MAX_ACCURACY_DROP = 0.01  # digits: at most one point of held-out accuracy may be lost
DEFAULT_MAX_COSINE_LOSS = 0.03  # minilm: mean cosine similarity to FP32 must stay >= 0.97
CALIBRATION_BATCH = 32  # rows per calibration batch


@dataclass(frozen=True, slots=True)
class VariantReport:
    """What building one precision variant did."""

    model: str  # "digits" or "minilm"
    precision: str  # "int8-static", "int8-dynamic" or "bf16"
    path: Path | None  # the installed file (None for variants that are not files, e.g. bf16 via torch)
    gate: GateResult  # the accuracy gate's verdict (always passed: refusals raise)
    calibration_items: int  # representative inputs the ranges came from (0 for dynamic / bf16)
    duration_s: float  # wall time of quantization + evaluation


class _Evaluate:
    """A metric of an ONNX file (callable object so mypy sees one signature)."""

    def __call__(self, path: Path) -> float:
        raise NotImplementedError


def _gated_install(
    src: Path,
    dst: Path,
    cfg: QuantizeConfig,
    batches: Sequence[dict[str, np.ndarray]],
    metric: str,
    evaluate: _Evaluate,
    reference: float,
    max_loss: float,
    variant: str,
) -> GateResult:
    """Quantize into a staging file, gate it, and move it to `dst` only when it passes."""
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=".int8-") as tmp:
        staged = quantize_onnx(src, Path(tmp) / dst.name, cfg, batches)
        result = enforce_gate(check_gate(metric, reference, evaluate(staged), max_loss), variant)
        os.replace(staged, dst)
    return result


# ---- digits -------------------------------------------------------------------------------------------------


def digits_calibration_inputs(num_images: int = 256, seed: int = 0) -> np.ndarray:
    """Representative model inputs ([N, 1, 8, 8], transformed): a seeded sample of the training split."""
    x_train, _, _, _ = held_out_split(DigitsTrainingConfig())
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(x_train), size=min(num_images, len(x_train)), replace=False)
    return to_model_input(x_train[pick])


class _DigitsAccuracy(_Evaluate):
    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images, self.labels = images, labels

    def __call__(self, path: Path) -> float:
        return onnx_accuracy(path, self.images, self.labels)


def quantize_digits(
    version_dir: Path,
    cfg: QuantizeConfig | None = None,
    *,
    calibration: np.ndarray | None = None,
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP,
    out_file: str = INT8_FILE,
) -> VariantReport:
    """INT8 digits from `version_dir/model.onnx`; `calibration` is model-input [N, 1, 8, 8] (default: training)."""
    cfg = cfg or QuantizeConfig()
    start = time.monotonic()
    _, _, x_test, y_test = held_out_split(DigitsTrainingConfig())
    evaluate = _DigitsAccuracy(x_test, y_test)
    src = version_dir / "model.onnx"
    reference = evaluate(src)
    batches: list[dict[str, np.ndarray]] = []
    if cfg.mode == "static":
        calib = digits_calibration_inputs() if calibration is None else np.asarray(calibration, np.float32)
        batches = calibration_batches({"input": calib}, CALIBRATION_BATCH)
    gate = _gated_install(
        src,
        version_dir / out_file,
        cfg,
        batches,
        "accuracy",
        evaluate,
        reference,
        max_accuracy_drop,
        f"digits int8-{cfg.mode}",
    )
    items = sum(len(b["input"]) for b in batches)
    return VariantReport("digits", f"int8-{cfg.mode}", version_dir / out_file, gate, items, time.monotonic() - start)


def digits_bf16_accuracy(version_dir: Path, images: np.ndarray, labels: np.ndarray) -> float:
    """Held-out accuracy of the digits network run by torch in bfloat16 (weights from model.safetensors)."""
    state = load_file(str(version_dir / "model.safetensors"))
    cfg = DigitsTrainingConfig()
    net = DigitsNet(cfg.channels, cfg.hidden)
    net.load_state_dict(state)
    net = net.eval().to(torch.bfloat16)
    with torch.inference_mode():
        probs = net(torch.from_numpy(to_model_input(images)).to(torch.bfloat16)).float().numpy()
    return float((np.argmax(probs, axis=1) == labels).mean())


def gate_digits_bf16(version_dir: Path, max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP) -> VariantReport:
    """Gate the BF16 variant (torch) against the FP32 ONNX model; raises AccuracyGateError when refused."""
    start = time.monotonic()
    _, _, x_test, y_test = held_out_split(DigitsTrainingConfig())
    reference = onnx_accuracy(version_dir / "model.onnx", x_test, y_test)
    candidate = digits_bf16_accuracy(version_dir, x_test, y_test)
    gate = enforce_gate(check_gate("accuracy", reference, candidate, max_accuracy_drop), "digits bf16")
    return VariantReport("digits", "bf16", None, gate, 0, time.monotonic() - start)


# ---- minilm -------------------------------------------------------------------------------------------------

_SUBJECTS = ("The server", "A user", "The model", "Our team", "The batcher", "This cluster", "A student", "The cat")
_VERBS = ("serves", "reads", "measures", "rejects", "caches", "writes about", "waits for", "compares")
_OBJECTS = (
    "requests at the edge",
    "a long queue of images",
    "the latency budget",
    "sentences in three languages",
    "a quantized network",
    "the morning news",
    "batches of thirty-two",
    "an unusually slow disk",
)
_TAILS = ("", " today.", " before lunch.", " without any errors.", " while the load grows.", " again and again.")


def minilm_sentences(num: int, seed: int) -> list[str]:
    """`num` generated English sentences (seeded), the representative inputs for minilm."""
    rng = random.Random(seed)
    return [
        f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}{rng.choice(_TAILS)}" for _ in range(num)
    ]


class MiniLMFeeds:
    """Tokenizes sentences into the exported graph's feeds (input_ids, attention_mask, padded per batch)."""

    def __init__(self, weights_dir: Path) -> None:
        self.tokenizer = load_tokenizer(weights_dir, DEFAULT_MAX_SEQ_LENGTH, "minilm")

    def __call__(self, sentences: Sequence[str]) -> dict[str, np.ndarray]:
        rows = [e.ids for e in self.tokenizer.encode_batch(list(sentences))]
        length = max(len(r) for r in rows)
        ids = np.array([r + [0] * (length - len(r)) for r in rows], dtype=np.int64)
        mask = np.array([[1] * len(r) + [0] * (length - len(r)) for r in rows], dtype=np.int64)
        return {"input_ids": ids, "attention_mask": mask}

    def batches(self, sentences: Sequence[str], batch_size: int = CALIBRATION_BATCH) -> list[dict[str, np.ndarray]]:
        return [self(sentences[i : i + batch_size]) for i in range(0, len(sentences), batch_size)]


def minilm_embeddings(path: Path, feeds: Sequence[dict[str, np.ndarray]]) -> np.ndarray:
    """Pooled, normalised embeddings of every batch in `feeds` from the ONNX file at `path`."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = [mean_pool_normalise(session.run(["token_embeddings"], f)[0], f["attention_mask"]) for f in feeds]
    return np.concatenate(out)


class _MiniLMCosine(_Evaluate):
    def __init__(self, reference: np.ndarray, feeds: Sequence[dict[str, np.ndarray]]) -> None:
        self.reference, self.feeds = reference, feeds

    def __call__(self, path: Path) -> float:
        return float(np.mean(np.sum(minilm_embeddings(path, self.feeds) * self.reference, axis=1)))


def quantize_minilm(
    version_dir: Path,
    weights_dir: Path,
    cfg: QuantizeConfig | None = None,
    *,
    calibration_sentences: Sequence[str] | None = None,
    num_held_out: int = 64,
    max_cosine_loss: float = DEFAULT_MAX_COSINE_LOSS,
    out_file: str = INT8_FILE,
) -> VariantReport:
    """INT8 minilm from `version_dir/model.onnx` (MatMul weights and activations; embeddings stay FP32)."""
    cfg = cfg or QuantizeConfig(mode="dynamic", per_channel=True, op_types=("MatMul",))
    start = time.monotonic()
    feeds = MiniLMFeeds(weights_dir)
    held_out = feeds.batches(minilm_sentences(num_held_out, seed=1))
    src = version_dir / "model.onnx"
    evaluate = _MiniLMCosine(minilm_embeddings(src, held_out), held_out)
    batches: list[dict[str, np.ndarray]] = []
    if cfg.mode == "static":
        sentences = minilm_sentences(256, seed=0) if calibration_sentences is None else list(calibration_sentences)
        batches = feeds.batches(sentences)
    gate = _gated_install(
        src,
        version_dir / out_file,
        cfg,
        batches,
        "cosine_similarity",
        evaluate,
        1.0,
        max_cosine_loss,
        f"minilm int8-{cfg.mode}",
    )
    items = sum(len(b["input_ids"]) for b in batches)
    return VariantReport("minilm", f"int8-{cfg.mode}", version_dir / out_file, gate, items, time.monotonic() - start)


# ---- what `headroom build-models --int8` calls --------------------------------------------------------------


RECOMMENDED_MODES = {"digits": "static", "minilm": "dynamic"}  # minilm static loses ~7% cosine: refused


def build_int8_variants(
    models_root: Path,
    weights_dir: Path,
    *,
    mode: str | None = None,
    names: Sequence[str] = ("digits", "minilm"),
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP,
    max_cosine_loss: float = DEFAULT_MAX_COSINE_LOSS,
) -> list[VariantReport]:
    """Quantize each named built-in model's version 1 in `models_root` (`mode` None = the recommended one per
    model); raises AccuracyGateError on a refusal, leaving that model without an INT8 file."""
    reports = []
    for name in names:
        if name not in RECOMMENDED_MODES:
            raise ValueError(f"no INT8 recipe for {name!r}; known: {', '.join(RECOMMENDED_MODES)}")
        version_dir = models_root / name / "1"
        chosen = mode or RECOMMENDED_MODES[name]
        if name == "digits":
            cfg = QuantizeConfig(mode=chosen)
            reports.append(quantize_digits(version_dir, cfg, max_accuracy_drop=max_accuracy_drop))
        else:
            cfg = QuantizeConfig(mode=chosen, per_channel=True, op_types=("MatMul",))
            reports.append(quantize_minilm(version_dir, weights_dir, cfg, max_cosine_loss=max_cosine_loss))
    return reports
