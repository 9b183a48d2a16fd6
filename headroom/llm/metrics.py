"""Prometheus metrics of the LLM engine, on an injected registry (never the global default).

Naming: vLLM's metric names and meanings with the `vllm:` prefix replaced by `headroom_llm_`, and the
`model_name` label (so a vLLM dashboard works after a prefix rename):

    headroom_llm_time_to_first_token_seconds          histogram  arrival -> first output token
    headroom_llm_inter_token_latency_seconds          histogram  gap between consecutive output tokens
    headroom_llm_request_time_per_output_token_seconds histogram (e2e - TTFT) / (output tokens - 1) per request
    headroom_llm_e2e_request_latency_seconds          histogram  arrival -> finished
    headroom_llm_request_queue_time_seconds           histogram  arrival -> first scheduled
    headroom_llm_num_requests_running                 gauge      sequences in the running batch (running, waiting
                                                                 and KV usage: set after every step and every abort,
                                                                 so a disconnect shows within one engine step)
    headroom_llm_num_requests_waiting                 gauge      sequences waiting (incl. preempted)
    headroom_llm_kv_cache_usage_perc                  gauge      fraction of KV blocks in use (0..1)
    headroom_llm_prefix_cache_queries_total           counter    prompt tokens looked up in the prefix cache
    headroom_llm_prefix_cache_hits_total              counter    of those, tokens found cached
    headroom_llm_num_preemptions_total                counter    preemptions (recompute)
    headroom_llm_prompt_tokens_total                  counter    prompt tokens of requests that started
    headroom_llm_generation_tokens_total              counter    output tokens generated
    headroom_llm_request_success_total{finished_reason} counter  finished requests (stop | length | abort)
    headroom_llm_spec_decode_num_draft_tokens_total    counter    speculative tokens proposed (n-gram or draft model)
    headroom_llm_spec_decode_num_accepted_tokens_total counter    of those, accepted (rate = accepted / draft)
    headroom_llm_cold_start_seconds{stage}            gauge      time of each cold-start stage
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from headroom.llm.engine import StepStats
from headroom.llm.request import Request

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0)
_TOKEN_GAP_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
P = "headroom_llm_"


class LLMMetrics:
    """Implements EngineObserver; thread-safe (prometheus_client is), called from the engine thread."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        labels = ["model_name"]
        self._model = model_name

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(P + name, doc, labels, registry=registry, buckets=buckets)

        def counter(name: str, doc: str) -> Counter:
            return Counter(P + name, doc, labels, registry=registry)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(P + name, doc, labels, registry=registry)

        self.ttft = hist("time_to_first_token_seconds", "Time to first token.", _LATENCY_BUCKETS)
        self.itl = hist("inter_token_latency_seconds", "Inter-token latency.", _TOKEN_GAP_BUCKETS)
        self.tpot = hist(
            "request_time_per_output_token_seconds", "Time per output token per request.", _TOKEN_GAP_BUCKETS
        )
        self.e2e = hist("e2e_request_latency_seconds", "End-to-end request latency.", _LATENCY_BUCKETS)
        self.queue = hist("request_queue_time_seconds", "Time spent waiting before first scheduled.", _LATENCY_BUCKETS)
        self.running = gauge("num_requests_running", "Sequences in the running batch.")
        self.waiting = gauge("num_requests_waiting", "Sequences waiting to be scheduled.")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0..1).")
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.preemptions = counter("num_preemptions", "Preemptions (by recompute).")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of requests that started generating.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self.spec_draft = counter("spec_decode_num_draft_tokens", "Speculative tokens proposed.")
        self.spec_accepted = counter("spec_decode_num_accepted_tokens", "Speculative tokens accepted.")
        self.success = Counter(
            P + "request_success", "Finished requests.", ["model_name", "finished_reason"], registry=registry
        )
        self.cold_start = Gauge(
            P + "cold_start_seconds", "Cold-start stage durations.", ["model_name", "stage"], registry=registry
        )
        for g in (self.running, self.waiting, self.kv_usage):
            g.labels(model_name).set(0)

    def on_gauges(self, num_running: int, num_waiting: int, kv_cache_usage: float) -> None:
        """The engine's state now: after every step, abort and disconnect (never stale while idle)."""
        m = self._model
        self.running.labels(m).set(num_running)
        self.waiting.labels(m).set(num_waiting)
        self.kv_usage.labels(m).set(kv_cache_usage)

    def on_step(self, stats: StepStats) -> None:
        m = self._model
        self.on_gauges(stats.num_running, stats.num_waiting, stats.kv_cache_usage)
        self.prefix_queries.labels(m).inc(stats.prefix_queries_tokens)
        self.prefix_hits.labels(m).inc(stats.prefix_hits_tokens)
        self.preemptions.labels(m).inc(stats.num_preempted)
        self.prompt_tokens.labels(m).inc(stats.prompt_tokens)
        self.generation_tokens.labels(m).inc(stats.generation_tokens)
        self.spec_draft.labels(m).inc(stats.spec_draft_tokens)
        self.spec_accepted.labels(m).inc(stats.spec_accepted_tokens)

    def on_token(self, req: Request, now_s: float, first: bool) -> None:
        if first:
            self.ttft.labels(self._model).observe(now_s - req.arrival_s)
        elif req.last_token_s is not None:
            self.itl.labels(self._model).observe(now_s - req.last_token_s)

    def on_finish(self, req: Request, now_s: float) -> None:
        m = self._model
        self.e2e.labels(m).observe(now_s - req.arrival_s)
        if req.first_scheduled_s is not None:
            self.queue.labels(m).observe(req.first_scheduled_s - req.arrival_s)
        if req.first_token_s is not None and req.num_output_tokens > 1:
            self.tpot.labels(m).observe((now_s - req.first_token_s) / (req.num_output_tokens - 1))
        reason = req.finish_reason.value if req.finish_reason else "abort"
        self.success.labels(m, reason).inc()

    def set_cold_start(self, stages_s: Mapping[str, float]) -> None:
        for stage, seconds in stages_s.items():
            self.cold_start.labels(self._model, stage).set(seconds)
