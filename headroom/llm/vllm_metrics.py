"""vLLM's metric names, exactly: every `headroom_llm_*` series also exported as vLLM's `vllm:*` series with
vLLM's labels (`model_name`, `engine`), so vLLM's Grafana dashboards and alert rules work unchanged.

The aliases are made at scrape time from headroom's own metric objects (a `Collector`), so the engine's hot
path observes each value once and both names always agree. `VLLM_NAMES` maps vLLM's name to headroom's;
`vllm:time_per_output_token_seconds` is the inter-token latency (vLLM's older name for
`vllm:inter_token_latency_seconds`). `engine` is the engine index, always "0" (one engine per model).
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
}


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
                    labels = {**s.labels, "engine": ENGINE_INDEX}
                    alias.add_sample(name + suffix, labels, s.value, s.timestamp, s.exemplar)
                yield alias


def register_vllm_aliases(registry: CollectorRegistry, metrics: Mapping[str, MetricWrapperBase]) -> None:
    """Export `metrics` (headroom's short name -> metric object) under every vLLM name in `VLLM_NAMES`."""
    missing = set(VLLM_NAMES.values()) - set(metrics)
    if missing:
        raise ValueError(f"vLLM aliases name headroom metrics that do not exist: {sorted(missing)}")
    registry.register(VllmAliases({VLLM_PREFIX + v: metrics[h] for v, h in VLLM_NAMES.items()}))
