"""Running the quality gate (`headroom models quality`): both runners over the corpus, plus llama.cpp's anchor.

Mechanism only; the arithmetic and the verdict are `headroom.llm.quality`'s.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from headroom.llm.config import EngineConfig
from headroom.llm.model import build_model
from headroom.llm.native_runner import NativeRunner
from headroom.llm.native_weights import NativeCheckpoint, load_native
from headroom.llm.quality import (
    CORPUS,
    QualityResult,
    QualityThresholds,
    TeacherForced,
    measure,
    teacher_forced,
    windows,
    write_result,
)
from headroom.llm.runner import TorchRunner
from headroom.llm.tokenizer import Tokenizer
from headroom.llm.weights import load_checkpoint

_FINAL_PPL = re.compile(r"Final estimate: PPL = ([0-9.]+)")


@dataclass(frozen=True, slots=True)
class QualityRun:
    """What to measure."""

    model: str  # the GGUF (path or package:)
    cache_root: Path | None = None  # the GGUF cache root (None = default)
    corpus: Path = CORPUS  # the held-out text
    window_tokens: int = 512  # tokens per window (llama-perplexity's -c)
    max_tokens: int = 0  # > 0: only the windows within the corpus's first this-many tokens
    num_threads: int = 0  # threads for both runners (0 = auto)
    llama_perplexity: Path | None = None  # llama.cpp's llama-perplexity binary: also run it as the anchor
    limits: QualityThresholds = field(default_factory=QualityThresholds)  # the gate


def run_quality(
    run: QualityRun,
    progress: Callable[[str, int], Callable[[], None]],
    native: NativeCheckpoint | None = None,
) -> QualityResult:
    """Measure, record in the GGUF's cache and return the result. `progress(label, windows)` returns the
    per-window tick of a progress bar; `native` replaces the file's own native weights (tests: a broken
    quantisation)."""
    ckpt = native or load_native(run.model, run.cache_root)
    tokenizer = Tokenizer(ckpt.tokenizer)
    ids = tokenizer.encode(run.corpus.read_text(encoding="utf-8"), add_special_tokens=False)
    chunks = windows(ids, run.window_tokens, run.max_tokens)
    engine = EngineConfig(num_threads=run.num_threads, block_size_tokens=16)
    pool_blocks = -(-run.window_tokens // engine.block_size_tokens)
    native_runner = NativeRunner(ckpt, engine, num_blocks=pool_blocks)
    native_scores = teacher_forced(native_runner, chunks, engine.block_size_tokens, progress("native", len(chunks)))
    del native_runner
    reference = _reference(run, engine, pool_blocks, chunks, progress)
    anchor = None
    if run.llama_perplexity is not None:
        anchor = llama_perplexity(run.llama_perplexity, ckpt.source, run.corpus, run.window_tokens, run.num_threads)
    result = measure(
        native_scores, reference, ckpt.weight_format, ckpt.source, run.corpus, run.window_tokens, run.limits, anchor
    )
    if ckpt.cache_dir is not None:
        write_result(ckpt.cache_dir, result)
    return result


def _reference(
    run: QualityRun,
    engine: EngineConfig,
    pool_blocks: int,
    chunks: list[list[int]],
    progress: Callable[[str, int], Callable[[], None]],
) -> TeacherForced:
    """The fp32 reference's scores (the GGUF dequantised once into its cache, through the torch model)."""
    import torch

    ckpt = load_checkpoint(run.model, run.cache_root)
    net = build_model(ckpt.config, ckpt.state_dict, torch.device("cpu"), torch.float32)
    runner = TorchRunner(net, replace(engine, weight_dtype="fp32"), num_blocks=pool_blocks)
    return teacher_forced(runner, chunks, engine.block_size_tokens, progress("fp32 reference", len(chunks)))


def llama_perplexity(binary: Path, gguf: Path, corpus: Path, window_tokens: int, num_threads: int) -> float:
    """llama.cpp's perplexity of `gguf` on `corpus` with the same window (`-c`); raises ValueError with its
    output's tail when it fails. Its shared libraries are looked for next to the binary."""
    if not binary.is_file():
        raise ValueError(f"--llama-perplexity {binary}: no such file (build llama.cpp's llama-perplexity)")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(binary.parent), env.get("LD_LIBRARY_PATH", "")) if p)
    cmd = [str(binary), "-m", str(gguf), "-f", str(corpus), "-c", str(window_tokens), "-t", str(num_threads or 2)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600, check=False)
    found = _FINAL_PPL.search(proc.stdout + proc.stderr)
    if proc.returncode != 0 or found is None:
        tail = (proc.stdout + proc.stderr)[-800:]
        raise ValueError(f"llama-perplexity failed (exit {proc.returncode}): {tail}")
    return float(found.group(1))
