"""Percentiles from Prometheus histogram buckets (headroom.core.quantiles): known answers, edge cases and
agreement with the exact percentile of the observations, through a real prometheus_client histogram."""

from __future__ import annotations

import math

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram

from headroom.core.metric_window import Reading, read_registry
from headroom.core.quantiles import bucket_deltas, histogram_quantile, window_quantiles

INF = math.inf


def test_interpolates_inside_the_bucket_holding_the_rank() -> None:
    buckets = [(0.1, 0.0), (0.2, 10.0), (0.5, 10.0), (INF, 10.0)]  # ten observations in (0.1, 0.2]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.15)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.199)
    assert histogram_quantile(1.0, buckets) == pytest.approx(0.2)
    # The first bucket starts at 0; a rank on a bucket's edge is that bucket's upper bound.
    assert histogram_quantile(0.5, [(1.0, 4.0), (INF, 4.0)]) == pytest.approx(0.5)
    assert histogram_quantile(0.5, [(1.0, 2.0), (2.0, 4.0), (INF, 4.0)]) == pytest.approx(1.0)
    # Leading empty buckets are skipped even for q = 0.
    assert histogram_quantile(0.0, buckets) == pytest.approx(0.1)


def test_rank_in_the_inf_bucket_and_empty_histograms() -> None:
    assert histogram_quantile(0.99, [(0.1, 1.0), (0.2, 2.0), (INF, 100.0)]) == 0.2
    assert histogram_quantile(0.5, [(INF, 3.0)]) is None  # nothing finite to report
    assert histogram_quantile(0.5, [(0.1, 0.0), (INF, 0.0)]) is None
    with pytest.raises(ValueError, match=r"0\.99 for p99"):
        histogram_quantile(99, [(INF, 1.0)])
    with pytest.raises(ValueError, match="Inf"):
        histogram_quantile(0.5, [(0.1, 1.0)])


def test_window_is_the_difference_of_two_readings_and_survives_a_reset() -> None:
    before = {0.1: 5.0, 0.2: 5.0, INF: 5.0}
    after = {0.1: 5.0, 0.2: 15.0, INF: 15.0}
    assert bucket_deltas(before, after) == [(0.1, 0.0), (0.2, 10.0), (INF, 10.0)]
    assert window_quantiles(before, after, (0.5,)) == [pytest.approx(0.15)]
    restarted = {0.1: 2.0, 0.2: 2.0, INF: 2.0}
    assert bucket_deltas(after, restarted) == sorted(restarted.items())
    assert window_quantiles(before, {}, (0.5, 0.99)) == [None, None]
    assert window_quantiles(before, before, (0.5,)) == [None]  # nothing new in the window


@pytest.mark.parametrize("seed", [0, 1])
def test_agrees_with_the_exact_percentile_within_a_bucket_width(seed: int) -> None:
    rng = np.random.default_rng(seed)
    bounds = tuple(round(0.01 * i, 2) for i in range(1, 101))  # 10 ms buckets up to 1 s
    registry = CollectorRegistry()
    h = Histogram("lat_seconds", "latency", buckets=bounds, registry=registry)
    warm = rng.uniform(0.5, 1.0, size=500)  # before the window: must not count
    for v in warm:
        h.observe(float(v))
    before = read_registry(registry, 0.0)
    window = np.minimum(rng.gamma(2.0, 0.1, size=5000), 0.999)
    for v in window:
        h.observe(float(v))
    after = read_registry(registry, 1.0)

    def by_le(r: Reading) -> dict[float, float]:
        values = r.values["lat_seconds_bucket"]
        return {float(dict(labels)["le"]): v for labels, v in values.items()}

    got = window_quantiles(by_le(before), by_le(after), (0.5, 0.9, 0.99))
    exact = np.percentile(window, [50, 90, 99])
    # The estimate lies in the bucket holding rank q * n; the exact value within one observation of it, so at
    # worst in the next bucket where observations are sparse (the tail): two bucket widths.
    for g, e in zip(got, exact, strict=True):
        assert g is not None and abs(g - e) <= 0.0201
    assert got[0] is not None and abs(got[0] - exact[0]) <= 0.0101
