"""The quality gate's arithmetic and verdict (policy on plain numbers), and its record in the cache."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from headroom.llm.quality import (
    CORPUS,
    QualityGateError,
    QualityThresholds,
    TeacherForced,
    gate_status,
    judge,
    measure,
    read_result,
    windows,
    write_result,
)

LIMITS = QualityThresholds()


def test_windows_are_whole_and_non_overlapping() -> None:
    ids = list(range(10))
    assert windows(ids, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # the ragged tail is dropped
    assert windows(ids, 4, max_tokens=7) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="fewer than one window"):
        windows(ids, 16)


@pytest.mark.parametrize(
    ("ppl", "agreement", "ok"),
    [(10.05, 0.99, True), (9.95, 0.97, True), (10.2, 0.99, False), (9.8, 0.99, False), (10.0, 0.969, False)],
)
def test_gate_needs_perplexity_within_one_percent_and_97_percent_agreement(
    ppl: float, agreement: float, ok: bool
) -> None:
    passed, verdict = judge(ppl, 10.0, agreement, LIMITS)
    assert passed is ok
    assert verdict.startswith("passed" if ok else "FAILED") and f"{ppl:.4f}" in verdict and "10.0000" in verdict


def test_measure_scores_perplexity_and_agreement_then_the_record_gates_loading(tmp_path: Path) -> None:
    nll = np.full(8, math.log(12.0))
    ref = TeacherForced(np.full(8, math.log(12.0)), np.arange(8))
    good = TeacherForced(nll, np.arange(8))
    result = measure(good, ref, "gguf:Q4_1+Q8_0", Path("m.gguf"), CORPUS, 512, LIMITS)
    assert result.passed and result.top1_agreement == 1.0 and result.ppl_native == pytest.approx(12.0)
    assert result.scored_tokens == 8 and len(result.corpus_sha256) == 64
    assert "not measured" in gate_status(tmp_path, "gguf:Q4_1+Q8_0", "m")
    write_result(tmp_path, result)
    assert read_result(tmp_path, "gguf:Q4_1+Q8_0") == result
    assert "passed" in gate_status(tmp_path, "gguf:Q4_1+Q8_0", "m")
    one_off = TeacherForced(nll, np.where(np.arange(8) == 3, 99, np.arange(8)))  # 7/8 agree: < 97%
    failed = measure(one_off, ref, "gguf:Q4_0", Path("m.gguf"), CORPUS, 512, LIMITS)
    assert not failed.passed and failed.top1_agreement == 0.875
    write_result(tmp_path, failed)
    assert read_result(tmp_path, "gguf:Q4_1+Q8_0") == result  # formats are recorded side by side
    with pytest.raises(QualityGateError, match=r"refused by the quality gate.*87\.50%"):
        gate_status(tmp_path, "gguf:Q4_0", "m")
    write_result(tmp_path, replace(failed, passed=True))  # re-measured: the newest record wins
    assert "gguf:Q4_0" in gate_status(tmp_path, "gguf:Q4_0", "m")


def test_shipped_corpus_is_large_enough_and_small() -> None:
    text = CORPUS.read_text(encoding="utf-8")
    assert len(CORPUS.read_bytes()) < 200_000 and len(text.split()) > 20_000 * 0.6  # ~39k tokens (README)
    assert "gutenberg" not in text.lower()
    assert (CORPUS.parent / "README.md").exists()
