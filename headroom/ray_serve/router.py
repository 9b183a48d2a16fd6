"""headroom's routing policies as Ray Serve's custom request router (Ray >= 2.47: `RequestRouterConfig`).

Serve's handle asks `choose_replicas` for ranked candidates. `HeadroomRequestRouter` builds one
`headroom.router.snapshot.ReplicaSnapshot` per candidate replica and lets the same pure function the router uses,
`headroom.router.policies.choose` (round robin, least outstanding, P2C, peak-EWMA, affinity, prefix), pick
one; it is ranked first, the others after it (Serve probes the first rank and falls back to the next when
the chosen replica's queue is full). The snapshot of a replica:

* ``outstanding``: requests this router sent to it that have not completed (`on_send_request` /
  `on_request_completed`, which Serve calls for every request);
* ``queue_depth``: the larger of Serve's cached queue length for it and the `queue_depth` it reports through
  `record_routing_stats` (requests its data plane admitted);
* ``ewma_latency_s``: Finagle's peak-EWMA of the time from the start of routing to completion
  (`peak_ewma_update`);
* ``capacity``: Serve's `max_ongoing_requests`.

Multiplexed requests (a model name as multiplexed model id) first narrow the candidates with Serve's own
`MultiplexMixin` (replicas that hold the model, then those holding the fewest models), so a policy never sends
a request to a replica that would have to load the model when one that has it is free. The affinity / prefix key
comes from the `routing_key` keyword argument of the call (the ingress computes it as `headroom route` does).
A call with a `target_replica` keyword argument (the ingress's per-replica `/metrics` scrape) goes to that
replica only, when it is a candidate.

Each decision goes to the request it was made for (Serve's default matching by internal request id). Serve's
`FIFOMixin` is deliberately not used: it hands the replica chosen for one request to whichever request is first
in the queue, which would send a session's request to another session's replica under concurrency (affinity,
prefix) and a metrics scrape to the wrong replica.
"""

from __future__ import annotations

import random
import time
from typing import Any

from ray.serve.request_router import (
    MultiplexMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from headroom.router.policies import POLICIES, RoutingConfig, choose
from headroom.router.snapshot import DEFAULT_PEAK_EWMA_DECAY_S, ReplicaSnapshot, RouterState, peak_ewma_update

#: Requests whose routing start is remembered for a latency sample (cleared beyond this: a leak guard).
_MAX_TRACKED = 100_000


class HeadroomRequestRouter(MultiplexMixin, RequestRouter):
    """Serve request router that delegates the choice to `headroom.router.policies.choose`."""

    def initialize_state(self, policy: str = "peak_ewma", seed: int | None = None, prefix_len_chars: int = 256,
                         decay_s: float = DEFAULT_PEAK_EWMA_DECAY_S, **_: Any) -> None:
        """Called by Serve with `request_router_kwargs`."""
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; use one of {', '.join(POLICIES)}")
        self.policy = policy
        self.routing = RoutingConfig(prefix_len_chars=prefix_len_chars)
        self.decay_s = decay_s
        self.rng = random.Random(seed)
        self.state = RouterState()
        self.outstanding: dict[str, int] = {}  # replica id -> requests routed, not completed
        self.ewma: dict[str, tuple[float, float]] = {}  # replica id -> (peak-EWMA latency s, updated at s)
        self.started: dict[str, float] = {}  # internal request id -> when routing it began (monotonic s)

    def snapshot(self, replica: RunningReplica) -> ReplicaSnapshot:
        rid = replica.replica_id.unique_id
        cached = self.replica_queue_len_cache.get(replica.replica_id) or 0
        reported = replica.routing_stats.get("queue_depth", 0) if replica.routing_stats else 0
        return ReplicaSnapshot(replica_id=rid, outstanding=self.outstanding.get(rid, 0),
                               ewma_latency_s=self.ewma.get(rid, (0.0, 0.0))[0],
                               queue_depth=max(int(cached), int(reported), 0),
                               capacity=max(1, replica.max_ongoing_requests))

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        candidates = candidate_replicas
        target = pending_request.kwargs.get("target_replica") if pending_request is not None else None
        if target is not None:
            chosen = [r for r in candidate_replicas if r.replica_id.unique_id == target]
            return [chosen or candidate_replicas]  # gone: anywhere (the caller sees who answered)
        if pending_request is not None and pending_request.metadata.multiplexed_model_id:
            ids = self.apply_multiplex_routing(pending_request=pending_request)
            candidates = [r for r in candidate_replicas if r.replica_id in ids] or candidate_replicas
        if not candidates:
            return []
        key = None
        if pending_request is not None:
            key = pending_request.kwargs.get("routing_key")
            if len(self.started) >= _MAX_TRACKED:  # requests cancelled before they reached a replica
                self.started.clear()
            self.started.setdefault(pending_request.metadata.internal_request_id, time.monotonic())
        snapshots = [self.snapshot(r) for r in candidates]
        decision, self.state = choose(self.policy, snapshots, key if isinstance(key, str) else None, self.state,
                                      time.monotonic(), self.rng, self.routing)
        chosen = [r for r in candidates if r.replica_id.unique_id == decision.replica_id]
        rest = [r for r in candidates if r.replica_id.unique_id != decision.replica_id]
        return [ranked for ranked in (chosen, rest) if ranked]

    def on_send_request(self, replica_id: ReplicaID) -> None:
        """Serve sent a request to `replica_id` (every request, with or without its rejection protocol)."""
        super().on_send_request(replica_id)
        rid = replica_id.unique_id
        self.outstanding[rid] = self.outstanding.get(rid, 0) + 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """The request finished on `replica_id` (any outcome): one fewer outstanding, one latency sample."""
        rid = replica_id.unique_id
        self.outstanding[rid] = max(0, self.outstanding.get(rid, 0) - 1)
        routed_s = self.started.pop(internal_request_id, None)
        if routed_s is None:
            return
        now_s = time.monotonic()
        prev_s, updated_s = self.ewma.get(rid, (0.0, now_s))
        self.ewma[rid] = (peak_ewma_update(prev_s, now_s - routed_s, max(0.0, now_s - updated_s), self.decay_s),
                          now_s)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        rid = replica_id.unique_id
        self.outstanding.pop(rid, None)
        self.ewma.pop(rid, None)
