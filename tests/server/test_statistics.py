"""Triton-schema statistics from request and batch events."""

from __future__ import annotations

from headroom.core.types import StageTimings
from headroom.server.statistics import TritonStatistics


def test_requests_and_batches_fill_triton_fields_in_nanoseconds() -> None:
    stats = TritonStatistics()
    stats.on_batch(2, 0.004)
    timings = StageTimings(queue_ms=1.0, batch_wait_ms=1.5, preprocess_ms=0.5, compute_ms=4.0, postprocess_ms=0.25,
                           total_ms=6.0)
    stats.on_success(timings, 2, wall_ms=1_700_000_000_000)
    stats.on_success(timings, 2, wall_ms=1_700_000_000_005)
    stats.on_failure(0.002)
    out = stats.to_json("m", "1")
    inference = out["inference_stats"]
    assert isinstance(inference, dict)
    assert inference["success"] == {"count": 2, "ns": 12_000_000}
    assert inference["fail"] == {"count": 1, "ns": 2_000_000}
    assert inference["queue"] == {"count": 2, "ns": 2_000_000}
    assert inference["compute_input"]["ns"] == 1_000_000 and inference["compute_output"]["ns"] == 500_000
    assert inference["compute_infer"] == {"count": 2, "ns": 8_000_000}
    assert out["batch_stats"] == [{"batch_size": 2, "compute_input": {"count": 2, "ns": 1_000_000},
                                   "compute_infer": {"count": 1, "ns": 4_000_000},
                                   "compute_output": {"count": 2, "ns": 500_000}}]
    assert out["inference_count"] == 2 and out["execution_count"] == 1
    assert out["last_inference"] == 1_700_000_000_005
