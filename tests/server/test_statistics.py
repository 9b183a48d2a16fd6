"""Triton-schema statistics from request and batch events."""

from __future__ import annotations

from types import SimpleNamespace

from headroom.core.types import StageTimings
from headroom.gateway.usage import LLMUsage
from headroom.protocol.generated import headroom_inference_pb2 as pb
from headroom.server.grpc_admin import TritonAdminServicer
from headroom.server.statistics import LLMStatistics, TritonStatistics


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


def test_each_answered_request_is_response_zero_with_infer_and_output_time() -> None:
    """Triton's response_stats for a non-decoupled model: one response per request, keyed "0"."""
    stats = TritonStatistics()
    assert stats.to_json("m", "1")["response_stats"] == {}
    timings = StageTimings(queue_ms=1.0, batch_wait_ms=1.0, preprocess_ms=0.5, compute_ms=4.0, postprocess_ms=0.25,
                           total_ms=6.0)
    stats.on_success(timings, 2, wall_ms=1)
    stats.on_success(timings, 2, wall_ms=2)
    stats.on_failure(0.002)  # no per-stage times: counted in inference_stats.fail only
    zero = {"count": 0, "ns": 0}
    assert stats.to_json("m", "1")["response_stats"] == {"0": {
        "compute_infer": {"count": 2, "ns": 8_000_000}, "compute_output": {"count": 2, "ns": 500_000},
        "success": {"count": 2, "ns": 8_500_000}, "fail": zero, "empty_response": zero, "cancel": zero}}


def _usage(finish_reason: str) -> LLMUsage:
    return LLMUsage(prompt_tokens=5, completion_tokens=3, cached_tokens=0, preprocess_ms=1.0, queue_ms=2.0,
                    prefill_ms=3.0, decode_ms=6.0, total_ms=15.0, finish_reason=finish_reason)


def test_llm_requests_are_response_zero_failures_and_aborts_fail_and_cancel() -> None:
    llm = LLMStatistics()
    llm.on_usage(_usage("stop"))
    llm.on_usage(_usage("length"))
    llm.on_usage(_usage("error"))
    llm.on_usage(_usage("abort"))
    llm.on_refused(0.001)  # never reached the engine: no response
    out = llm.stats.to_json("llm", "")
    assert out["inference_stats"]["fail"] == {"count": 3, "ns": 31_000_000}  # type: ignore[index]
    assert out["response_stats"] == {"0": {
        "compute_infer": {"count": 2, "ns": 18_000_000},  # prefill + decode
        "compute_output": {"count": 2, "ns": 6_000_000},  # total - preprocess - queue - prefill - decode
        "success": {"count": 2, "ns": 24_000_000}, "fail": {"count": 1, "ns": 9_000_000},
        "empty_response": {"count": 0, "ns": 0}, "cancel": {"count": 1, "ns": 0}}}


async def test_grpc_model_statistics_carries_response_stats() -> None:
    stats = TritonStatistics()
    stats.on_batch(1, 0.004)
    stats.on_success(StageTimings(queue_ms=1.0, batch_wait_ms=1.0, preprocess_ms=0.5, compute_ms=4.0,
                                  postprocess_ms=0.25, total_ms=6.0), 1, wall_ms=7)
    row = {**stats.to_json("m", "1"), "queue_depth": 0, "cold_start": []}  # as DataPlane.model_stats adds
    dp = SimpleNamespace(model_stats=lambda name, version: [row])
    servicer = TritonAdminServicer(SimpleNamespace(dp=dp, settings=None))  # type: ignore[arg-type]
    reply = await servicer.ModelStatistics(pb.ModelStatisticsRequest(name="m"), None)
    (model,) = reply.model_stats
    first = model.response_stats["0"]
    assert list(model.response_stats) == ["0"] and first.success.count == 1 and first.success.ns == 4_250_000
    assert (first.compute_infer.ns, first.compute_output.ns, first.fail.count) == (4_000_000, 250_000, 0)
