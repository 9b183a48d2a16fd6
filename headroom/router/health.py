"""Replica health as a pure state machine: passive outlier ejection plus folded-in active readiness checks.

* Passive (Envoy outlier detection): `consecutive_failures` (Envoy `consecutive_5xx` default 5) 5xx answers or
  timeouts in a row eject a replica for `base_ejection_s` x times-ejected (Envoy: 30 s x n), capped at
  `max_ejection_s` (Envoy `max_ejection_time` 300 s). At most `max_ejected_fraction` of replicas (Envoy
  `max_ejection_percent` 10%) are ejected at once, but always at least one may be.
* Active: the proxy polls `GET /v2/health/ready`; a failing check marks the replica not ready at once (a
  draining replica answers 503 and must stop receiving traffic immediately), a passing one marks it ready.
  Loading and warming replicas answer 503 too, so they get no traffic. Whether a passing active check also
  lifts an ejection is `uneject_on_active_pass` (Envoy defaults it to true; here it defaults to false because
  `/v2/health/ready` does not exercise the inference path that produced the 5xx answers).
* A replica that stays un-ejected for `max_ejection_s` has its times-ejected multiplier reset.

All functions take `now_s` and return a new `HealthState`; `apply` stamps the result onto snapshots.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from headroom.router.snapshot import ReplicaSnapshot


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """Outlier-ejection knobs (defaults are Envoy's outlier-detection defaults unless noted)."""

    consecutive_failures: int = 5  # Envoy consecutive_5xx: failures in a row that eject
    base_ejection_s: float = 30.0  # Envoy base_ejection_time: first ejection length, x times ejected
    max_ejection_s: float = 300.0  # Envoy max_ejection_time: cap on one ejection
    max_ejected_fraction: float = 0.1  # Envoy max_ejection_percent 10% (at least one host may be ejected)
    uneject_on_active_pass: bool = False  # a passing readiness check lifts an ejection (Envoy default: true)

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1:
            raise ValueError(f"consecutive_failures must be >= 1, got {self.consecutive_failures}")
        if self.base_ejection_s <= 0 or self.max_ejection_s < self.base_ejection_s:
            raise ValueError("need 0 < base_ejection_s <= max_ejection_s")
        if not 0.0 <= self.max_ejected_fraction <= 1.0:
            raise ValueError(f"max_ejected_fraction must be in [0, 1], got {self.max_ejected_fraction}")


@dataclass(frozen=True, slots=True)
class ReplicaHealth:
    """One replica's health bookkeeping."""

    ready: bool = False  # last active check passed (replicas start not ready until a check passes)
    consecutive_failures: int = 0  # 5xx / timeouts in a row since the last success
    times_ejected: int = 0  # ejections so far (multiplies the next ejection length)
    ejected_until_s: float = 0.0  # no traffic before this time
    healthy_since_s: float = 0.0  # when the last ejection ended (resets times_ejected after max_ejection_s)


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """Something worth logging and counting."""

    replica_id: str  # which replica
    kind: str  # "ejected" | "ejection_skipped_cap" | "ready" | "not_ready"
    until_s: float = 0.0  # for "ejected": when the ejection ends


@dataclass(frozen=True, slots=True)
class HealthState:
    """Health of every known replica, keyed by replica id (read-only mapping)."""

    replicas: Mapping[str, ReplicaHealth] = field(default_factory=lambda: MappingProxyType({}))

    def get(self, replica_id: str) -> ReplicaHealth:
        return self.replicas.get(replica_id, ReplicaHealth())

    def with_replica(self, replica_id: str, health: ReplicaHealth) -> HealthState:
        merged = dict(self.replicas)
        merged[replica_id] = health
        return HealthState(MappingProxyType(merged))

    def without(self, replica_id: str) -> HealthState:
        return HealthState(MappingProxyType({k: v for k, v in self.replicas.items() if k != replica_id}))


def ejected_count(state: HealthState, now_s: float) -> int:
    return sum(1 for h in state.replicas.values() if now_s < h.ejected_until_s)


def record_result(state: HealthState, replica_id: str, failed: bool, now_s: float,
                  cfg: HealthConfig) -> tuple[HealthEvent | None, HealthState]:
    """Fold one finished request in: `failed` means a 5xx (not a 503 shed) or a timeout / lost connection."""
    h = state.get(replica_id)
    if h.ejected_until_s and now_s >= h.ejected_until_s and h.healthy_since_s < h.ejected_until_s:
        h = dataclasses.replace(h, healthy_since_s=h.ejected_until_s)
    if not failed:
        times = h.times_ejected
        if times and now_s >= h.ejected_until_s and now_s - h.healthy_since_s >= cfg.max_ejection_s:
            times = 0
        return None, state.with_replica(replica_id, dataclasses.replace(h, consecutive_failures=0,
                                                                        times_ejected=times))
    failures = h.consecutive_failures + 1
    if failures < cfg.consecutive_failures or now_s < h.ejected_until_s:
        return None, state.with_replica(replica_id, dataclasses.replace(h, consecutive_failures=failures))
    allowed = max(1, math.floor(len(state.replicas) * cfg.max_ejected_fraction))
    if ejected_count(state, now_s) >= allowed:
        event = HealthEvent(replica_id, "ejection_skipped_cap")
        return event, state.with_replica(replica_id, dataclasses.replace(h, consecutive_failures=failures))
    times = h.times_ejected + 1
    until = now_s + min(cfg.base_ejection_s * times, cfg.max_ejection_s)
    new = dataclasses.replace(h, consecutive_failures=0, times_ejected=times, ejected_until_s=until)
    return HealthEvent(replica_id, "ejected", until), state.with_replica(replica_id, new)


def record_check(state: HealthState, replica_id: str, ready: bool, now_s: float,
                 cfg: HealthConfig) -> tuple[HealthEvent | None, HealthState]:
    """Fold one active readiness check in (`ready` = the check answered 200 in time)."""
    h = state.get(replica_id)
    new = dataclasses.replace(h, ready=ready)
    if ready and cfg.uneject_on_active_pass and now_s < h.ejected_until_s:
        new = dataclasses.replace(new, ejected_until_s=now_s, healthy_since_s=now_s, consecutive_failures=0)
    event = None if ready == h.ready else HealthEvent(replica_id, "ready" if ready else "not_ready")
    return event, state.with_replica(replica_id, new)


def apply(snapshots: Sequence[ReplicaSnapshot], state: HealthState) -> tuple[ReplicaSnapshot, ...]:
    """Stamp readiness and ejection onto snapshots (replicas unknown to `state` are not ready)."""
    out = []
    for s in snapshots:
        h = state.get(s.replica_id)
        out.append(dataclasses.replace(s, ready=s.ready and h.ready, ejected_until_s=h.ejected_until_s))
    return tuple(out)
