"""Per-token latency bookkeeping: weighted percentiles and the TTFT / TPOT / ITL summary."""

from __future__ import annotations

import math

import numpy as np
import pytest

from headroom.sim.tokens import TokenStats, percentiles, weighted_percentiles


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weighted_percentiles_equal_numpy_on_the_expanded_array(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.lognormal(0.0, 1.0, size=40).tolist()
    weights = rng.integers(0, 50, size=40).tolist()
    qs = [0.0, 1.0, 25.0, 50.0, 90.0, 99.0, 99.9, 100.0]
    expected = np.percentile(np.repeat(values, weights), qs)
    assert weighted_percentiles(values, weights, qs) == pytest.approx(expected.tolist(), rel=1e-12)


def test_weighted_percentiles_edge_cases() -> None:
    assert all(math.isnan(v) for v in weighted_percentiles([], []))
    assert all(math.isnan(v) for v in weighted_percentiles([1.0, 2.0], [0, 0]))
    assert weighted_percentiles([3.0], [1], [0, 50, 100]) == [3.0, 3.0, 3.0]
    # 17 gaps of 10 ms and one of 20 ms: the p99 interpolates between the last two tokens.
    assert weighted_percentiles([0.020, 0.010], [1, 17], [50, 99]) == pytest.approx([0.010, 0.010 + 0.010 * 0.83])
    with pytest.raises(ValueError, match="length"):
        weighted_percentiles([1.0], [1, 2])
    with pytest.raises(ValueError, match=">= 0"):
        weighted_percentiles([1.0], [-1])
    with pytest.raises(ValueError, match="percentile"):
        weighted_percentiles([1.0], [1], [101])


def test_token_stats_summary() -> None:
    stats = TokenStats()
    empty = stats.summary()
    assert set(empty) == {f"{k}_s" for n in ("ttft", "tpot", "itl")
                          for k in (f"mean_{n}", f"{n}_p50", f"{n}_p90", f"{n}_p99")}
    assert all(math.isnan(v) for v in empty.values())
    stats.ttft_s.extend([0.1, 0.2, 0.3])
    stats.tpot_s.append(0.01)
    stats.itl_s.extend([0.01, 0.05, 0.09])
    stats.itl_weights.extend([3, 1, 0])  # a gap no token had counts for nothing
    s = stats.summary()
    assert s["ttft_p50_s"] == pytest.approx(0.2) and s["mean_ttft_s"] == pytest.approx(0.2)
    assert s["tpot_p99_s"] == pytest.approx(0.01)
    assert s["mean_itl_s"] == pytest.approx((3 * 0.01 + 0.05) / 4)
    assert s["itl_p50_s"] == pytest.approx(0.01)
    assert [s["itl_p90_s"], s["itl_p99_s"]] == pytest.approx(percentiles([0.01, 0.01, 0.01, 0.05], [90, 99]))
