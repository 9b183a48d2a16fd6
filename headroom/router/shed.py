"""Admission as pure policies: coordinated shedding and the adaptive (Vegas) concurrency limit.

* Coordinated shedding (textbook, "coordinated load shedding"): the router sees the aggregate load of every
  replica against their summed capacity and rejects the same uniform fraction of new requests everywhere,
  ramping linearly from `start_utilisation` to 100% (random early detection), with a Retry-After. As in RED
  (Floyd & Jacobson 1993) the ramp follows the utilisation *averaged* over `average_window_s` (capped by the
  current one), so a transient burst (a replica dying and its share moving to the survivors, a short stall)
  is queued rather than shed; a fleet at or above its full capacity right now still rejects everything new
  (RED's tail drop).
* Adaptive concurrency limit, Vegas style (Netflix concurrency-limits `VegasLimit`): queue estimate
  `limit x (1 - minRTT/RTT)`; grow by beta-ish steps while the queue is short, shrink when it is long.

`admit` combines both into the one admission decision every transport (HTTP and gRPC) asks for.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from headroom.router.snapshot import ReplicaSnapshot

# ----------------------------------------------------------------------------------- adaptive concurrency


@dataclass(frozen=True, slots=True)
class VegasConfig:
    """Netflix concurrency-limits VegasLimit defaults unless noted."""

    initial_limit: int = 20  # Netflix: initial limit 20
    min_limit: int = 1  # lowest limit (Netflix uses 1 as the floor)
    max_limit: int = 1000  # Netflix: max limit 1000
    probe_multiplier: int = 30  # re-measure minRTT about every probe_multiplier x limit samples (Netflix: 30)
    probe_concurrency: int = 3  # concurrency pinned while re-measuring minRTT (Envoy gradient controller: 3)

    def __post_init__(self) -> None:
        if not 1 <= self.min_limit <= self.initial_limit <= self.max_limit:
            raise ValueError("need 1 <= min_limit <= initial_limit <= max_limit")
        if self.probe_multiplier < 1 or self.probe_concurrency < 1:
            raise ValueError("probe_multiplier and probe_concurrency must be >= 1")


@dataclass(frozen=True, slots=True)
class VegasState:
    """The limiter's estimate."""

    limit: float = 20.0  # learned concurrency limit (restored after a probe)
    min_rtt_s: float = 0.0  # no-load RTT measured by the last probe (0 = unknown)
    samples_since_probe: int = 0  # samples since the last probe
    probing: bool = True  # re-measuring minRTT: admit only `probe_concurrency` until a sample arrives

    def effective_limit(self, cfg: VegasConfig) -> int:
        """What the admission check should enforce right now."""
        return cfg.probe_concurrency if self.probing else max(1, int(self.limit))


def vegas_initial(cfg: VegasConfig) -> VegasState:
    """Start by probing minRTT at pinned low concurrency, then grow from `initial_limit`."""
    return VegasState(limit=float(cfg.initial_limit))


def vegas_update(state: VegasState, rtt_s: float, inflight: int, dropped: bool,
                 cfg: VegasConfig) -> VegasState:
    """Fold one finished request (its RTT, the in-flight count when it started, whether it was dropped).

    While probing, the first sample taken at <= `probe_concurrency` in flight becomes the new minRTT (as
    Envoy's gradient controller re-measures minRTT at pinned concurrency); samples at higher concurrency
    (requests admitted before the probe began) are ignored.
    """
    if rtt_s <= 0:
        raise ValueError(f"rtt_s must be > 0, got {rtt_s}")
    if state.probing:
        if inflight <= cfg.probe_concurrency:
            return VegasState(state.limit, rtt_s, 0, False)
        return state
    samples = state.samples_since_probe + 1
    if samples >= cfg.probe_multiplier * max(state.limit, 1.0):
        return VegasState(state.limit, state.min_rtt_s, 0, True)
    min_rtt = min(state.min_rtt_s, rtt_s)
    limit = state.limit
    log_limit = max(math.log10(max(limit, 1.0)), 1.0)
    alpha, beta, threshold = 3 * log_limit, 6 * log_limit, log_limit
    if dropped:
        new = limit - log_limit
    elif inflight * 2 < limit:
        new = limit  # app-limited: not enough traffic to learn anything
    else:
        queue = limit * (1.0 - min_rtt / rtt_s)
        if queue <= threshold:
            new = limit + beta
        elif queue < alpha:
            new = limit + log_limit
        elif queue > beta:
            new = limit - log_limit
        else:
            new = limit
    return VegasState(min(float(cfg.max_limit), max(float(cfg.min_limit), new)), min_rtt, samples, False)


# ------------------------------------------------------------------------------------------------ shedding


@dataclass(frozen=True, slots=True)
class ShedConfig:
    """Coordinated shedding knobs."""

    start_utilisation: float = 0.8  # start rejecting above this aggregate load/capacity (RED-style ramp)
    full_utilisation: float = 1.0  # reject everything new at or above this
    min_retry_after_s: float = 1.0  # Retry-After floor (HTTP Retry-After is whole seconds)
    average_window_s: float = 1.0  # the ramp follows utilisation averaged over about this long (0 = instantaneous)

    def __post_init__(self) -> None:
        if not 0.0 <= self.start_utilisation < self.full_utilisation:
            raise ValueError("need 0 <= start_utilisation < full_utilisation")
        if self.average_window_s < 0:
            raise ValueError(f"average_window_s must be >= 0, got {self.average_window_s}")


@dataclass(frozen=True, slots=True)
class ShedState:
    """RED's averaged utilisation, carried from one admission decision to the next."""

    average_utilisation: float = 0.0  # time-weighted moving average of the aggregate utilisation
    updated_s: float | None = None  # when it was last folded in (None = no sample yet: start at the current one)


def average_utilisation(state: ShedState, utilisation: float, now_s: float, window_s: float) -> ShedState:
    """Fold the current utilisation into the average; the old value weighs exp(-elapsed / window)."""
    if state.updated_s is None or window_s == 0.0:
        return ShedState(utilisation, now_s)
    w = math.exp(-max(0.0, now_s - state.updated_s) / window_s)
    return ShedState(state.average_utilisation * w + utilisation * (1.0 - w), now_s)


@dataclass(frozen=True, slots=True)
class ShedDecision:
    """Whether to reject this request."""

    reject: bool  # answer 503 overloaded now, without touching a replica
    fraction: float  # the uniform rejection probability in force
    utilisation: float  # aggregate load / aggregate capacity of routable replicas
    retry_after_s: float  # what to put in Retry-After when rejecting
    state: ShedState = ShedState()  # the averaged utilisation to keep for the next decision


def shed(snapshots: Sequence[ReplicaSnapshot], now_s: float, rng: random.Random, cfg: ShedConfig,
         undispatched: int = 0, state: ShedState | None = None) -> ShedDecision:
    """Decide for one arriving request from the aggregate load of ready, non-ejected replicas.

    `undispatched` counts requests the router has admitted but not yet sent to a replica; they are load too.
    `state` is the previous decision's (None = no history: the ramp follows the current utilisation). The
    rejection fraction ramps on the sustained utilisation, the lower of the current and the averaged one (a
    burst is queued; once the load has gone nothing is shed); at or above `full_utilisation` right now
    everything new is rejected whatever the average.
    """
    live = [s for s in snapshots if s.ready and not s.ejected(now_s)]
    capacity = sum(s.capacity for s in live)
    if capacity == 0:  # routing answers not_ready instead
        return ShedDecision(False, 0.0, 0.0, cfg.min_retry_after_s, state or ShedState())
    load = sum(s.load() for s in live) + max(0, undispatched)
    util = load / capacity
    avg = average_utilisation(state or ShedState(), util, now_s, cfg.average_window_s)
    span = cfg.full_utilisation - cfg.start_utilisation
    sustained = min(util, avg.average_utilisation)  # a burst has a low average, a load gone a low current
    ramp = min(1.0, max(0.0, (sustained - cfg.start_utilisation) / span))
    fraction = 1.0 if util >= cfg.full_utilisation else ramp
    latencies = [s.ewma_latency_s for s in live if s.ewma_latency_s > 0]
    mean_latency_s = sum(latencies) / len(latencies) if latencies else 0.0
    retry_after = max(cfg.min_retry_after_s, math.ceil(mean_latency_s * util))
    reject = fraction >= 1.0 or (fraction > 0.0 and rng.random() < fraction)
    return ShedDecision(reject, fraction, util, float(retry_after), avg)


# ----------------------------------------------------------------------------------------------- admission


@dataclass(frozen=True, slots=True)
class Admission:
    """One new request's admission decision."""

    verdict: str  # "admit" | "shed" (coordinated shedding) | "limited" (the concurrency limit is reached)
    shed: ShedDecision  # the shedding arithmetic (its utilisation also drives degradation)
    limit: int | None  # the concurrency limit in force (None when adaptive concurrency is off)

    @property
    def admitted(self) -> bool:
        return self.verdict == "admit"


def admit(snapshots: Sequence[ReplicaSnapshot], inflight: int, vegas: VegasState, now_s: float,
          rng: random.Random, shed_cfg: ShedConfig, shedding: bool, vegas_cfg: VegasConfig | None,
          shed_state: ShedState | None = None) -> Admission:
    """Admit, shed or limit one new request; `inflight` counts requests admitted and not yet answered.

    Shedding comes first (with `shedding` off the decision is still computed, for its utilisation, and never
    rejects), then the Vegas limit (`vegas_cfg` None = adaptive concurrency off). The caller keeps
    `Admission.shed.state` for the next decision.
    """
    undispatched = inflight - sum(s.outstanding for s in snapshots)  # admitted, no replica picked yet
    d = shed(snapshots, now_s, rng, shed_cfg, undispatched, shed_state)
    if not shedding:
        d = ShedDecision(False, d.fraction, d.utilisation, d.retry_after_s, d.state)
    limit = None if vegas_cfg is None else vegas.effective_limit(vegas_cfg)
    if d.reject:
        return Admission("shed", d, limit)
    if limit is not None and inflight >= limit:
        return Admission("limited", d, limit)
    return Admission("admit", d, limit)
