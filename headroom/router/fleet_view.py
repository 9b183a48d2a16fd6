"""The dashboard's fleet view, served by the router: every replica's numbers over the last window.

    GET /dashboard/api/fleet  ->  FleetSampler.point()  ->  read the router's registry now, compare it with the
                                  reading one window ago (`fleet_point`, pure)  ->  FleetPoint

The numbers are the router's own (`headroom.router.metrics`): attempts and failures per replica as counter
deltas, p50/p99 from the attempt-latency histogram's bucket deltas, and outstanding attempts, readiness,
ejection and peak-EWMA latency as the gauges are now; the autoscaler's desired replicas when it shares the
registry. Behind `headroom route` the page shows this next to the per-model view of one replica.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from headroom.core.clock import Clock
from headroom.core.metric_window import Reading, Readings, SeriesWindow

_REQUESTS = "headroom_router_replica_requests_total"
_FAILURES = "headroom_router_replica_failures_total"
_LATENCY = "headroom_router_attempt_latency_seconds"


@dataclass(frozen=True, slots=True)
class FleetReplica:
    """One replica as the router sees it over the last window (None: nothing to measure yet)."""

    replica: str  # the replica's id
    state: str  # "ready" | "ejected" (outlier detection) | "not_ready" (failing readiness checks)
    rate_per_s: float | None  # attempts sent to it per second
    failure_rate_per_s: float | None  # of which failed, per second
    p50_s: float | None  # median attempt latency, seen from the router
    p99_s: float | None  # 99th percentile of the same
    outstanding: float  # attempts in flight there now
    ewma_latency_s: float  # the peak-EWMA latency the routing policies use


@dataclass(frozen=True, slots=True)
class FleetPoint:
    """What one poll of `/dashboard/api/fleet` returns."""

    time_s: float  # seconds since the sampler started
    window_s: float  # span the rates and percentiles cover
    desired_replicas: int | None  # the autoscaler's desired count, when one shares the registry
    inflight: float | None  # requests inside the router now
    replicas: tuple[FleetReplica, ...]  # sorted by id


def _gauge(r: Reading, name: str, replica: str) -> float:
    for labels, v in r.values.get(name, {}).items():
        if ("replica", replica) in labels:
            return v
    return 0.0


def _state(after: Reading, replica: str) -> str:
    if not _gauge(after, "headroom_router_replica_ready", replica):
        return "not_ready"
    return "ejected" if _gauge(after, "headroom_router_replica_ejected", replica) else "ready"


def fleet_point(before: Reading, after: Reading, t0_s: float) -> FleetPoint:
    """The fleet's numbers over the window from `before` to `after` (pure)."""
    w = SeriesWindow(before, after, "replica")
    names = sorted({dict(labels)["replica"] for labels in after.values.get(_REQUESTS, {})
                    if "replica" in dict(labels)})
    replicas = []
    for name in names:
        p50, p99 = w.quantiles(_LATENCY, name)
        replicas.append(FleetReplica(
            replica=name, state=_state(after, name), rate_per_s=w.rate(_REQUESTS, name),
            failure_rate_per_s=w.rate(_FAILURES, name), p50_s=p50, p99_s=p99,
            outstanding=_gauge(after, "headroom_router_replica_outstanding", name),
            ewma_latency_s=_gauge(after, "headroom_router_replica_ewma_latency_seconds", name)))
    desired = after.values.get("headroom_autoscaler_desired_replicas", {}).get(())
    inflight = after.values.get("headroom_router_inflight", {}).get(())
    return FleetPoint(time_s=after.time_s - t0_s, window_s=max(0.0, after.time_s - before.time_s),
                      desired_replicas=int(desired) if desired is not None and math.isfinite(desired) else None,
                      inflight=inflight, replicas=tuple(replicas))


class FleetSampler:
    """Readings of the router's registry on demand; `point()` compares now with about one window ago."""

    def __init__(self, registry: CollectorRegistry, clock: Clock, window_s: float = 5.0) -> None:
        self._readings = Readings(registry, clock, window_s)

    def point(self) -> FleetPoint:
        before, now = self._readings.take()
        return fleet_point(before, now, self._readings.t0_s)


def fleet_json(point: FleetPoint) -> dict[str, Any]:
    """`point` as a JSON-ready dict (non-finite numbers become null)."""
    out = dataclasses.asdict(point)
    out["replicas"] = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
                       for r in out["replicas"]]
    return out
