"""What a simulation run counted, turned into a `SimResult`, and the autoscaler's periodic sample.

Both are pure functions of the counters the engine keeps (`headroom.sim.engine.Simulator`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from headroom.autoscaler.policy import AutoscalerConfig, MetricsSample
from headroom.autoscaler.policy import decide as autoscale_decide
from headroom.sim.config import SimResult
from headroom.sim.state import ScaleState
from headroom.sim.tokens import TokenStats

_WINDOW = 512  # samples kept for the autoscaler's policy


@dataclass(frozen=True, slots=True)
class Tally:
    """The engine's counters at the end of a run (requests before the warm-up cut are left out)."""

    offered: int
    completed_latencies_s: list[float]
    rejected: int
    expired: int
    wait_sum_s: float  # summed queue waits of completed requests
    batches: int
    batch_items: int
    busy_s: float  # replica-seconds spent executing batches
    ready_s: float  # replica-seconds spent ready
    max_queue_depth: int
    queue_at_end: int


def build_result(t: Tally, tokens: TokenStats, first_s: float, end_s: float,
                 timeline: tuple[tuple[float, int], ...], wall_s: float) -> SimResult:
    """The run's summary: throughput over [first_s, end_s], latency percentiles, token timings."""
    lat = np.asarray(t.completed_latencies_s, dtype=np.float64)
    duration = max(end_s - first_s, 1e-12)
    done = int(lat.size)
    pct = np.percentile(lat, [50, 95, 99]) if done else np.array([math.nan] * 3)
    tok = tokens.summary()
    return SimResult(
        offered=t.offered, completed=done, rejected=t.rejected, expired=t.expired, duration_s=duration,
        throughput_per_s=done / duration, mean_latency_s=float(lat.mean()) if done else math.nan,
        p50_latency_s=float(pct[0]), p95_latency_s=float(pct[1]), p99_latency_s=float(pct[2]),
        max_latency_s=float(lat.max()) if done else math.nan,
        mean_wait_s=t.wait_sum_s / done if done and not tokens.ttft_s else math.nan,
        mean_ttft_s=tok["mean_ttft_s"], ttft_p50_s=tok["ttft_p50_s"], ttft_p90_s=tok["ttft_p90_s"],
        ttft_p99_s=tok["ttft_p99_s"], mean_tpot_s=tok["mean_tpot_s"], tpot_p50_s=tok["tpot_p50_s"],
        tpot_p90_s=tok["tpot_p90_s"], tpot_p99_s=tok["tpot_p99_s"], mean_itl_s=tok["mean_itl_s"],
        itl_p50_s=tok["itl_p50_s"], itl_p90_s=tok["itl_p90_s"], itl_p99_s=tok["itl_p99_s"],
        utilisation=t.busy_s / t.ready_s if t.ready_s > 0 else 0.0, busy_s=t.busy_s,
        mean_batch_size=t.batch_items / t.batches if t.batches else 0.0,
        max_queue_depth=t.max_queue_depth, queue_at_end=t.queue_at_end,
        replica_timeline=timeline, wall_s=wall_s, latencies_s=lat)


def autoscale_step(st: ScaleState, cfg: AutoscalerConfig, now_s: float, busy_s: float, ready: int,
                   queue_depth: int) -> int:
    """Sample the fleet since the previous tick (utilisation, arrival rate, queue depth), ask the autoscaler's
    policy, update `st`, and return the replica count it wants."""
    span = now_s - st.last_t
    util = (busy_s - st.last_busy) / (max(1, ready) * span) if span > 0 else 0.0
    rate = (st.arrivals - st.last_arrivals) / span if span > 0 else 0.0
    st.window.append(MetricsSample(time_s=now_s, ready_replicas=ready, utilisation=min(1.0, util),
                                   requests_per_s=rate, queue_depth=queue_depth))
    del st.window[: max(0, len(st.window) - _WINDOW)]
    decision, st.scaler = autoscale_decide(st.window, st.scaler, now_s, cfg)
    st.last_busy, st.last_t, st.last_arrivals = busy_s, now_s, st.arrivals
    return decision.replicas
