"""The quality gate of the native default: perplexity and top-1 agreement against the fp32 reference.

`headroom models quality smollm2` tokenises the held-out corpus (`headroom/llm/corpus/`, see its README),
cuts it into windows of `window_tokens` (512, as llama.cpp's `llama-perplexity -c 512`), and runs every
window teacher-forced through two runners over the same GGUF: the native one (the file's own blocks,
activations quantised per row) and the fp32 reference (the dequantised weights through the torch model).
Like llama-perplexity, each window scores its second half (every scored token sees >= window/2 tokens of
context). It reports each runner's perplexity, `exp(mean NLL)`, and the share of scored positions where the
two runners' argmax agree. The gate (`judge`): the native perplexity within 1% of the reference's and
>= 97% top-1 agreement.

The verdict is written to `quality.json` in the GGUF's cache directory, per weight format; the server
reads it at start (`gate_status`): it logs the numbers, and refuses a format that failed, with them.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from headroom.llm.step_batch import BatchItem, ModelBatch, Runner

CORPUS = Path(__file__).parent / "corpus" / "alice.txt"  # the shipped held-out text (README beside it)
RESULT_FILE = "quality.json"  # in the GGUF's cache directory: weight format -> QualityResult


class QualityGateError(ValueError):
    """A weight format failed the quality gate; the message carries the numbers."""


@dataclass(frozen=True, slots=True)
class QualityThresholds:
    """The gate."""

    max_ppl_rel_diff: float = 0.01  # |ppl_native / ppl_reference - 1| at most this
    min_top1_agreement: float = 0.97  # share of scored positions whose argmax agrees, at least this


@dataclass(frozen=True, slots=True)
class TeacherForced:
    """Per scored position (in corpus order): negative log-likelihood of the true next token, and the argmax."""

    nll: np.ndarray  # float64 [N]
    top1: np.ndarray  # int64 [N]

    @property
    def perplexity(self) -> float:
        """exp(mean NLL)."""
        return float(math.exp(float(self.nll.mean())))


@dataclass(frozen=True, slots=True)
class QualityResult:
    """One measurement of a weight format against the fp32 reference (what `quality.json` holds)."""

    weight_format: str  # e.g. "gguf:Q4_1+Q8_0"
    source: str  # the GGUF file
    corpus: str  # corpus file name
    corpus_sha256: str  # of the corpus text
    window_tokens: int  # tokens per window
    scored_tokens: int  # positions scored (second half of each window)
    ppl_native: float  # perplexity of the native runner
    ppl_reference: float  # perplexity of the fp32 reference
    top1_agreement: float  # share of scored positions with the same argmax
    passed: bool  # the gate's verdict
    verdict: str  # the verdict in words, with the numbers
    llama_perplexity: float | None = None  # llama.cpp's `llama-perplexity` on the same file and text (anchor)
    measured_at: str = ""  # UTC time of the measurement


def windows(ids: Sequence[int], window_tokens: int, max_tokens: int = 0) -> list[list[int]]:
    """Whole non-overlapping windows of the token ids (a ragged tail is dropped); `max_tokens` > 0 keeps only
    the windows that fit in that many tokens."""
    if window_tokens < 4:
        raise ValueError("window_tokens must be >= 4")
    usable = len(ids) if max_tokens <= 0 else min(len(ids), max_tokens)
    out = [list(ids[i : i + window_tokens]) for i in range(0, usable - window_tokens + 1, window_tokens)]
    if not out:
        raise ValueError(f"the corpus has {usable} tokens, fewer than one window of {window_tokens}")
    return out


def teacher_forced(
    runner: Runner, chunks: Sequence[Sequence[int]], block_size_tokens: int, on_window: Callable[[], None] | None = None
) -> TeacherForced:
    """Run each window from position 0 through `runner` (its pool must hold one window) and score its second
    half: the logits after token j predict token j + 1."""
    nll: list[np.ndarray] = []
    top1: list[np.ndarray] = []
    for chunk in chunks:
        n, first = len(chunk), len(chunk) // 2  # score targets chunk[first:]
        table = tuple(range(-(-n // block_size_tokens)))
        item = BatchItem("quality", tuple(chunk), 0, table, needs_logits=True, num_logits=n - first + 1)
        logits = runner.execute(ModelBatch((item,), block_size_tokens))[:-1].astype(np.float64)
        targets = np.asarray(chunk[first:], dtype=np.int64)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        lse = np.log(np.exp(shifted).sum(axis=-1))
        nll.append(lse - shifted[np.arange(len(targets)), targets])
        top1.append(logits.argmax(-1))
        if on_window is not None:
            on_window()
    return TeacherForced(np.concatenate(nll), np.concatenate(top1).astype(np.int64))


def judge(ppl_native: float, ppl_reference: float, agreement: float, limits: QualityThresholds) -> tuple[bool, str]:
    """The gate's verdict and its reason, with the numbers."""
    rel = ppl_native / ppl_reference - 1.0
    numbers = (
        f"perplexity {ppl_native:.4f} vs fp32 {ppl_reference:.4f} ({rel * 100:+.2f}%, limit "
        f"±{limits.max_ppl_rel_diff * 100:.1f}%), top-1 agreement {agreement * 100:.2f}% (limit "
        f">= {limits.min_top1_agreement * 100:.0f}%)"
    )
    ok = abs(rel) <= limits.max_ppl_rel_diff and agreement >= limits.min_top1_agreement
    return ok, ("passed: " if ok else "FAILED: ") + numbers


def measure(
    native: TeacherForced,
    reference: TeacherForced,
    weight_format: str,
    source: Path,
    corpus: Path,
    window_tokens: int,
    limits: QualityThresholds,
    llama_perplexity: float | None = None,
) -> QualityResult:
    """The result of comparing a native run with the reference run over the same windows."""
    if native.top1.shape != reference.top1.shape:
        raise ValueError("native and reference runs scored different positions")
    agreement = float((native.top1 == reference.top1).mean())
    ok, verdict = judge(native.perplexity, reference.perplexity, agreement, limits)
    return QualityResult(
        weight_format=weight_format,
        source=str(source),
        corpus=corpus.name,
        corpus_sha256=hashlib.sha256(corpus.read_bytes()).hexdigest(),
        window_tokens=window_tokens,
        scored_tokens=int(native.nll.shape[0]),
        ppl_native=native.perplexity,
        ppl_reference=reference.perplexity,
        top1_agreement=agreement,
        passed=ok,
        verdict=verdict,
        llama_perplexity=llama_perplexity,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def write_result(cache_dir: Path, result: QualityResult) -> Path:
    """Record `result` under its weight format in the cache's `quality.json` (atomic replace)."""
    path = cache_dir / RESULT_FILE
    table = _read_table(path)
    table[result.weight_format] = asdict(result)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(table, indent=1) + "\n")
    tmp.replace(path)
    return path


def read_result(cache_dir: Path, weight_format: str) -> QualityResult | None:
    """The recorded measurement of `weight_format`, or None when it was never measured."""
    raw = _read_table(cache_dir / RESULT_FILE).get(weight_format)
    if not isinstance(raw, dict):
        return None
    try:
        return QualityResult(**raw)
    except TypeError:  # written by another version: treat as not measured
        return None


def gate_status(cache_dir: Path | None, weight_format: str, model: str) -> str:
    """What the server says at start about a native format's quality; raises QualityGateError for a format
    whose recorded measurement failed the gate."""
    result = None if cache_dir is None else read_result(cache_dir, weight_format)
    if result is None:
        return f"quality of {weight_format} not measured yet (run `headroom models quality` for {model})"
    text = f"quality of {weight_format} on {result.corpus} ({result.scored_tokens} tokens): {result.verdict}"
    if not result.passed:
        raise QualityGateError(
            f"{model}: {weight_format} is refused by the quality gate, {text}; serve it with weight_dtype: fp32 "
            "or use a better-quantised GGUF"
        )
    return text


def _read_table(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}
