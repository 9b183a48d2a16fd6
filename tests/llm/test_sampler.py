"""The numpy sampler (`headroom.llm.sampler`): filtered draws, per-request seeds, greedy ties, non-finite rows."""

from __future__ import annotations

import numpy as np

from headroom.llm.request import Request, SamplingParams
from headroom.llm.sampler import SamplingError, log_softmax, sample


def _req(params: SamplingParams, seed: int | None = 0) -> Request:
    gen = None if seed is None else np.random.default_rng(seed)
    return Request("r", [1, 2], params, arrival_s=0.0, seq_no=0, generator=gen)


def _draws(params: SamplingParams, row: np.ndarray, seed: int, n: int = 200) -> list[int]:
    req = _req(params, seed)
    out = []
    for _ in range(n):
        pick = sample(row[None, :].copy(), [req])[0]
        assert not isinstance(pick, Exception)
        out.append(pick[0])
    return out


def test_filtered_draws_land_only_on_kept_tokens() -> None:
    row = np.linspace(0.0, 3.0, 40, dtype=np.float32)  # token 39 most likely, then 38, ...
    assert set(_draws(SamplingParams(top_k=3), row, 1)) <= {37, 38, 39}
    top_p = _draws(SamplingParams(top_p=0.2), row, 2)
    assert set(top_p) <= {36, 37, 38, 39} and len(set(top_p)) > 1
    assert set(_draws(SamplingParams(min_p=0.5), row, 3)) <= {t for t in range(40) if row[t] >= 3.0 - np.log(2)}
    assert set(_draws(SamplingParams(logit_bias=((5, 100.0),)), row, 4, 20)) == {5}


def test_a_seed_reproduces_its_draws_and_other_seeds_differ() -> None:
    row = np.zeros(50, dtype=np.float32)
    assert _draws(SamplingParams(), row, 7) == _draws(SamplingParams(), row, 7)
    assert _draws(SamplingParams(), row, 7) != _draws(SamplingParams(), row, 8)


def test_greedy_takes_the_first_maximum_and_a_nan_row_fails_alone() -> None:
    logits = np.zeros((3, 8), dtype=np.float32)
    logits[0, [2, 5]] = 4.0
    logits[1, 3] = np.nan
    logits[2, 6] = 1.0
    greedy = SamplingParams(temperature=0.0, logprobs=2)
    picks = sample(logits, [_req(greedy, None) for _ in range(3)])
    assert picks[0][0] == 2 and isinstance(picks[1], SamplingError) and picks[2][0] == 6  # type: ignore[index]
    lp = picks[0][1]  # type: ignore[index]
    assert lp is not None and [t for t, _ in lp.top] == [2, 5]  # best first, ties by token id
    assert abs(float(np.exp(log_softmax(logits[2])).sum(dtype=np.float64)) - 1.0) < 1e-6
