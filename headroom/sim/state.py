"""Mutable bookkeeping of the simulator's queues and replicas (owned by `headroom.sim.engine.Simulator`)."""

from __future__ import annotations

from collections import deque
from itertools import islice

from headroom.autoscaler.policy import AutoscalerState, MetricsSample
from headroom.batching.estimator import LoadEstimates
from headroom.batching.policy import QueuedItem, QueueSnapshot
from headroom.sim.continuous import ContinuousReplica


class SimQueue:
    """One FIFO, the replicas that pull from it, and its load estimates (the server batcher's own code)."""

    __slots__ = ("idle", "items", "load", "replicas", "running", "wake_token")

    def __init__(self) -> None:
        self.items: deque[QueuedItem] = deque()
        self.idle: list[ReplicaState] = []  # ready replicas with nothing to run
        self.replicas: list[ReplicaState] = []  # every replica bound to this queue
        self.wake_token = 0  # invalidates stale wake-ups
        self.load = LoadEstimates()  # arrival rate and batch service time, as the server's batcher keeps them
        self.running = 0  # requests in batches that are executing (admission counts them as ahead)

    def snapshot(self, now_s: float, cap: int) -> QueueSnapshot:
        """The policy's view of the queue's head (at most `cap` items: the policy never looks past a batch)."""
        return self.load.snapshot(tuple(islice(self.items, 0, cap)), now_s)

    def take(self, take: tuple[int, ...], visible: int) -> list[QueuedItem]:
        """Remove the items a decision took (indices into the first `visible`) and return them."""
        items = self.items
        k = len(take)
        if k == 1 and take[0] == 0:
            return [items.popleft()]
        if max(take) == k - 1:  # distinct indices below k: the head of the queue
            return [items.popleft() for _ in take]
        chosen = set(take)  # priorities reordered the head: remove the chosen indices
        head = [items.popleft() for _ in range(visible)]
        items.extendleft(reversed([it for i, it in enumerate(head) if i not in chosen]))
        return [head[i] for i in take]

    def drop(self, expire: tuple[int, ...]) -> list[QueuedItem]:
        """Remove the items a decision expired; return them."""
        dead = set(expire)
        head = [self.items.popleft() for _ in range(max(expire) + 1)]
        self.items.extendleft(reversed([it for i, it in enumerate(head) if i not in dead]))
        return [head[i] for i in sorted(dead)]

    def instances(self) -> int:
        """Replicas that serve this queue now (admission's concurrent batches), at least 1."""
        return max(1, sum(1 for r in self.replicas if r.ready))


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
        self.batch: list[QueuedItem] = []  # the running batch
        self.busy_since_s = -1.0  # start of the running batch, -1 when idle
        self.ready = False  # serving (cold start over)
        self.draining = False  # scale-down chose it: no new traffic, finishes its queue, then retires
        self.retired = False  # gone; never serves again
        self.cont: ContinuousReplica | None = None  # continuous-batching state (LLM profiles only)
