"""LLM metrics: vLLM's per-request histograms from a sequence's timestamps, and the `vllm:` aliases."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from headroom.llm.metrics import LLMMetrics
from headroom.llm.request import FinishReason, Request, SamplingParams
from headroom.llm.vllm_metrics import register_vllm_aliases

LABELS = {"model_name": "m"}
VLLM = {"model_name": "m", "engine": "0"}


def _finished(seq: str, parent: str, n: int, outputs: int) -> Request:
    req = Request(seq, [1, 2, 3], SamplingParams(n=n, max_tokens=50), arrival_s=10.0, seq_no=0, parent_id=parent)
    req.token_ids += [5] * outputs
    req.first_scheduled_s, req.first_token_s, req.last_token_s = 10.5, 11.0, 13.0
    req.finish_reason = FinishReason.LENGTH
    return req


def test_stage_times_token_counts_and_params_once_per_request() -> None:
    registry = CollectorRegistry()
    metrics = LLMMetrics(registry, "m")
    metrics.on_finish(_finished("r#0", "r", 2, 4), now_s=13.0)

    def value(name: str, labels: dict[str, str] = LABELS) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("headroom_llm_request_prefill_time_seconds_sum") == pytest.approx(0.5)
    assert value("headroom_llm_request_decode_time_seconds_sum") == pytest.approx(2.0)
    assert value("headroom_llm_request_inference_time_seconds_sum") == pytest.approx(2.5)
    assert value("headroom_llm_request_generation_tokens_sum") == 4
    assert value("headroom_llm_request_prompt_tokens_count") in (None, 0.0)  # the sibling is still running
    metrics.on_finish(_finished("r#1", "r", 2, 7), now_s=13.0)
    assert value("headroom_llm_request_prompt_tokens_sum") == 3
    assert value("headroom_llm_request_max_num_generation_tokens_sum") == 7
    assert value("headroom_llm_request_params_n_sum") == 2
    assert value("headroom_llm_request_params_max_tokens_sum") == 50
    assert value("headroom_llm_request_generation_tokens_count") == 2
    # the vLLM names carry the same values with vLLM's labels
    assert value("vllm:request_decode_time_seconds_sum", VLLM) == pytest.approx(4.0)
    assert value("vllm:request_success_total", {**VLLM, "finished_reason": "length"}) == 2
    assert value("vllm:num_requests_running", VLLM) == 0


def test_aliases_refuse_a_missing_source() -> None:
    registry = CollectorRegistry()
    only = Histogram("headroom_llm_x", "x", registry=registry)
    with pytest.raises(ValueError, match="do not exist"):
        register_vllm_aliases(registry, {"x": only})


def test_vllm_033_series_prompt_sources_preemptions_waiting_and_rejections() -> None:
    registry = CollectorRegistry()
    metrics = LLMMetrics(registry, "m")

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {**LABELS, **labels})

    req = _finished("r", "r", 1, 3)
    req.num_cached_tokens, req.num_preemptions = 2, 3
    metrics.on_token(req, now_s=11.0, first=True)
    assert value("headroom_llm_prompt_tokens_by_source_total", source="local_compute") == 1
    assert value("headroom_llm_prompt_tokens_by_source_total", source="local_cache_hit") == 2
    assert value("headroom_llm_prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    assert value("headroom_llm_prompt_tokens_cached_total") == 2
    assert value("headroom_llm_prompt_tokens_cached_by_source_total", source="device") == 2
    assert value("headroom_llm_prompt_tokens_cached_by_source_total", source="disk") == 0
    metrics.on_token(req, now_s=11.5, first=False)  # later tokens count nothing more
    assert value("headroom_llm_prompt_tokens_cached_total") == 2
    metrics.on_finish(req, now_s=13.0)
    assert value("headroom_llm_request_num_preemptions_sum") == 3
    assert value("headroom_llm_request_num_preemptions_bucket", le="2.0") == 0
    assert value("headroom_llm_request_prefill_kv_computed_tokens_sum") == 1
    metrics.on_gauges(num_running=2, num_waiting=5, kv_cache_usage=0.5)
    assert value("headroom_llm_num_requests_waiting_by_reason", reason="capacity") == 5
    assert value("headroom_llm_num_requests_waiting_by_reason", reason="deferred") == 0
    metrics.on_rejected("max_num_queued_reqs")
    assert value("headroom_llm_admission_rejections_total", reason="max_num_queued_reqs") == 1
    assert value("headroom_llm_admission_rejections_total", reason="max_num_queued_tokens") == 0
    assert registry.get_sample_value("vllm:admission_rejections_total",
                                     {"model_name": "m", "reason": "max_num_queued_reqs"}) == 1  # no engine label
    assert registry.get_sample_value("vllm:prompt_tokens_cached_total", VLLM) == 2
    assert registry.get_sample_value("vllm:engine_sleep_state", {**VLLM, "sleep_state": "awake"}) == 1
    assert registry.get_sample_value("vllm:gpu_cache_usage_perc", VLLM) == 0.5
