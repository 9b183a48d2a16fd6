"""Host CPU sharing: the server's per-request work outside the model runs on the model's cores.

A CPU-bound model served on the same cores as the server's front end (HTTP parsing, JSON, tokenisation,
response encoding: the event loop and the preprocessing threads) does not get a dedicated core. Every
request that arrives while a batch runs takes some core time away from it, so the batch's wall time
stretches with the arrival rate. The simulator models that on its virtual clock, event by event:

* each arrival brings `cost_s` seconds of host work that preempts the model (the event loop's work is short
  and latency-critical, so it is treated as having priority; under Linux CFS the two share the core, which
  finishes the batch at the same moment as long as the host work is done before the batch is);
* arrival ``a``'s host work occupies the core just before ``a`` -- in the interval ``[a - cost_s, a]`` when
  nothing else is queued for the core -- because the simulator's arrival time is when the request reaches
  the batching queue, i.e. after its parsing and preprocessing (the fixed per-request cost added to each
  simulated latency covers that part of the request's own latency);
* host jobs are served in order on one core (a burst of arrivals delays a batch by the sum of its work);
  a batch of ``work_s`` seconds of model time ends once the core has been free of host work for ``work_s``
  seconds after its start (`batch_end_s`: a preemptive-priority two-class single server, computed exactly
  over the arrival schedule, which is known in advance and exogenous, so looking ahead in it is legitimate).

In expectation this is the textbook stretch ``T_eff(B) = T(B) / (1 - rate * cost_s)`` (the batch's time
plus the host work that arrives while it runs), and a server saturates at
``rate = B / (T(B) + B * cost_s)``: every request's total core time, model share plus host share
(`effective_capacity_per_s`). The event-level form also captures bursts (Poisson clumps) and needs no rate.

`cost_s` is *model seconds lost per arrival*: the host CPU per request when the model keeps its cores busy
(one intra-op thread per core: a preempted thread stalls the whole operator), scaled down by the fraction of
the cores the model actually keeps busy otherwise (0 for a model that sleeps, e.g. waiting on a GPU).
Pure functions; the simulator keeps a `HostBacklog` and calls `batch_end_s` once per batch (one seam).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HostBacklog:
    """Host work of the arrivals already folded in (those whose host work starts at or before a time)."""

    next_arrival: int = 0  # index in the schedule of the first arrival not folded in yet
    host_free_s: float = -math.inf  # virtual time at which the folded arrivals' host work is all done


def advance(backlog: HostBacklog, arrivals_s: Sequence[float], now_s: float, cost_s: float) -> HostBacklog:
    """Fold in every arrival whose host work is released by `now_s` (``a - cost_s <= now_s``), in order."""
    i, free = backlog.next_arrival, backlog.host_free_s
    n = len(arrivals_s)
    while i < n and arrivals_s[i] - cost_s <= now_s:
        free = max(free, arrivals_s[i] - cost_s) + cost_s
        i += 1
    return HostBacklog(i, free)


def batch_end_s(start_s: float, work_s: float, arrivals_s: Sequence[float], backlog: HostBacklog,
                cost_s: float) -> float:
    """When a batch needing `work_s` seconds of the core, started at `start_s`, ends: the model runs only while
    no host work is pending; `backlog` must already be advanced to `start_s` (see `advance`)."""
    if work_s < 0 or cost_s < 0:
        raise ValueError(f"work_s and cost_s must be >= 0, got {work_s}, {cost_s}")
    busy_until = max(backlog.host_free_s, start_s)  # the model cannot run before this
    if cost_s == 0:
        return busy_until + work_s
    remaining = work_s
    i, n = backlog.next_arrival, len(arrivals_s)
    while True:
        release = arrivals_s[i] - cost_s if i < n else math.inf
        if release <= busy_until:  # released while the core is still taken by host work: queues behind it
            busy_until += cost_s
            i += 1
            continue
        if busy_until + remaining <= release:
            return busy_until + remaining
        remaining -= release - busy_until
        busy_until = release + cost_s
        i += 1


def add_work(backlog: HostBacklog, now_s: float, work_s: float) -> HostBacklog:
    """Queue `work_s` seconds of host work released at `now_s` (e.g. the front end's work when a batch completes)
    behind the host work already pending; `backlog` must already be advanced to `now_s`."""
    if work_s < 0:
        raise ValueError(f"work_s must be >= 0, got {work_s}")
    return HostBacklog(backlog.next_arrival, max(backlog.host_free_s, now_s) + work_s)


def arrivals_between(arrivals_s: Sequence[float], start_s: float, end_s: float) -> int:
    """How many arrivals fall in ``(start_s, end_s]`` (for tests and reports)."""
    return bisect.bisect_right(arrivals_s, end_s) - bisect.bisect_right(arrivals_s, start_s)


def stretch_factor(rate_per_s: float, cost_s: float) -> float:
    """Mean stretch of a batch, ``1 / (1 - rate * cost_s)``; inf at or past the point host work fills the core."""
    load = rate_per_s * cost_s
    return math.inf if load >= 1 else 1.0 / (1.0 - load)


def effective_capacity_per_s(batch_size: int, batch_s: float, cost_s: float) -> float:
    """Requests per second a server sustains at full batches of `batch_size` taking `batch_s` on a free core,
    when each request also costs `cost_s` of the model's core: ``B / (T(B) + B * cost_s)``."""
    if batch_size < 1 or batch_s <= 0 or cost_s < 0:
        raise ValueError("batch_size must be >= 1, batch_s > 0 and cost_s >= 0")
    return batch_size / (batch_s + batch_size * cost_s)


def split_host_cpu(low_s: float, low_batch: float, high_s: float, high_batch: float) -> tuple[float, float]:
    """Host CPU per request measured at two mean batch sizes (a low-load pass and a saturated one) split into
    ``per_request + per_batch / B``: (per-request seconds, per-batch seconds). The front end's work per batch
    (waking the event loop when a batch completes, resolving its futures, the batcher's own turn) is shared by
    the batch's requests, so host CPU per request falls as batches grow. Falls back to (low_s, 0) when the
    two batch sizes are too close to tell (high < 1.5 x low) or the CPU per request did not fall; clamps the
    per-request part at 0 (then all of it is per batch)."""
    if min(low_s, high_s) < 0 or min(low_batch, high_batch) < 1:
        raise ValueError("host CPU must be >= 0 and mean batch sizes >= 1")
    if high_batch < 1.5 * low_batch or high_s >= low_s:
        return low_s, 0.0
    per_batch = (low_s - high_s) / (1.0 / low_batch - 1.0 / high_batch)
    per_request = high_s - per_batch / high_batch
    if per_request < 0:
        return 0.0, low_s * low_batch
    return per_request, per_batch
