"""Export all-MiniLM-L6-v2's encoder to ONNX for the onnxruntime backend (faster than eager torch on CPU).

The graph maps `input_ids`, `attention_mask` (int64 [batch, tokens], both axes dynamic) to
`token_embeddings` FP32 [batch, tokens, 384]; tokenization and pooling stay in Python (minilm.py).
Idempotent: `build.json` records a hash of the weights, this code and the torch version.
"""

from __future__ import annotations

import hashlib
import inspect
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from transformers import BertModel

from headroom.models.builtin.build_record import install, is_current, read_record
from headroom.models.builtin.minilm import DEFAULT_MAX_SEQ_LENGTH, load_tokenizer, mean_pool_normalise
from headroom.models.builtin.minilm_torch import load_bert

ARTIFACTS = ("model.onnx", "build.json")  # what an export writes into the version dir
OPSET = 17  # ONNX opset of the export
MAX_EXPORT_ERROR = 1e-5  # largest embedding difference from torch accepted after export
_CHECK_SENTENCES = ("A short one.", "A somewhat longer sentence, to check padding inside the exported graph.")


@dataclass(frozen=True, slots=True)
class MiniLMBuildReport:
    """What `build_minilm_onnx` did."""

    version_dir: Path  # where model.onnx is
    max_abs_error: float  # largest |onnx - torch| over the check sentences' embeddings
    skipped: bool  # True when a matching export already existed
    duration_s: float  # wall time of this call
    fingerprint: str  # hash of the weights, the export code and torch's version


class _Encoder(torch.nn.Module):
    """BertModel with the signature the graph exposes (token types are always 0 for this model)."""

    def __init__(self, bert: BertModel) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=torch.zeros_like(input_ids))
        hidden: torch.Tensor = out.last_hidden_state
        return hidden


def fingerprint(weights_dir: Path) -> str:
    digest = hashlib.sha256()
    with open(weights_dir / "model.safetensors", "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    digest.update(inspect.getsource(_Encoder).encode())
    digest.update(inspect.getsource(build_minilm_onnx).encode())
    digest.update(f"{OPSET} {torch.__version__}".encode())
    return digest.hexdigest()[:16]


def is_built(version_dir: Path, weights_dir: Path) -> bool:
    """True when model.onnx exists and build.json carries the current fingerprint."""
    return is_current(version_dir, ARTIFACTS, lambda: fingerprint(weights_dir))


def _embeddings(session: ort.InferenceSession | None, bert: BertModel, weights_dir: Path) -> np.ndarray:
    tokenizer = load_tokenizer(weights_dir, DEFAULT_MAX_SEQ_LENGTH, "minilm")
    rows = [e.ids for e in tokenizer.encode_batch(list(_CHECK_SENTENCES))]
    length = max(len(r) for r in rows)
    ids = np.array([r + [0] * (length - len(r)) for r in rows], dtype=np.int64)
    mask = np.array([[1] * len(r) + [0] * (length - len(r)) for r in rows], dtype=np.int64)
    if session is None:
        with torch.inference_mode():
            hidden = _Encoder(bert)(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    else:
        (hidden,) = session.run(["token_embeddings"], {"input_ids": ids, "attention_mask": mask})
    return mean_pool_normalise(hidden, mask)


def build_minilm_onnx(version_dir: Path, weights_dir: Path, *, force: bool = False) -> MiniLMBuildReport:
    """Export into `version_dir/model.onnx` unless a matching export exists; checks it against torch."""
    start = time.monotonic()
    digest = fingerprint(weights_dir)
    if not force and is_built(version_dir, weights_dir):
        recorded = read_record(version_dir) or {}
        error = float(recorded["max_abs_error"])
        return MiniLMBuildReport(version_dir, error, True, time.monotonic() - start, digest)
    bert = load_bert(weights_dir)
    version_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=version_dir, prefix=".build-") as tmp:
        staging = Path(tmp)
        example = (torch.ones(2, 16, dtype=torch.int64), torch.ones(2, 16, dtype=torch.int64))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _Encoder(bert).eval(),
                example,
                str(staging / "model.onnx"),
                input_names=["input_ids", "attention_mask"],
                output_names=["token_embeddings"],
                dynamic_axes={
                    "input_ids": {0: "batch", 1: "tokens"},
                    "attention_mask": {0: "batch", 1: "tokens"},
                    "token_embeddings": {0: "batch", 1: "tokens"},
                },
                opset_version=OPSET,
                dynamo=False,
            )
        session = ort.InferenceSession(str(staging / "model.onnx"), providers=["CPUExecutionProvider"])
        error = float(np.abs(_embeddings(session, bert, weights_dir) - _embeddings(None, bert, weights_dir)).max())
        if error > MAX_EXPORT_ERROR:
            raise RuntimeError(f"minilm: the ONNX export differs from torch by {error:.2e}; not installing it")
        record = {"fingerprint": digest, "max_abs_error": error, "opset": OPSET, "torch": torch.__version__}
        install(staging, version_dir, ARTIFACTS, record)
    return MiniLMBuildReport(version_dir, error, False, time.monotonic() - start, digest)
