from __future__ import annotations

import numpy as np
import pytest

from headroom.loadgen.collector import Collector
from headroom.loadgen.histogram import LatencyHistogram
from headroom.loadgen.records import RequestRecord, Slo


def _rec(i: int, t: float, latency_s: float, ok: bool = True, status: str = "200", **kw: object) -> RequestRecord:
    return RequestRecord(i, t, t, t + latency_s, ok, status, latency_s, **kw)  # type: ignore[arg-type]


def test_histogram_percentiles_match_numpy_within_hdr_precision() -> None:
    values = np.random.default_rng(0).lognormal(mean=-4, sigma=1, size=20_000)
    hist = LatencyHistogram()
    for v in values:
        hist.record_s(float(v))
    for p in (50, 90, 99, 99.9):
        assert hist.percentile_ms(p) == pytest.approx(np.percentile(values, p) * 1000, rel=0.01)
    assert hist.count == 20_000 and hist.encode()


def test_goodput_errors_stages_and_timeseries() -> None:
    col = Collector(Slo(p99_ms=100.0, ttft_ms=50.0), window_s=1.0)
    col.add(_rec(0, 0.0, 0.02, ttft_s=0.01, server_timing_ms=(("queue", 1.0), ("infer", 3.0))))
    col.add(_rec(1, 0.5, 0.20))  # over the e2e bound (the p99 bound applies per request when e2e is unset)
    col.add(_rec(2, 1.0, 0.03, ttft_s=0.08))  # over the TTFT bound
    col.add(_rec(3, 1.5, 0.01, ok=False, status="503", error="full"))
    col.add(_rec(4, 2.0, 0.01, server_timing_ms=(("queue", 3.0),)))
    s = col.summary()
    assert s["counts"] == {
        "completed": 5,
        "ok": 4,
        "errors": 1,
        "by_status": {"200": 4, "503": 1},
        "error_examples": {"503": "full"},
    }
    assert col.good == 2 and s["goodput"]["fraction"] == pytest.approx(0.4)
    assert col.over_bound_count(100.0) == 2  # one slow + one failed
    assert col.stage_summary()["queue"]["mean_ms"] == pytest.approx(2.0)
    ts = col.timeseries()
    assert ts["t_s"] == [1.0, 2.0, 3.0]
    # By completion time: 0.02, 0.7 | 1.03, 1.51 (the 503) | 2.01.
    assert ts["completed_per_s"] == [2.0, 2.0, 1.0] and ts["errors_per_s"] == [0.0, 1.0, 0.0]
    assert col.duration_s() == pytest.approx(2.01)
