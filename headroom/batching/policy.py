"""The batching policy: a pure function from (queue snapshot, now, config) to a decision.

No clocks, no I/O, no mutation. The server's batcher and the simulator both call `decide`; tests drive it
with hand-built snapshots. Modes:

* ``dynamic``  (Triton's dynamic batcher) close a batch at `max_batch_size`, at the largest formable
  preferred size while the oldest queued request is within `max_queue_delay_s`, or once it has waited
  that long: then with everything pending, up to `max_batch_size` (as Triton's `GetDynamicBatch`: a
  preferred size never leaves behind requests whose delay has passed, which under load would wait a whole
  extra batch). The timer starts at the first queued request and never runs on an empty queue.
* ``static``   wait for a full `max_batch_size`; a safety timeout `static_timeout_s` flushes a partial one.
* ``adaptive`` the window shrinks as arrivals speed up (textbook equation 15 and listing 2):
  ``window = 0`` once `target_batch_size` requests wait, else
  ``min(slo - service - overhead, sqrt(service / rate), time to fill the target at the current rate)``.
* ``multistream`` requests carrying the same `group` (frame id) run together; the group closes when
  every expected stream arrived or at the group's sync deadline, naming the streams that were missing.

Every batch holds compatible requests only: those whose `batch_key` equals that of the request at the
head of the queue (Triton's dynamic batcher: non-batch dimensions must match unless an input allows ragged
batching). The others wait for a later batch; one client's shape never fails another client's request.

Expired requests (deadline passed while queued) are reported in `expire` and must never be executed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

_EPS_S = 1e-9


@dataclass(frozen=True, slots=True)
class QueuedItem:
    """One waiting request as the policy sees it."""

    enqueued_s: float  # admission time on the batcher's clock
    deadline_s: float  # absolute time after which the request must not start (504)
    size: int = 1  # batch items this request carries (its leading dimension)
    priority: int = 1  # 1 is the highest level; FIFO within a level
    group: str = ""  # multistream: frame id shared by the requests to batch together
    stream: str = ""  # multistream: which stream (camera) this request comes from
    batch_key: tuple[object, ...] = ()  # only requests with equal keys share a batch (non-batch dims)
    budget_s: float = math.inf  # its latency budget when admitted (inf: none), for the delay calibration
    expected_s: float = 0.0  # admission's mean prediction of its delay (0: none), for the delay calibration


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """The queue and the measurements a decision may depend on."""

    items: tuple[QueuedItem, ...]  # waiting requests in admission order
    arrival_rate_per_s: float = 0.0  # recent arrival-rate estimate (adaptive mode)
    service_time_s: float = 0.0  # recent batch service-time estimate (adaptive mode)


@dataclass(frozen=True, slots=True)
class BatchPolicyConfig:
    """The policy's knobs, in seconds (converted from the model config's milliseconds)."""

    mode: str = "dynamic"  # dynamic | static | adaptive | multistream
    max_batch_size: int = 8  # hard cap on the summed `size` of a batch (>= 1)
    max_queue_delay_s: float = 0.002  # dynamic: longest wait of the oldest request
    preferred_batch_sizes: tuple[int, ...] = ()  # dynamic: close early at these sizes
    static_timeout_s: float = 0.1  # static: flush a partial batch after this long
    slo_s: float = 0.1  # adaptive: end-to-end latency budget
    fixed_overhead_s: float = 0.001  # adaptive: per-request cost outside the batch (decode, network)
    target_batch_size: int = 16  # adaptive: close immediately once this many wait
    sync_deadline_s: float = 0.033  # multistream: how long a frame waits for missing streams
    expected_streams: tuple[str, ...] = ()  # multistream: the streams a complete frame carries

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_queue_delay_s < 0 or self.static_timeout_s < 0 or self.sync_deadline_s < 0:
            raise ValueError("delays and timeouts must be >= 0")
        if self.mode not in ("dynamic", "static", "adaptive", "multistream"):
            raise ValueError(f"unknown batching mode {self.mode!r}")


@dataclass(frozen=True, slots=True)
class BatchDecision:
    """What to do now. Indices refer to `QueueSnapshot.items`."""

    take: tuple[int, ...] = ()  # run these together now (empty: keep waiting)
    expire: tuple[int, ...] = ()  # deadline passed while queued: answer 504, never execute
    wake_at_s: float | None = None  # re-evaluate at this time if nothing else happens first
    missing_streams: tuple[str, ...] = ()  # multistream: expected streams absent from `take`
    window_s: float = 0.0  # the batching window the decision used (exported as a metric)


def adaptive_window_s(queue_depth: int, arrival_rate_per_s: float, service_time_s: float,
                      cfg: BatchPolicyConfig) -> float:
    """Textbook listing 2 combined with equation 15: the window for the current load, in seconds."""
    if queue_depth >= cfg.target_batch_size:
        return 0.0
    budget_s = max(0.0, cfg.slo_s - service_time_s - cfg.fixed_overhead_s)
    if arrival_rate_per_s <= 0:
        return budget_s
    sqrt_rule_s = math.sqrt(max(service_time_s, 0.0) / arrival_rate_per_s)
    fill_s = (cfg.target_batch_size - queue_depth) / arrival_rate_per_s
    return min(budget_s, sqrt_rule_s, fill_s)


def _take_prefix(order: Sequence[int], items: Sequence[QueuedItem], cap: int) -> tuple[int, ...]:
    """Greedily take requests in `order` while the summed size stays <= cap (at least one request), skipping
    those whose batch key differs from the first one's."""
    taken: list[int] = []
    total = 0
    for i in order:
        if taken and items[i].batch_key != items[taken[0]].batch_key:
            continue
        if total + items[i].size > cap:
            if not taken:
                taken.append(i)  # an oversized single request still runs alone
            break
        taken.append(i)
        total += items[i].size
    return tuple(taken)


def _ordered_live(snapshot: QueueSnapshot, now_s: float) -> tuple[list[int], tuple[int, ...]]:
    live: list[int] = []
    expired: list[int] = []
    for i, item in enumerate(snapshot.items):
        (expired if item.deadline_s <= now_s else live).append(i)
    live.sort(key=lambda i: (snapshot.items[i].priority, snapshot.items[i].enqueued_s, i))
    return live, tuple(expired)


def _next_deadline(items: Sequence[QueuedItem], live: Sequence[int]) -> float | None:
    return min((items[i].deadline_s for i in live), default=None)


def _earliest(*times: float | None) -> float | None:
    present = [t for t in times if t is not None]
    return min(present) if present else None


def decide(snapshot: QueueSnapshot, now_s: float, cfg: BatchPolicyConfig) -> BatchDecision:
    """Decide whether to dispatch a batch now, which requests it holds, and when to look again.

    Call it whenever a request arrives, an executor frees up, or `wake_at_s` passes; only call it when an
    executor is free to run the batch it may return.
    """
    items = snapshot.items
    live, expired = _ordered_live(snapshot, now_s)
    if not live:
        return BatchDecision(expire=expired)
    if cfg.mode == "multistream":
        return _decide_multistream(snapshot, now_s, cfg, live, expired)
    every_live = live
    head_key = items[live[0]].batch_key
    live = [i for i in live if items[i].batch_key == head_key]  # the head's batch: compatible requests only
    total = sum(items[i].size for i in live)
    oldest_s = min(items[i].enqueued_s for i in live)
    if total >= cfg.max_batch_size:
        return BatchDecision(take=_take_prefix(live, items, cfg.max_batch_size), expire=expired)
    if cfg.mode == "static":
        window_s = cfg.static_timeout_s
    elif cfg.mode == "adaptive":
        window_s = adaptive_window_s(total, snapshot.arrival_rate_per_s, snapshot.service_time_s, cfg)
    else:
        window_s = cfg.max_queue_delay_s
        formable = [p for p in cfg.preferred_batch_sizes if p <= total]
        if formable and now_s + _EPS_S < oldest_s + window_s:
            return BatchDecision(take=_take_prefix(live, items, max(formable)), expire=expired,
                                 window_s=window_s)
    close_at_s = oldest_s + window_s
    if now_s + _EPS_S >= close_at_s:
        return BatchDecision(take=_take_prefix(live, items, cfg.max_batch_size), expire=expired,
                             window_s=window_s)
    wake = _earliest(close_at_s, _next_deadline(items, every_live))
    return BatchDecision(expire=expired, wake_at_s=wake, window_s=window_s)


def _decide_multistream(snapshot: QueueSnapshot, now_s: float, cfg: BatchPolicyConfig,
                        live: list[int], expired: tuple[int, ...]) -> BatchDecision:
    items = snapshot.items
    groups: dict[str, list[int]] = {}
    for i in live:
        groups.setdefault(items[i].group, []).append(i)
    # Oldest group first: a frame's clock starts when its first stream arrives.
    ordered = sorted(groups.values(), key=lambda idx: min(items[i].enqueued_s for i in idx))
    expected = set(cfg.expected_streams)
    wake: float | None = None
    for idx in ordered:
        present = {items[i].stream for i in idx}
        started_s = min(items[i].enqueued_s for i in idx)
        complete = bool(expected) and expected <= present
        due = now_s + _EPS_S >= started_s + cfg.sync_deadline_s
        if complete or due:
            take = _take_prefix(idx, items, cfg.max_batch_size)
            missing = tuple(sorted(expected - {items[i].stream for i in take}))
            return BatchDecision(take=take, expire=expired, missing_streams=missing,
                                 window_s=cfg.sync_deadline_s)
        wake = _earliest(wake, started_s + cfg.sync_deadline_s)
    return BatchDecision(expire=expired, wake_at_s=_earliest(wake, _next_deadline(items, live)),
                         window_s=cfg.sync_deadline_s)
