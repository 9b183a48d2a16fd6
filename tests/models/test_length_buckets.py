"""The cheapest cuts of a length-sorted batch into encoder calls."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from headroom.models.builtin.length_buckets import DEFAULT_OVERHEAD_TOKENS, partition


def _cost(lengths: list[int], runs: list[tuple[int, int]], overhead: int) -> int:
    return sum(overhead + (end - start) * max(1, lengths[end - 1]) for start, end in runs)


def test_equal_lengths_run_in_one_call_and_a_cap_cuts_them() -> None:
    assert DEFAULT_OVERHEAD_TOKENS == 24
    assert partition([11] * 20, 24) == [(0, 20)]
    capped = partition([11] * 20, 24, max_size=8)
    assert len(capped) == 3 and all(end - start <= 8 for start, end in capped)
    assert partition([11] * 20, 0) == [(0, 20)]  # ties keep the longest run: no call for nothing


def test_a_cut_falls_where_padding_costs_more_than_a_call() -> None:
    # 10 sentences of 8 tokens and 2 of 40: one call pads 10 x 32 = 320 tokens; a second call costs 24
    assert partition([8] * 10 + [40] * 2, 24) == [(0, 10), (10, 12)]
    # 2 of 8 and 1 of 10: padding 2 x 2 = 4 tokens is cheaper than a call
    assert partition([8, 8, 10], 24) == [(0, 3)]
    assert partition([], 24) == []


@pytest.mark.parametrize("seed", range(25))
def test_the_partition_is_the_cheapest_one(seed: int) -> None:
    """Against every way of cutting up to 9 sorted lengths (2^8 cut sets), with and without a cap."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 10))
    lengths = sorted(int(x) for x in rng.integers(0, 60, size=n))
    overhead, cap = int(rng.integers(0, 50)), int(rng.integers(0, 5))
    runs = partition(lengths, overhead, cap)
    assert runs[0][0] == 0 and runs[-1][1] == n and all(a[1] == b[0] for a, b in itertools.pairwise(runs))
    assert all(cap == 0 or end - start <= cap for start, end in runs)
    best = None
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0, *(i + 1 for i, c in enumerate(cuts) if c), n]
        candidate = list(itertools.pairwise(bounds))
        if cap and any(end - start > cap for start, end in candidate):
            continue
        cost = _cost(lengths, candidate, overhead)
        best = cost if best is None else min(best, cost)
    assert _cost(lengths, runs, overhead) == best


@pytest.mark.parametrize(("overhead", "cap"), [(-1, 0), (0, -1)])
def test_negative_settings_are_refused(overhead: int, cap: int) -> None:
    with pytest.raises(ValueError):
        partition([1, 2], overhead, cap)
