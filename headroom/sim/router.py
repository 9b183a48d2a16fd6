"""Routing across replica queues with the server's own router policies (`headroom.router.policies.choose`).

The simulator builds one `ReplicaSnapshot` per routable replica (outstanding = queued + running there,
peak-EWMA latency of its completions) and asks the same `choose` the proxy asks. `random` is a simulator
baseline the proxy does not offer (affinity and prefix routing need request keys the simulator lacks).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache

from headroom.router.policies import choose
from headroom.router.snapshot import ReplicaSnapshot, RouterState
from headroom.sim.state import ReplicaState

SERVER_POLICIES = ("round_robin", "least_outstanding", "p2c", "peak_ewma")
ROUTERS = (*SERVER_POLICIES, "random")
_UNBOUNDED = 1 << 30  # the simulator's admission control lives in the queues, not in the router


def needs_loads(policy: str) -> bool:
    """Whether the policy looks at outstanding work and latency (round robin and random do not)."""
    return policy not in ("round_robin", "random")


@lru_cache(maxsize=64)
def _idle_snapshots(ids: tuple[str, ...]) -> tuple[ReplicaSnapshot, ...]:
    return tuple(ReplicaSnapshot(replica_id=i, capacity=_UNBOUNDED) for i in ids)


def route(policy: str, ids: tuple[str, ...], outstanding: Sequence[int] | None,
          ewma_latency_s: Sequence[float] | None, state: RouterState, now_s: float,
          rng: random.Random) -> tuple[int, RouterState]:
    """Index (into `ids`) of the replica that gets the next request, and the router's new state.

    `ids` must sort in the order they are listed (the server policy orders replicas by id). Loads may be
    None for policies that ignore them (`needs_loads`), which saves building fresh snapshots per request.
    """
    if not ids:
        raise ValueError("no routable replica")
    if policy == "random":
        return rng.randrange(len(ids)), state
    if policy not in SERVER_POLICIES:
        raise ValueError(f"unknown router {policy!r}; choose one of {', '.join(ROUTERS)}")
    if outstanding is None or ewma_latency_s is None:
        if needs_loads(policy):
            raise ValueError(f"router {policy!r} needs outstanding counts and latencies")
        snaps: Sequence[ReplicaSnapshot] = _idle_snapshots(ids)
    else:
        snaps = [ReplicaSnapshot(replica_id=i, outstanding=o, ewma_latency_s=e, capacity=_UNBOUNDED)
                 for i, o, e in zip(ids, outstanding, ewma_latency_s, strict=True)]
    decision, state = choose(policy, snaps, None, state, now_s, rng)
    if decision.replica_id is None:
        raise ValueError("the router found no routable replica")
    return ids.index(decision.replica_id), state


class ReplicaRouter:
    """The simulator's router: which replica's queue gets the next arrival (ready, non-draining replicas;
    while none is ready, one that is starting)."""

    def __init__(self, policy: str, rng: random.Random) -> None:
        self.policy = policy
        self._rng = rng
        self._state = RouterState()
        self._with_loads = needs_loads(policy)
        self._routable: list[ReplicaState] | None = None  # cached until a replica changes state

    def invalidate(self) -> None:
        """A replica became ready, started draining or retired."""
        self._routable = None

    def pick(self, replicas: Sequence[ReplicaState], now_s: float) -> ReplicaState:
        routable = self._routable
        if routable is None:
            routable = [r for r in replicas if r.ready and not r.draining]
            if not routable:  # nothing ready yet: queue at a starting replica
                routable = [r for r in replicas if not r.retired and not r.draining] or list(replicas)
            self._routable = routable
        if self._with_loads:
            loads: list[int] | None = [len(r.queue.items) + len(r.batch) + (r.cont.running if r.cont else 0)
                                       for r in routable]
            ewmas: list[float] | None = [r.ewma_s for r in routable]
        else:
            loads = ewmas = None
        k, self._state = route(self.policy, tuple(r.rid for r in routable), loads, ewmas, self._state, now_s,
                               self._rng)
        return routable[k]
