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
