"""The autoscaler's mechanism: sample the fleet, call the pure policy every sync period, drive an Actuator.

    sample(now) ─► window of MetricsSample ─► policy.decide(window, state, now, config) ─► actuator.scale_to

Scaling events are logged, kept in `events`, and exported on an injected Prometheus registry:

    headroom_autoscaler_desired_replicas            gauge
    headroom_autoscaler_utilisation                 gauge: the window-averaged normalised load acted on
    headroom_autoscaler_scaling_events_total{direction}   counter: up | down
    headroom_replica_cold_start_seconds{stage}      histogram: [scheduled (Ray) |] spawn | listening | ready
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from headroom.autoscaler.actuator import Actuator, ColdStartTiming
from headroom.autoscaler.policy import AutoscalerConfig, AutoscalerState, MetricsSample, decide
from headroom.core.clock import Clock

log = logging.getLogger("headroom.autoscaler")

COLD_START_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    """One change of the desired replica count."""

    time_s: float  # when it was decided
    from_replicas: int  # desired count before
    to_replicas: int  # desired count after
    utilisation: float  # normalised load the decision acted on
    reason: str  # the policy's reason ("scale_up" / "scale_down")


class AutoscalerMetrics:
    """The autoscaler's metric families on one injected registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.desired = Gauge("headroom_autoscaler_desired_replicas", "Desired serving replicas.",
                             registry=registry)
        self.actual = Gauge("headroom_autoscaler_actual_replicas", "Ready replicas at the latest sample.",
                            registry=registry)
        self.utilisation = Gauge("headroom_autoscaler_utilisation", "Window-averaged normalised load.",
                                 registry=registry)
        self.events = Counter("headroom_autoscaler_scaling_events", "Scaling events.", ["direction"],
                              registry=registry)
        self.cold_start = Histogram("headroom_replica_cold_start_seconds", "Replica start, by stage.", ["stage"],
                                    buckets=COLD_START_BUCKETS_S, registry=registry)

    def observe_cold_start(self, cs: ColdStartTiming) -> None:
        scheduled_s = getattr(cs, "scheduled_s", None)  # Ray replicas: until the actor was placed and running
        if isinstance(scheduled_s, float):
            self.cold_start.labels("scheduled").observe(scheduled_s)
        self.cold_start.labels("spawn").observe(cs.spawn_s)
        self.cold_start.labels("listening").observe(cs.listening_s)
        self.cold_start.labels("ready").observe(cs.ready_s)


class AutoscalerController:
    """Samples every `sample_interval_s`, decides every `sync_interval_s` (HPA sync period: 15 s)."""

    def __init__(self, sample: Callable[[float], MetricsSample], actuator: Actuator, config: AutoscalerConfig,
                 clock: Clock, *, initial_replicas: int = 1, sample_interval_s: float = 1.0,
                 sync_interval_s: float = 15.0, registry: CollectorRegistry | None = None) -> None:
        if sample_interval_s <= 0 or sync_interval_s < sample_interval_s:
            raise ValueError("need 0 < sample_interval_s <= sync_interval_s")
        self.sample = sample
        self.actuator = actuator
        self.config = config
        self.clock = clock
        self.sample_interval_s = sample_interval_s
        self.sync_interval_s = sync_interval_s
        self.state = AutoscalerState(replicas=initial_replicas)
        self.window: list[MetricsSample] = []
        self.events: list[ScaleEvent] = []
        self.metrics = AutoscalerMetrics(registry) if registry is not None else None
        self._last_sync_s = -math.inf
        self._cold_starts_seen = 0
        self._scaling: asyncio.Task[None] | None = None

    async def step(self) -> ScaleEvent | None:
        """Take one sample; when a sync period has passed, decide and (if it changed) scale."""
        now = self.clock.now_s()
        self.window.append(self.sample(now))
        if self.metrics is not None:
            self.metrics.actual.set(self.window[-1].ready_replicas)
        horizon = max(self.config.window_s, self.config.scale_down_stabilisation_s)
        self.window = [s for s in self.window if now - s.time_s <= horizon]
        if now - self._last_sync_s < self.sync_interval_s:
            return None
        self._last_sync_s = now
        before = self.state.replicas
        decision, self.state = decide(self.window, self.state, now, self.config)
        if self.metrics is not None:
            self.metrics.desired.set(decision.replicas)
            if not math.isnan(decision.utilisation):
                self.metrics.utilisation.set(decision.utilisation)
        event = None
        if decision.replicas != before:
            event = ScaleEvent(now, before, decision.replicas, decision.utilisation, decision.reason)
            self.events.append(event)
            log.info("event=scale from_replicas=%d to_replicas=%d utilisation=%.3f reason=%s", before,
                     decision.replicas, decision.utilisation, decision.reason)
            if self.metrics is not None:
                self.metrics.events.labels("up" if decision.replicas > before else "down").inc()
        if self._scaling is None or self._scaling.done():  # one actuation at a time; cold starts take long
            self._scaling = asyncio.create_task(self._actuate(decision.replicas, decision.warm_pool))
        return event

    async def _actuate(self, replicas: int, warm_pool: int) -> None:
        try:
            await self.actuator.scale_to(replicas, warm_pool)
        except Exception:
            log.exception("scaling to %d replicas (+%d warm) failed; retrying at the next sync", replicas, warm_pool)
        self._export_cold_starts()

    async def settle(self) -> None:
        """Wait for the actuation in progress, if any."""
        if self._scaling is not None:
            await self._scaling

    async def close(self) -> None:
        """Cancel an actuation in progress (the run() task is cancelled by its owner)."""
        if self._scaling is not None and not self._scaling.done():
            self._scaling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scaling

    def _export_cold_starts(self) -> None:
        starts: list[ColdStartTiming] = list(getattr(self.actuator, "cold_starts", []))
        if self.metrics is not None:
            for cs in starts[self._cold_starts_seen:]:
                self.metrics.observe_cold_start(cs)
        self._cold_starts_seen = len(starts)

    async def run(self) -> None:
        """Loop until cancelled; then cancel any actuation in progress."""
        try:
            while True:
                await self.step()
                await asyncio.sleep(self.sample_interval_s)
        finally:
            await self.close()
