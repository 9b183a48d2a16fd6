"""Live numbers for the dashboard's charts, derived server-side from the Prometheus registry.

    LiveSampler.point()  ->  read the registry now (a `Reading`), compare it with the reading one window ago
                             (`live_point`, pure)  ->  LivePoint: per model rate, p50/p99, queue, batch, KV ...

Rates are counter deltas over the window; p50/p99 come from histogram bucket deltas (`headroom.core.metric_window`,
`headroom.core.quantiles`); queue depth, KV-cache usage and running/waiting are the gauges as they are now.
Tensor models use `headroom.server.metrics` (label `model`), LLM models `headroom.llm.metrics` (label
`model_name`). There is no background task: the page's poll takes the reading, and the sampler keeps just
enough old readings to reach one window back (the first poll compares with the reading taken at start-up).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from headroom.core.clock import Clock
from headroom.core.metric_window import NO_LABELS, Reading, Readings, SeriesWindow, sum_by


@dataclass(frozen=True, slots=True)
class LiveModel:
    """One model's live numbers over the last window (None: not measured for this kind of model / window)."""

    name: str  # model name (`model` or `model_name` label)
    kind: str  # "tensor" (batcher) or "llm" (continuous-batching engine)
    rate_per_s: float | None  # successful requests per second
    error_rate_per_s: float | None  # failed (tensor: any other outcome) or aborted (llm) requests per second
    p50_s: float | None  # median end-to-end latency inside the server of requests finished in the window
    p99_s: float | None  # 99th percentile of the same
    queue_depth: float | None  # tensor: admitted, unfinished requests; llm: sequences waiting (gauge, now)
    mean_batch_size: float | None  # tensor: items per batch executed in the window
    busy_fraction: float | None  # tensor: executor busy seconds per second (>1 with several instances)
    running: float | None  # llm: sequences in the running batch (gauge, now)
    kv_cache_usage: float | None  # llm: fraction of KV-cache blocks in use, 0..1 (gauge, now)
    ttft_p50_s: float | None  # llm: median time to first token in the window
    ttft_p99_s: float | None  # llm: 99th percentile time to first token
    tokens_per_s: float | None  # llm: generated tokens per second


@dataclass(frozen=True, slots=True)
class LivePoint:
    """What one poll of `/dashboard/api/live` returns."""

    time_s: float  # seconds since the sampler started (the charts' x axis)
    window_s: float  # span the rates and percentiles cover (0 at the very first reading)
    inflight: float | None  # requests inside the server, all tensor models (gauge)
    replicas: int | None  # serving replicas when an autoscaler reports them (None: unknown)
    models: tuple[LiveModel, ...]  # sorted by kind, then name


def _tensor_model(w: SeriesWindow, m: str) -> LiveModel:
    p50, p99 = w.quantiles("headroom_request_duration_seconds", m)
    batches = w.increase("headroom_batch_size_count", m)
    return LiveModel(
        name=m, kind="tensor",
        rate_per_s=w.rate("headroom_requests_total", m, lambda d: d.get("outcome") == "success"),
        error_rate_per_s=w.rate("headroom_requests_total", m, lambda d: d.get("outcome") != "success"),
        p50_s=p50, p99_s=p99, queue_depth=w.gauge("headroom_queue_depth", m),
        mean_batch_size=w.increase("headroom_batch_size_sum", m) / batches if batches > 0 else None,
        busy_fraction=w.rate("headroom_busy_seconds_total", m), running=None, kv_cache_usage=None,
        ttft_p50_s=None, ttft_p99_s=None, tokens_per_s=None)


def _llm_model(w: SeriesWindow, m: str) -> LiveModel:
    p50, p99 = w.quantiles("headroom_llm_e2e_request_latency_seconds", m)
    ttft50, ttft99 = w.quantiles("headroom_llm_time_to_first_token_seconds", m)
    return LiveModel(
        name=m, kind="llm", rate_per_s=w.rate("headroom_llm_request_success_total", m,
                                            lambda d: d.get("finished_reason") != "abort"),
        error_rate_per_s=w.rate("headroom_llm_request_success_total", m,
                                lambda d: d.get("finished_reason") == "abort"),
        p50_s=p50, p99_s=p99, queue_depth=w.gauge("headroom_llm_num_requests_waiting", m),
        mean_batch_size=None, busy_fraction=None, running=w.gauge("headroom_llm_num_requests_running", m),
        kv_cache_usage=w.gauge("headroom_llm_kv_cache_usage_perc", m), ttft_p50_s=ttft50, ttft_p99_s=ttft99,
        tokens_per_s=w.rate("headroom_llm_generation_tokens_total", m))


def live_point(before: Reading, after: Reading, t0_s: float, replicas: int | None = None) -> LivePoint:
    """The live numbers of the window from `before` to `after` (pure). `replicas` overrides the registry's
    `headroom_autoscaler_desired_replicas`, if any."""
    tensor = SeriesWindow(before, after, "model")
    llm = SeriesWindow(before, after, "model_name")
    tensor_names: set[str] = set()
    for name in ("headroom_requests_total", "headroom_queue_depth", "headroom_request_duration_seconds_count"):
        tensor_names |= set(sum_by(after, name, "model"))
    llm_names = set(sum_by(after, "headroom_llm_num_requests_running", "model_name"))
    models = [_tensor_model(tensor, m) for m in sorted(tensor_names)]
    models += [_llm_model(llm, m) for m in sorted(llm_names)]
    if replicas is None:
        desired = after.values.get("headroom_autoscaler_desired_replicas", NO_LABELS).get(())
        replicas = int(desired) if desired is not None and math.isfinite(desired) else None
    inflight = after.values.get("headroom_inflight_requests", NO_LABELS).get(())
    return LivePoint(time_s=after.time_s - t0_s, window_s=max(0.0, after.time_s - before.time_s),
                     inflight=inflight, replicas=replicas, models=tuple(models))


class LiveSampler:
    """Readings of one registry on demand; `point()` compares now with about one window ago."""

    def __init__(self, registry: CollectorRegistry, clock: Clock, window_s: float = 5.0,
                 replicas: Callable[[], int | None] | None = None, max_readings: int = 1000) -> None:
        self._readings = Readings(registry, clock, window_s, max_readings)
        self._replicas = replicas

    def point(self) -> LivePoint:
        """Read the registry now and return the window's numbers."""
        before, now = self._readings.take()
        replicas = self._replicas() if self._replicas is not None else None
        return live_point(before, now, self._readings.t0_s, replicas)


def point_json(point: LivePoint) -> dict[str, Any]:
    """`point` as a JSON-ready dict (a non-finite number becomes null: JSON has no NaN)."""
    out = dataclasses.asdict(point)
    out["models"] = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in m.items()}
                     for m in out["models"]]
    if isinstance(point.inflight, float) and not math.isfinite(point.inflight):
        out["inflight"] = None
    return out
