"""vLLM's metric names, exactly: every `headroom_llm_*` series also exported as vLLM's `vllm:*` series with
vLLM's labels (`model_name`, `engine`), so vLLM's Grafana dashboards and alert rules work unchanged.

The aliases are made at scrape time from headroom's own metric objects (a `Collector`), so the engine's hot
path observes each value once and both names always agree. `VLLM_NAMES` maps vLLM's name to headroom's;
`vllm:time_per_output_token_seconds` is the inter-token latency (vLLM's older name for
`vllm:inter_token_latency_seconds`) and `vllm:gpu_cache_usage_perc` the KV usage (older name for
`vllm:kv_cache_usage_perc`). `engine` is the engine index, always "0" (one engine per model); like vLLM,
`vllm:admission_rejections` has no `engine` label. The set is pinned to vLLM 0.33.0's PrometheusStatLogger:
`tests/server/data/vllm_metrics.json` (made by `scripts/vllm_metric_names.py` from the wheel) lists its series,
and the live-server test checks each one a vLLM server always exports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

VLLM_PREFIX = "vllm:"
ENGINE_INDEX = "0"

#: vLLM's name (without the prefix) -> headroom's name (without `headroom_llm_`)
VLLM_NAMES: Mapping[str, str] = {
    "num_requests_running": "num_requests_running",
    "num_requests_waiting": "num_requests_waiting",
    "kv_cache_usage_perc": "kv_cache_usage_perc",
    "prefix_cache_queries": "prefix_cache_queries",
    "prefix_cache_hits": "prefix_cache_hits",
    "num_preemptions": "num_preemptions",
    "prompt_tokens": "prompt_tokens",
    "generation_tokens": "generation_tokens",
    "request_success": "request_success",
    "time_to_first_token_seconds": "time_to_first_token_seconds",
    "inter_token_latency_seconds": "inter_token_latency_seconds",
    "time_per_output_token_seconds": "inter_token_latency_seconds",
    "request_time_per_output_token_seconds": "request_time_per_output_token_seconds",
    "e2e_request_latency_seconds": "e2e_request_latency_seconds",
    "request_queue_time_seconds": "request_queue_time_seconds",
    "request_inference_time_seconds": "request_inference_time_seconds",
    "request_prefill_time_seconds": "request_prefill_time_seconds",
    "request_decode_time_seconds": "request_decode_time_seconds",
    "request_prompt_tokens": "request_prompt_tokens",
    "request_generation_tokens": "request_generation_tokens",
    "request_max_num_generation_tokens": "request_max_num_generation_tokens",
    "request_params_n": "request_params_n",
    "request_params_max_tokens": "request_params_max_tokens",
    "iteration_tokens_total": "iteration_tokens_total",
    "spec_decode_num_draft_tokens": "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens": "spec_decode_num_accepted_tokens",
    "spec_decode_num_drafts": "spec_decode_num_drafts",
    "spec_decode_num_accepted_tokens_per_pos": "spec_decode_num_accepted_tokens_per_pos",
    "cache_config_info": "cache_config_info",
    "gpu_cache_usage_perc": "kv_cache_usage_perc",  # vLLM < 0.10's name, which older dashboards still query
    # vLLM 0.33's PrometheusStatLogger, series exported on every server (tests/server/data/vllm_metrics.json)
    "num_requests_waiting_by_reason": "num_requests_waiting_by_reason",
    "prompt_tokens_by_source": "prompt_tokens_by_source",
    "prompt_tokens_cached": "prompt_tokens_cached",
    "prompt_tokens_cached_by_source": "prompt_tokens_cached_by_source",
    "request_num_preemptions": "request_num_preemptions",
    "request_prefill_kv_computed_tokens": "request_prefill_kv_computed_tokens",
    "admission_rejections": "admission_rejections",
    "engine_sleep_state": "engine_sleep_state",
    "external_prefix_cache_queries": "external_prefix_cache_queries",
    "external_prefix_cache_hits": "external_prefix_cache_hits",
    "mm_cache_queries": "mm_cache_queries",
    "mm_cache_hits": "mm_cache_hits",
}

#: vLLM series labelled without `engine` (vLLM counts them in the frontend, not per engine core)
NO_ENGINE_LABEL = frozenset({"admission_rejections"})


class VllmAliases(Collector):
    """Re-exports headroom metric families under vLLM's names, adding vLLM's `engine` label."""

    def __init__(self, sources: Mapping[str, MetricWrapperBase]) -> None:
        self._sources = dict(sources)  # full vLLM family name -> headroom metric object

    def collect(self) -> Iterable[Metric]:
        for name, metric in self._sources.items():
            for family in metric.collect():
                alias = Metric(name, family.documentation, family.type)
                for s in family.samples:
                    suffix = s.name[len(family.name) :]
                    engine = {} if name[len(VLLM_PREFIX) :] in NO_ENGINE_LABEL else {"engine": ENGINE_INDEX}
                    labels = {**s.labels, **engine}
                    alias.add_sample(name + suffix, labels, s.value, s.timestamp, s.exemplar)
                yield alias


def register_vllm_aliases(registry: CollectorRegistry, metrics: Mapping[str, MetricWrapperBase]) -> None:
    """Export `metrics` (headroom's short name -> metric object) under every vLLM name in `VLLM_NAMES`."""
    missing = set(VLLM_NAMES.values()) - set(metrics)
    if missing:
        raise ValueError(f"vLLM aliases name headroom metrics that do not exist: {sorted(missing)}")
    registry.register(VllmAliases({VLLM_PREFIX + v: metrics[h] for v, h in VLLM_NAMES.items()}))
