"""The autoscaler's view of a router: samples of load over the ready replicas' capacity and the request rate
(`headroom.autoscaler.controller.AutoscalerController` calls the sampler; the router CLI wires them)."""

from __future__ import annotations

import math
from collections.abc import Callable

from headroom.autoscaler.policy import MetricsSample
from headroom.router.proxy import Router


def router_sampler(router: Router) -> Callable[[float], MetricsSample]:
    """Build samples from a router: utilisation = in-flight / capacity of ready replicas; request rate."""
    last = {"requests": float(router.counters["requests"]), "time_s": math.nan}

    def sample(now_s: float) -> MetricsSample:
        snaps = [s for s in router.snapshots() if s.ready and not s.ejected(now_s)]
        capacity = sum(s.capacity for s in snaps)
        load = sum(s.load() for s in snaps)
        requests = float(router.counters["requests"])
        dt = now_s - last["time_s"]
        rate = (requests - last["requests"]) / dt if dt > 0 else 0.0
        last["requests"], last["time_s"] = requests, now_s
        return MetricsSample(now_s, len(snaps), utilisation=min(1.0, load / capacity) if capacity else 0.0,
                             requests_per_s=rate, queue_depth=load)

    return sample
