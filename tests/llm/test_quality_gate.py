"""The quality gate end to end on SmolLM2: intact native weights agree with the fp32 reference; a deliberately
broken quantisation (corrupted block scales) fails the gate, and the server's loader then refuses the format."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from headroom.llm.config import EngineConfig
from headroom.llm.native_weights import NativeCheckpoint, load_native
from headroom.llm.offline import DEFAULT_MODEL, load_engine
from headroom.llm.quality import QualityGateError, read_result
from headroom.llm.quality_run import QualityRun, run_quality
from headroom.llm.quant_blocks import BLOCK_BYTES, QTensor
from headroom.llm.weights import LoadedCheckpoint


def _cache_copy(smollm2: LoadedCheckpoint, tmp_path: Path) -> Path:
    """A cache root whose SmolLM2 entry links the default cache's files: verdicts land under tmp_path only."""
    assert smollm2.cache_dir is not None
    root = tmp_path / "llm"
    dst = root / smollm2.cache_dir.name
    dst.mkdir(parents=True)
    for f in smollm2.cache_dir.iterdir():
        if f.is_file() and f.name != "quality.json":
            (dst / f.name).symlink_to(f)
    return root


def _scales_times(t: QTensor, factor: float) -> QTensor:
    """A copy of a block-quantised matrix with every block scale d multiplied by `factor`."""
    blocks = t.data.reshape(-1, BLOCK_BYTES[t.fmt]).copy()
    d = blocks[:, :2].copy().view("<f2")
    blocks[:, :2] = (d * np.float16(factor)).astype("<f2").view(np.uint8)
    return QTensor(t.fmt, t.rows, t.cols, blocks.reshape(-1))


def _broken(ckpt: NativeCheckpoint) -> NativeCheckpoint:
    bad = {
        name: _scales_times(t, 1.3) if ".mlp." in name and t.fmt in BLOCK_BYTES else t
        for name, t in ckpt.matrices.items()
    }
    return replace(ckpt, matrices=bad)


def _ticks(label: str, total: int) -> Callable[[], None]:
    return lambda: None


def test_intact_weights_agree_and_corrupted_scales_are_refused(smollm2: LoadedCheckpoint, tmp_path: Path) -> None:
    root = _cache_copy(smollm2, tmp_path)
    run = QualityRun(DEFAULT_MODEL, root, window_tokens=128, max_tokens=640, num_threads=1)
    good = run_quality(run, _ticks)
    print(good.verdict)
    assert good.scored_tokens == 5 * 64 and good.top1_agreement >= 0.9
    assert abs(good.ppl_native / good.ppl_reference - 1) < 0.05
    native = load_native(DEFAULT_MODEL, root)
    bad = run_quality(run, _ticks, native=_broken(native))
    print(bad.verdict)
    assert not bad.passed and bad.verdict.startswith("FAILED")
    assert bad.ppl_native > good.ppl_native * 1.05 and bad.top1_agreement < good.top1_agreement
    assert native.cache_dir is not None and read_result(native.cache_dir, native.weight_format) == bad
    with pytest.raises(QualityGateError, match=r"gguf:Q4_1\+Q8_0 is refused by the quality gate.*perplexity"):
        load_engine(DEFAULT_MODEL, EngineConfig(kv_cache_memory_mb=16), root)
    _, report = load_engine(DEFAULT_MODEL, EngineConfig(kv_cache_memory_mb=16, weight_dtype="fp32"), root)
    assert report.weight_format == "fp32" and report.kernel_path == ""  # the reference mode the refusal points to
