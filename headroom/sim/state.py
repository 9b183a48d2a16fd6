"""Mutable bookkeeping of the simulator's queues and replicas (owned by `headroom.sim.engine.Simulator`)."""

from __future__ import annotations

import math
from collections import deque

from headroom.autoscaler.policy import AutoscalerState, MetricsSample
from headroom.batching.policy import QueuedItem
from headroom.sim.continuous import ContinuousReplica


class SimQueue:
    """One FIFO and the replicas that pull from it."""

    __slots__ = ("gap_est", "idle", "items", "last_arrival_s", "rate_est", "replicas", "svc_est", "wake_token")

    def __init__(self) -> None:
        self.items: deque[QueuedItem] = deque()
        self.idle: list[ReplicaState] = []  # ready replicas with nothing to run
        self.replicas: list[ReplicaState] = []  # every replica bound to this queue
        self.wake_token = 0  # invalidates stale wake-ups
        self.last_arrival_s = -math.inf  # time of the previous arrival (for the gap EWMA)
        self.gap_est = 0.0  # EWMA of inter-arrival gaps (adaptive batching's rate estimate)
        self.rate_est = 0.0  # 1 / gap_est: the arrival-rate estimate in the policy's snapshot
        self.svc_est = 0.0  # EWMA of batch service times


class ScaleState:
    """The autoscaler's memory and the counters its samples are computed from."""

    __slots__ = ("arrivals", "last_arrivals", "last_busy", "last_t", "scaler", "window")

    def __init__(self, replicas: int) -> None:
        self.window: list[MetricsSample] = []  # recent samples handed to the policy
        self.scaler = AutoscalerState(replicas=replicas)  # the policy's own state
        self.last_busy = 0.0  # fleet busy seconds at the previous sample
        self.last_t = 0.0  # time of the previous sample
        self.last_arrivals = 0  # arrivals counted at the previous sample
        self.arrivals = 0  # arrivals so far


class ReplicaState:
    """One simulated replica: what it runs, since when, and where it is in its life cycle."""

    __slots__ = ("batch", "busy_since_s", "cont", "draining", "ewma_s", "ewma_t", "queue", "ready", "retired", "rid")

    def __init__(self, queue: SimQueue, rid: str) -> None:
        self.queue = queue
        self.rid = rid  # replica id for the router (zero-padded: sorts in creation order)
        self.ewma_s = 0.0  # peak-EWMA latency of its completions (peak_ewma routing)
        self.ewma_t = 0.0  # when ewma_s was last updated
        self.batch: list[float] = []  # enqueue times of the running batch
        self.busy_since_s = -1.0  # start of the running batch, -1 when idle
        self.ready = False  # serving (cold start over)
        self.draining = False  # scale-down chose it: no new traffic, finishes its queue, then retires
        self.retired = False  # gone; never serves again
        self.cont: ContinuousReplica | None = None  # continuous-batching state (LLM profiles only)
