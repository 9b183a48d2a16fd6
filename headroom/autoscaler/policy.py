"""The autoscaling policy: decide(metrics window, state, now, config) -> (decision, new state). Pure.

Load is normalised to a utilisation-like ratio `u` = metric per ready replica / `per_replica_full`:

* ``utilisation``           mean busy fraction of the replicas (per_replica_full = 1.0)
* ``requests_per_replica``  request rate per replica / the rate one replica sustains (KEDA example: 40 req/s)
* ``queue_depth``           queued + in-flight requests per replica / the depth one replica holds within SLO

Rules (Kubernetes HPA behaviour, thresholds from the simulator page: up above 75%, down below 25%):

* `u` is averaged over the last `window_s` (HPA sync period 15 s) of samples.
* Above `scale_up_utilisation` the recommendation is ceil(current x u / target_utilisation); below
  `scale_down_utilisation` likewise; in between it stays (the band is the hysteresis).
* Scale-up has no stabilisation (HPA default 0 s) but at most max(2x, +4) per `scale_up_period_s` (HPA:
  100% or 4 pods per 15 s). Scale-down takes the highest recommendation of the last
  `scale_down_stabilisation_s` (HPA: 300 s), so a sawtooth shorter than that never scales down, and no
  scale-down happens within `cooldown_s` of the last scale event.
* The result is clamped to [min_replicas, max_replicas]; `warm_pool` replicas are kept started but idle
  (textbook: warm pools hide cold starts that otherwise compound during bursts).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

METRICS = ("utilisation", "requests_per_replica", "queue_depth")


@dataclass(frozen=True, slots=True)
class MetricsSample:
    """One scrape of the fleet."""

    time_s: float  # when it was taken
    ready_replicas: int  # replicas serving traffic at that time
    utilisation: float = 0.0  # mean busy fraction across ready replicas, 0..1
    requests_per_s: float = 0.0  # total request rate over the fleet
    queue_depth: int = 0  # total queued + in-flight requests over the fleet


@dataclass(frozen=True, slots=True)
class AutoscalerConfig:
    """Targets and damping."""

    metric: str = "utilisation"  # utilisation | requests_per_replica | queue_depth
    per_replica_full: float = 1.0  # the metric value (per replica) that counts as 100% busy
    scale_up_utilisation: float = 0.75  # simulator page: scale up when utilisation > 75%
    scale_down_utilisation: float = 0.25  # simulator page: scale down when utilisation < 25%
    target_utilisation: float = 0.5  # where a scaling step aims (middle of the band)
    window_s: float = 15.0  # averaging window (HPA sync period 15 s)
    scale_up_period_s: float = 15.0  # HPA scaleUp policy period: at most max(2x, +4) per period
    scale_up_max_step: int = 4  # HPA scaleUp: 4 pods per period (or 100%, whichever is more)
    scale_down_stabilisation_s: float = 300.0  # HPA scaleDown stabilizationWindowSeconds 300
    cooldown_s: float = 60.0  # no scale-down this soon after a scale event (ours; KEDA: 300 for ->0)
    min_replicas: int = 1  # simulator page: keep minReplicas = 1 alive (cold starts take minutes)
    max_replicas: int = 8  # simulator page KEDA example: maxReplicaCount 8
    warm_pool: int = 1  # started-but-idle replicas kept ready to take traffic at once

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"unknown autoscaling metric {self.metric!r}; use one of {', '.join(METRICS)}")
        if not 0 < self.scale_down_utilisation < self.target_utilisation < self.scale_up_utilisation:
            raise ValueError("need 0 < scale_down_utilisation < target_utilisation < scale_up_utilisation")
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError("need 0 <= min_replicas <= max_replicas and max_replicas >= 1")
        if self.per_replica_full <= 0 or self.window_s <= 0 or self.warm_pool < 0:
            raise ValueError("per_replica_full and window_s must be > 0, warm_pool >= 0")


@dataclass(frozen=True, slots=True)
class AutoscalerState:
    """What the policy remembers between calls."""

    replicas: int = 1  # the current desired replica count
    last_scale_s: float = -math.inf  # time of the last change (either direction)
    period_start_s: float = -math.inf  # start of the current scale-up rate-limit period
    period_base: int = 1  # replica count at the start of that period
    recommendations: tuple[tuple[float, int], ...] = ()  # (time, recommendation) within the down window


@dataclass(frozen=True, slots=True)
class AutoscaleDecision:
    """The policy's answer."""

    replicas: int  # desired serving replicas
    warm_pool: int  # desired started-but-idle replicas on top
    utilisation: float  # the window-averaged normalised load it acted on (nan without samples)
    reason: str  # "scale_up" | "scale_down" | "hold" | "no_data" | "clamped"


def normalised_load(sample: MetricsSample, cfg: AutoscalerConfig) -> float:
    """The sample's load per ready replica as a fraction of `per_replica_full`."""
    n = max(1, sample.ready_replicas)
    if cfg.metric == "utilisation":
        per = sample.utilisation
    elif cfg.metric == "requests_per_replica":
        per = sample.requests_per_s / n
    else:
        per = sample.queue_depth / n
    return per / cfg.per_replica_full


def decide(window: Sequence[MetricsSample], state: AutoscalerState, now_s: float,
           cfg: AutoscalerConfig) -> tuple[AutoscaleDecision, AutoscalerState]:
    """One autoscaling evaluation (call it every sync period, e.g. 15 s, or whenever a sample arrives)."""
    current = min(cfg.max_replicas, max(cfg.min_replicas, state.replicas))
    recent = [s for s in window if now_s - cfg.window_s < s.time_s <= now_s]
    if not recent:
        return AutoscaleDecision(current, cfg.warm_pool, math.nan, "no_data"), state
    u = sum(normalised_load(s, cfg) for s in recent) / len(recent)
    # Total load in replica units, sample by sample: a sample taken before new replicas came up weighs its
    # per-replica load by the replicas that served it then (not by today's count, which would inflate it).
    total = sum(normalised_load(s, cfg) * max(1, s.ready_replicas) for s in recent) / len(recent)
    if u > cfg.scale_up_utilisation or u < cfg.scale_down_utilisation:
        raw = math.ceil(total / cfg.target_utilisation - 1e-9)
    else:
        raw = current
    raw = min(cfg.max_replicas, max(cfg.min_replicas, raw))
    recs = (*((t, r) for t, r in state.recommendations if now_s - t < cfg.scale_down_stabilisation_s),
            (now_s, raw))
    period_start, period_base = state.period_start_s, state.period_base
    if now_s - period_start >= cfg.scale_up_period_s:
        period_start, period_base = now_s, current
    if raw > current:
        cap = max(2 * period_base, period_base + cfg.scale_up_max_step)
        desired = max(current, min(raw, cap))
        reason = "scale_up" if desired > current else "clamped"
    else:
        stabilised = max(r for _, r in recs)
        cooling = now_s - state.last_scale_s < cfg.cooldown_s
        desired = current if cooling else min(current, stabilised)
        reason = "scale_down" if desired < current else "hold"
    changed = desired != current
    new_state = AutoscalerState(
        replicas=desired,
        last_scale_s=now_s if changed else state.last_scale_s,
        period_start_s=period_start,
        period_base=period_base,
        recommendations=recs,
    )
    return AutoscaleDecision(desired, cfg.warm_pool, u, reason), new_state
