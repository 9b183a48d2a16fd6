"""Prometheus metrics for tensor models, on a registry the composition root owns (never the global one).

Names (label `model`, plus `version` where useful) — modelled on Triton's `nv_inference_*` families, in
seconds as Prometheus recommends:

    headroom_requests_total{model,version,outcome}     outcome = success|rejected|timeout|cancelled|error
    headroom_queue_wait_seconds{model}                 histogram: batch-queue wait after preprocessing
    headroom_batch_wait_seconds{model}                 histogram: admission → batch start
    headroom_preprocess_seconds{model}                 histogram
    headroom_compute_seconds{model}                    histogram: the batched predict call
    headroom_postprocess_seconds{model}                histogram
    headroom_request_duration_seconds{model}           histogram: end to end inside the server
    headroom_batch_size{model}                         histogram: summed items per executed batch
    headroom_batch_requests{model}                     histogram: requests per executed batch
    headroom_queue_depth{model}                        gauge: admitted, unfinished requests
    headroom_inflight_requests                         gauge: requests inside the server (all models)
    headroom_busy_seconds_total{model}                 counter: executor busy time
    headroom_duty_cycle{model}                         gauge: busy share of the last 60 s (read at scrape)
    headroom_batch_window_seconds{model}               gauge: window the last batch used (adaptive mode)
    headroom_cold_start_seconds{model,version,stage}   gauge: read_weights, build_session, warmup, ...
    headroom_precomputed_lookups_total{model,result}   counter: hit|miss against `serve --precomputed`
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Metric

from headroom.core.clock import Clock, MonotonicClock
from headroom.core.types import StageTimings
from headroom.server.duty_cycle import DutyCycleWindow
from headroom.server.stage_histograms import StageHistograms
from headroom.server.statistics import TritonStatistics

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServerMetrics:
    """All tensor-model metric families, registered on one injected registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter("headroom_requests", "Requests by outcome.", ["model", "version", "outcome"],
                                registry=registry)
        # the six per-request stage histograms, observed together from the event loop (stage_histograms.py)
        self.stages = StageHistograms((
            ("headroom_queue_wait_seconds", "Batch-queue wait after preprocessing."),
            ("headroom_batch_wait_seconds", "Admission to batch start."),
            ("headroom_preprocess_seconds", "Per-request preprocessing."),
            ("headroom_compute_seconds", "Batched model execution."),
            ("headroom_postprocess_seconds", "Per-request postprocessing."),
            ("headroom_request_duration_seconds", "End-to-end time inside the server."),
        ), LATENCY_BUCKETS_S, registry)
        self.batch_size = Histogram("headroom_batch_size", "Items per executed batch.", ["model"],
                                    buckets=BATCH_BUCKETS, registry=registry)
        self.batch_requests = Histogram("headroom_batch_requests", "Requests per executed batch.", ["model"],
                                        buckets=BATCH_BUCKETS, registry=registry)
        self.queue_depth = Gauge("headroom_queue_depth", "Admitted, unfinished requests.", ["model"],
                                 registry=registry)
        self.inflight = Gauge("headroom_inflight_requests", "Requests inside the server.", registry=registry)
        self.busy = Counter("headroom_busy_seconds", "Executor busy time.", ["model"], registry=registry)
        self.duty_cycle = Gauge("headroom_duty_cycle", "Busy share of executor instances over the last 60 s.",
                                ["model"],
                                registry=registry)
        self.window = Gauge("headroom_batch_window_seconds", "Batching window of the last batch.", ["model"],
                            registry=registry)
        self.precomputed = Counter("headroom_precomputed_lookups", "Precomputed-prediction lookups by result.",
                                   ["model", "result"], registry=registry)
        self.cold_start = Gauge("headroom_cold_start_seconds", "Model cold-start stage durations.",
                                ["model", "version", "stage"], registry=registry)
        self._counters: dict[tuple[str, str, str], Counter] = {}  # labelled `requests` children
        self._duty: dict[str, DutyCycleWindow] = {}  # per model (its versions share it)

    def duty_window(self, model: str, instances: int, clock: Clock) -> DutyCycleWindow:
        """The model's sliding-window duty cycle, bound to `headroom_duty_cycle{model}` (read at scrape)."""
        window = self._duty.get(model)
        if window is None:
            window = self._duty[model] = DutyCycleWindow(max(1, instances))
            self.duty_cycle.labels(model).set_function(lambda: window.duty_cycle(clock.now_s()))
        return window

    def observe_request(self, model: str, version: str, outcome: str, timings: StageTimings | None) -> None:
        counter = self._counters.get((model, version, outcome))
        if counter is None:  # `labels()` costs microseconds per call: look each child up once
            counter = self._counters[(model, version, outcome)] = self.requests.labels(model, version, outcome)
        counter.inc()
        if timings is None:
            return
        t = timings
        self.stages.observe(model, (t.queue_ms / 1e3, t.batch_wait_ms / 1e3, t.preprocess_ms / 1e3,
                                    t.compute_ms / 1e3, t.postprocess_ms / 1e3, t.total_ms / 1e3))


class ModelObserver:
    """Adapts batcher events for one model version to ServerMetrics and to its Triton statistics
    (implements BatcherObserver)."""

    def __init__(self, metrics: ServerMetrics, model: str, instances: int, clock: Clock | None = None) -> None:
        self._m = metrics
        self._model = model
        self._clock: Clock = clock or MonotonicClock()
        self._duty = metrics.duty_window(model, instances, self._clock)  # read at each scrape: decays when idle
        self.execution_count = 0  # batches executed
        self.inference_count = 0  # items executed (sum of batch sizes)
        self.compute_total_s = 0.0  # summed predict time
        self._depth: Gauge | None = None  # the queue-depth gauge's child for this model
        self._batch: tuple[Histogram, Histogram, Gauge] | None = None  # batch size, requests, window children
        self._busy: Counter | None = None  # the busy-seconds counter's child
        self.stats = TritonStatistics()  # the statistics extension's counters for this version

    def on_queue_depth(self, depth: int) -> None:
        if self._depth is None:  # looked up on first use, so the series appears with the first request
            self._depth = self._m.queue_depth.labels(self._model)
        self._depth.set(depth)

    def on_batch(self, batch_size: int, num_requests: int, compute_s: float, window_s: float) -> None:
        self.execution_count += 1
        self.inference_count += batch_size
        self.compute_total_s += compute_s
        self.stats.on_batch(batch_size, compute_s)
        if self._batch is None:  # children looked up once, on first use (the series appear with the first batch)
            m = self._m
            self._batch = (m.batch_size.labels(self._model), m.batch_requests.labels(self._model),
                           m.window.labels(self._model))
        sizes, requests, window = self._batch
        sizes.observe(batch_size)
        requests.observe(num_requests)
        window.set(window_s)

    def on_busy(self, busy_s: float) -> None:
        self._duty.add_busy(self._clock.now_s(), busy_s)
        if self._busy is None:
            self._busy = self._m.busy.labels(self._model)
        self._busy.inc(busy_s)


class OnlySeries:
    """A registry's page restricted to the named series (Prometheus' `name[]` filter). Unlike
    `restricted_registry`, it also sees collectors that register no names up front (the LLM fleet's merged
    per-model registries), by filtering what every collector yields."""

    def __init__(self, registry: CollectorRegistry, names: Iterable[str]) -> None:
        self._registry = registry
        self._names = frozenset(names)

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            samples = [s for s in family.samples if s.name in self._names]
            if samples:
                kept = Metric(family.name, family.documentation, family.type, family.unit)
                kept.samples = samples
                yield kept
