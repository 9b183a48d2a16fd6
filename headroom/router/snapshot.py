"""What the routing policies see: one frozen snapshot per replica, plus the router's explicit state.

The proxy (and the simulator) build `ReplicaSnapshot`s from their own bookkeeping and hand them to
`headroom.router.policies.choose`; nothing here reads a clock or does I/O. Peak-EWMA latency is kept by the
caller with `peak_ewma_update`, a pure function of the previous value, a sample and the elapsed time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Finagle's peak-EWMA decay time (`PeakEwma` default `decayTime` = 10 s): how fast a past peak is forgotten.
DEFAULT_PEAK_EWMA_DECAY_S = 10.0


@dataclass(frozen=True, slots=True)
class ReplicaSnapshot:
    """One replica as the router sees it at decision time."""

    replica_id: str  # stable identifier (also the consistent-hashing key for affinity / prefix routing)
    ready: bool = True  # passes active readiness checks: model loaded and warmed, not draining
    outstanding: int = 0  # requests the router sent to it that have not finished yet
    ewma_latency_s: float = 0.0  # peak-sensitive EWMA of end-to-end latency; 0.0 = no sample yet
    queue_depth: int = 0  # queue depth the replica last reported (0 when it does not report one)
    capacity: int = 8  # concurrent requests it serves within the SLO (overload / shedding threshold)
    ejected_until_s: float = 0.0  # passive outlier ejection: no traffic before this time
    version: str = ""  # model version it serves (canary rollouts split traffic by version)
    prefix_match_blocks: int = 0  # cache_aware: leading blocks of this request's prompt it holds cached
    cached_blocks: int = 0  # cache_aware: blocks it holds for the request's model (published + routed recently)

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"replica {self.replica_id!r}: capacity must be >= 1, got {self.capacity}")
        if self.outstanding < 0 or self.queue_depth < 0 or self.prefix_match_blocks < 0:
            raise ValueError(f"replica {self.replica_id!r}: outstanding, queue_depth and prefix_match_blocks "
                             "must be >= 0")

    def ejected(self, now_s: float) -> bool:
        """Passive health has ejected it and the ejection has not expired."""
        return now_s < self.ejected_until_s

    def load(self) -> int:
        """Work it holds: requests in flight from this router plus whatever it reports queued beyond them."""
        return max(self.outstanding, self.queue_depth)

    def overloaded(self) -> bool:
        """It already holds at least `capacity` requests."""
        return self.load() >= self.capacity


@dataclass(frozen=True, slots=True)
class RouterState:
    """Everything a routing decision carries to the next one (only round-robin needs any)."""

    rr_last_id: str = ""  # round-robin: the replica used last; the next is the first id after it (cyclic)


def routable(snapshots: tuple[ReplicaSnapshot, ...], now_s: float) -> tuple[ReplicaSnapshot, ...]:
    """Replicas that may receive traffic now, sorted by id.

    Not-ready replicas (loading, warming, draining) never do. Ejected replicas are skipped unless every
    ready replica is ejected, in which case all ready ones are used ("panic routing", as Envoy does when
    too few hosts are healthy: routing to a suspect host beats failing every request).
    """
    ready = tuple(sorted((s for s in snapshots if s.ready), key=lambda s: s.replica_id))
    healthy = tuple(s for s in ready if not s.ejected(now_s))
    return healthy if healthy else ready


def peak_ewma_update(prev_s: float, sample_s: float, elapsed_s: float,
                     decay_s: float = DEFAULT_PEAK_EWMA_DECAY_S) -> float:
    """Finagle's peak-EWMA: jump to any sample above the average, decay towards lower ones.

    `elapsed_s` is the time since the previous update; the weight of the old value is exp(-elapsed/decay).
    """
    if sample_s < 0 or elapsed_s < 0 or decay_s <= 0:
        raise ValueError("sample_s and elapsed_s must be >= 0 and decay_s > 0")
    if prev_s <= 0.0 or sample_s > prev_s:
        return sample_s
    w = math.exp(-elapsed_s / decay_s)
    return prev_s * w + sample_s * (1.0 - w)
