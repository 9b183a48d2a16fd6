"""One benchmark run: workload + schedule + client + scraper + collector -> a JSON-able result.

The result carries the full configuration and the environment (machine, date, command line), the load
model (open-loop arrival or closed-loop concurrency, always labelled), the scenario verdict, and every
measurement the collector made.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import math
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from headroom.core.clock import Clock, MonotonicClock
from headroom.loadgen.arrivals import ArrivalSpec, make_schedule, mean_rate_per_s
from headroom.loadgen.clients import ClientConfig, ProtocolClient, make_client
from headroom.loadgen.collector import Collector, LiveSnapshot
from headroom.loadgen.dispatcher import (
    DispatchConfig,
    DispatchStats,
    DispatchTarget,
    run_closed_loop,
    run_open_loop,
)
from headroom.loadgen.records import Slo
from headroom.loadgen.scenarios import CONFIDENCE, ScenarioPlan, judge_offline, judge_tail, plan_scenario
from headroom.loadgen.scrape import MetricsScraper, ScrapeLog
from headroom.loadgen.sweep import BisectConfig, BisectState, find_peak_rate
from headroom.loadgen.workloads import WorkloadSpec, make_workload

RESULT_SCHEMA = "headroom.bench/1"


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """Everything one run needs."""

    client: ClientConfig  # where and how to send
    scenario: str = "server"  # server | offline | single-stream | multi-stream
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)  # open-loop schedule (server scenario)
    closed_concurrency: int = 0  # > 0: closed loop with this many workers, whatever the scenario says
    duration_s: float = 10.0  # closed-loop length, and offline's query count is rate * duration
    num_queries: int = 0  # offline / closed loop: stop after this many queries (0 = derived)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)  # dataset
    slo: Slo = field(default_factory=Slo)  # SLOs for goodput and validity
    seed: int = 0  # seeds the schedule and the dataset
    metrics_url: str = ""  # Prometheus endpoint; "" = {url}/metrics for HTTP protocols; "none" = off
    scrape_interval_s: float = 1.0  # seconds between scrapes
    warmup_queries: int = 0  # queries sent (and discarded) before the measured run
    confidence: float = CONFIDENCE  # MLPerf early-stopping confidence (0 = plain fraction check)
    window_s: float = 1.0  # time-series window
    late_threshold_ms: float = 10.0  # an open-loop send further than this behind schedule counts as late
    max_late_fraction: float = 0.01  # a run with more late sends than this fraction is not VALID
    label: str = ""  # free text for reports (e.g. "batching on")
    command_line: str = ""  # how the run was started, recorded in the result

    def __post_init__(self) -> None:
        plan_scenario(self.scenario)
        if self.closed_concurrency < 0 or self.num_queries < 0 or self.warmup_queries < 0:
            raise ValueError("closed_concurrency, num_queries and warmup_queries must be >= 0")
        if self.duration_s <= 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """A finished run: the JSON-able result plus the raw material for plots."""

    result: dict[str, Any]  # what `--json` writes
    collector: Collector  # records and histograms (plots)
    scrape: ScrapeLog  # /metrics series over time (plots)


def environment() -> dict[str, Any]:
    """Machine, OS, Python, CPU affinity, date and command line."""
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        affinity = []
    from headroom import __version__

    return {
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "generator_cpus": affinity,
        "headroom_version": __version__,
        "argv": sys.argv,
    }


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [_jsonable(v) for v in obj]
    return obj


def load_label(config: BenchConfig, plan: ScenarioPlan) -> str:
    """How the load was offered, in words; closed-loop runs always say so."""
    if config.closed_concurrency > 0 or plan.mode == "closed":
        workers = config.closed_concurrency or plan.concurrency
        return f"closed-loop, concurrency {workers} (latency coordinated with the server)"
    if plan.all_at_once:
        return "offline: every query sent at t=0"
    spec = config.arrival
    return f"open-loop {spec.kind} arrivals, mean {mean_rate_per_s(spec):g}/s"


def _metrics_url(config: BenchConfig) -> str:
    if config.metrics_url == "none":
        return ""
    if config.metrics_url:
        return config.metrics_url
    if config.client.protocol in ("v2-grpc", "image"):
        return ""
    return config.client.url.rstrip("/") + "/metrics"


async def _warmup(client: ProtocolClient, config: BenchConfig, samples: list[Any]) -> None:
    for i in range(config.warmup_queries):
        await client.send(samples[i % len(samples)])


async def run_bench(
    config: BenchConfig,
    clock: Clock | None = None,
    on_progress: Callable[[LiveSnapshot, float], None] | None = None,
    progress_interval_s: float = 0.5,
) -> RunOutcome:
    """Run one benchmark; `on_progress(snapshot, elapsed_s)` is called from an owned task while it runs."""
    clock = clock or MonotonicClock()
    plan = plan_scenario(config.scenario)
    rng = np.random.default_rng(config.seed)
    samples = make_workload(config.workload, np.random.default_rng(config.seed + 1))
    closed = config.closed_concurrency > 0 or plan.mode == "closed"
    if plan.all_at_once:
        count = config.num_queries or max(1, round(config.arrival.rate_per_s * config.arrival.duration_s))
        schedule = np.zeros(count, dtype=np.float64)
    else:
        schedule = make_schedule(config.arrival, rng)
    dispatch = DispatchConfig(
        mode="closed" if closed else "open",
        concurrency=config.closed_concurrency or plan.concurrency,
        duration_s=config.duration_s,
        max_queries=config.num_queries,
        max_in_flight=config.client.max_connections if plan.all_at_once else 0,
        samples_per_query=plan.samples_per_query,
        # Offline queues everything at t=0 on purpose: waiting for a connection is not lateness there.
        late_threshold_ms=math.inf if plan.all_at_once else config.late_threshold_ms,
    )
    collector = Collector(config.slo, window_s=config.window_s)
    client = make_client(config.client, clock)
    scraper = MetricsScraper(_metrics_url(config), clock, config.scrape_interval_s) if _metrics_url(config) else None
    progress_task: asyncio.Task[None] | None = None
    try:
        await _warmup(client, config, samples)
        t0_s = clock.now_s()
        if scraper is not None:
            scraper.start(t0_s)
        if on_progress is not None:
            progress_task = asyncio.get_running_loop().create_task(
                _report_progress(collector, clock, t0_s, on_progress, progress_interval_s), name="bench-progress"
            )
        target = DispatchTarget(samples, client, clock, collector.add)
        if closed:
            stats = await run_closed_loop(target, dispatch)
        else:
            stats = await run_open_loop(schedule, target, dispatch)
    finally:
        if progress_task is not None:
            progress_task.cancel()
            await asyncio.gather(progress_task, return_exceptions=True)
        if scraper is not None:
            await scraper.stop()
        await client.aclose()
    if on_progress is not None:
        on_progress(collector.snapshot(collector.last_end_s + config.window_s), collector.last_end_s)
    result = _result(config, plan, collector, stats, scraper.log if scraper else ScrapeLog(), schedule.size)
    return RunOutcome(result=result, collector=collector, scrape=scraper.log if scraper else ScrapeLog())


async def _report_progress(
    collector: Collector,
    clock: Clock,
    t0_s: float,
    on_progress: Callable[[LiveSnapshot, float], None],
    interval_s: float,
) -> None:
    while True:
        await asyncio.sleep(interval_s)
        elapsed_s = clock.now_s() - t0_s
        on_progress(collector.snapshot(elapsed_s), elapsed_s)


def _result(
    config: BenchConfig,
    plan: ScenarioPlan,
    collector: Collector,
    stats: DispatchStats,
    scrape: ScrapeLog,
    scheduled: int,
) -> dict[str, Any]:
    measured = collector.summary()
    bound_ms = config.slo.p99_ms
    failed = collector.completed - collector.ok
    if plan.percentile == 0:
        verdict = judge_offline(collector.completed, failed)
    else:
        verdict = judge_tail(
            collector.completed,
            collector.over_bound_count(bound_ms) if bound_ms > 0 else failed,
            bound_ms,
            late_sends=stats.late_sends,
            percentile=plan.percentile,
            confidence=config.confidence,
            max_late_fraction=config.max_late_fraction,
            require_bound=plan.needs_bound,
        )
    latency = collector.latency.summary()
    headline = {
        "p99_ms": latency["p99_ms"],
        "p90_ms": latency["p90_ms"],
        "throughput": collector.ok / collector.duration_s(),
    }[plan.metric]
    return {
        "schema": RESULT_SCHEMA,
        "label": config.label,
        "config": _jsonable(config),
        "environment": environment() | {"command_line": config.command_line},
        "load": {
            "mode": stats.mode,
            "label": load_label(config, plan),
            "scheduled_queries": scheduled if stats.mode == "open" else stats.queries_sent,
            "offered_rate_per_s": mean_rate_per_s(config.arrival) if stats.mode == "open" else None,
        },
        "generator": {
            "queries_sent": stats.queries_sent,
            "late_sends": stats.late_sends,
            "late_fraction": stats.late_sends / stats.queries_sent if stats.queries_sent else 0.0,
            "max_send_lag_ms": stats.max_send_lag_ms,
            "mean_send_lag_ms": stats.mean_send_lag_ms,
            "fell_behind": stats.late_sends > 0,
            "wall_s": stats.wall_s,
        },
        "scenario": {
            "name": plan.name,
            "metric": plan.metric,
            "value": headline,
            "samples_per_query": plan.samples_per_query,
            "valid": verdict.valid,
            "reasons": list(verdict.reasons),
            "over_bound": verdict.over_bound,
            "min_queries": verdict.min_queries,
        },
        **measured,
        "server_metrics": scrape.to_json(),
    }


async def sweep_peak_rate(
    base: BenchConfig,
    bisect: BisectConfig,
    on_probe: Callable[[float, RunOutcome], None] | None = None,
    clock: Clock | None = None,
) -> tuple[BisectState, list[dict[str, Any]]]:
    """Bisect for the highest rate whose Server-scenario run is VALID; returns the state and every probe's result."""
    results: list[dict[str, Any]] = []

    async def probe(rate_per_s: float) -> bool:
        config = dataclasses.replace(
            base,
            scenario="server",
            closed_concurrency=0,
            arrival=dataclasses.replace(base.arrival, rate_per_s=rate_per_s),
            label=f"{base.label or 'sweep'} @ {rate_per_s:.4g}/s",
        )
        outcome = await run_bench(config, clock=clock)
        results.append(outcome.result)
        if on_probe is not None:
            on_probe(rate_per_s, outcome)
        return bool(outcome.result["scenario"]["valid"])

    state = await find_peak_rate(probe, bisect)
    return state, results
