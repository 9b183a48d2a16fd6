"""Prompt-lookup drafting and greedy verification."""

from __future__ import annotations

import numpy as np

from headroom.llm.request import SamplingParams
from headroom.llm.spec_decode import can_speculate, propose_ngram, verify_greedy


def test_propose_copies_what_followed_the_latest_match() -> None:
    assert propose_ngram([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 2) == (7, 1)  # latest earlier "1 2 3"
    assert propose_ngram([5, 6, 7, 8], 3) == ()  # no earlier occurrence of any suffix
    assert propose_ngram([4, 1, 4], 3) == (1, 4)
    assert propose_ngram([1, 2, 1], 0) == ()


def _onehot(ids: list[int], vocab: int = 10) -> np.ndarray:
    out = np.zeros((len(ids), vocab), dtype=np.float32)
    out[np.arange(len(ids)), ids] = 1.0
    return out


def test_verify_keeps_agreeing_prefix_then_models_token() -> None:
    assert verify_greedy(_onehot([3, 4, 8]), [3, 5]) == ([3, 4], 1)
    assert verify_greedy(_onehot([3, 5, 9]), [3, 5]) == ([3, 5, 9], 2)  # all accepted + bonus token
    assert verify_greedy(_onehot([6, 0, 0]), [3, 5]) == ([6], 0)


def test_only_greedy_plain_requests_speculate() -> None:
    assert can_speculate(SamplingParams(temperature=0.0))
    assert not can_speculate(SamplingParams(temperature=0.7))
    assert not can_speculate(SamplingParams(temperature=0.0, logprobs=1))
    assert not can_speculate(SamplingParams(temperature=0.0, frequency_penalty=0.5))
