"""Send requests: open loop on a schedule (latency from the INTENDED send time) or closed loop, labelled.

Open loop: request k leaves at `start + schedule[k]` whatever happened to earlier requests, so a server stall
shows up as the queueing users would feel (no coordinated omission, as in wrk2). When the generator itself
cannot keep up (CPU starved, in-flight cap reached) the send lag is measured and reported; latencies still
count from the intended time.

Closed loop: `concurrency` workers each send, wait for the reply, and send again. Its latencies are
coordinated with the server by construction; every report labels such a run "closed-loop".

A query may carry several samples (`samples_per_query`, MLPerf MultiStream); its latency is that of the last
sample to finish. Every request task lives in one TaskGroup, so cancelling the run cancels them all.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from headroom.core.clock import Clock
from headroom.loadgen.clients import ProtocolClient
from headroom.loadgen.records import ClientReply, RequestRecord
from headroom.loadgen.streaming import stream_latencies
from headroom.loadgen.workloads import Sample

LOAD_MODES: tuple[str, ...] = ("open", "closed")


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    """How requests are sent."""

    mode: str = "open"  # "open" (schedule-driven) or "closed" (fixed concurrency)
    concurrency: int = 1  # closed loop: workers, each with one query in flight
    duration_s: float = 10.0  # closed loop: stop starting queries after this many seconds
    max_queries: int = 0  # closed loop: stop after this many queries (0 = no limit)
    max_in_flight: int = 0  # open loop: cap on queries in flight (0 = none); waiting ones count as lag
    samples_per_query: int = 1  # samples sent together as one query (MLPerf MultiStream uses 8)
    late_threshold_ms: float = 10.0  # an open-loop send more than this behind schedule counts as late

    def __post_init__(self) -> None:
        if self.mode not in LOAD_MODES:
            raise ValueError(f"mode must be one of {LOAD_MODES}, got {self.mode!r}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.samples_per_query < 1:
            raise ValueError(f"samples_per_query must be >= 1, got {self.samples_per_query}")
        if self.max_in_flight < 0 or self.max_queries < 0:
            raise ValueError("max_in_flight and max_queries must be >= 0")


@dataclass(frozen=True, slots=True)
class DispatchStats:
    """How faithfully the generator followed its schedule."""

    mode: str  # "open" or "closed"
    queries_sent: int  # queries started
    late_sends: int  # open loop: queries that left more than late_threshold_ms behind schedule
    max_send_lag_ms: float  # open loop: the worst gap between intended and actual send time
    mean_send_lag_ms: float  # open loop: the mean gap
    wall_s: float  # from the first intended send to the last reply
    send_window_s: float  # from the first to the last intended (open) or actual (closed) send


RecordSink = Callable[[RequestRecord], None]


def _merge(index: int, start_s: float, intended_s: float, replies: Sequence[ClientReply]) -> RequestRecord:
    """One record for a query: the slowest sample decides latency; any failure fails the query.

    Latencies count from `start_s` (the intended send time in open loop, the actual one in closed loop).
    """
    last = max(replies, key=lambda r: r.end_s)
    failed = next((r for r in replies if not r.ok), None)
    sent_s = min(r.sent_s for r in replies)
    streamed = replies[0]
    ttft_s: float | None = None
    tpot_s: float | None = None
    itl_s: tuple[float, ...] = ()
    if len(replies) == 1 and streamed.chunk_times_s:
        lat = stream_latencies(start_s, streamed.chunk_times_s, max(streamed.end_s, start_s), streamed.output_tokens)
        ttft_s, tpot_s, itl_s = lat.ttft_s, lat.tpot_s, lat.itl_s
    return RequestRecord(
        index=index,
        intended_s=intended_s,
        sent_s=sent_s,
        end_s=last.end_s,
        ok=failed is None,
        status=(failed or last).status,
        latency_s=last.end_s - start_s,
        ttft_s=ttft_s,
        tpot_s=tpot_s,
        itl_s=itl_s,
        output_tokens=sum(r.output_tokens for r in replies),
        input_tokens=sum(r.input_tokens for r in replies),
        server_timing_ms=streamed.server_timing_ms,
        error=(failed.error if failed else ""),
    )


def _rebase(record: RequestRecord, t0_s: float) -> RequestRecord:
    """Express a record's clock times as offsets from the run's start."""
    return dataclasses.replace(
        record, intended_s=record.intended_s - t0_s, sent_s=record.sent_s - t0_s, end_s=record.end_s - t0_s
    )


@dataclass(frozen=True, slots=True)
class DispatchTarget:
    """What a run sends (its samples, cycled), through which client, on which clock, and where records go."""

    samples: Sequence[Sample]
    client: ProtocolClient
    clock: Clock
    sink: RecordSink

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("the workload is empty")

    async def send(self, index: int, per_query: int) -> list[ClientReply]:
        """Send query `index`: the next `per_query` samples, together."""
        base = index * per_query
        query = [self.samples[(base + j) % len(self.samples)] for j in range(per_query)]
        if len(query) == 1:
            return [await self.client.send(query[0])]
        return list(await asyncio.gather(*(self.client.send(s) for s in query)))

    def record(self, index: int, start_s: float, replies: Sequence[ClientReply], t0_s: float) -> None:
        """Hand query `index`'s record (latency from `start_s`) to the sink, its times relative to `t0_s`."""
        self.sink(_rebase(_merge(index, start_s, start_s, replies), t0_s))


async def run_open_loop(
    schedule_s: npt.NDArray[np.float64], target: DispatchTarget, config: DispatchConfig
) -> DispatchStats:
    """Send query k at `t0 + schedule_s[k]`; latency counts from that intended time."""
    clock = target.clock
    gate: AbstractAsyncContextManager[object] = (
        asyncio.Semaphore(config.max_in_flight) if config.max_in_flight > 0 else nullcontext()
    )
    t0_s = clock.now_s()
    lags_ms: list[float] = []
    late = 0

    async def one(index: int, intended_abs_s: float) -> None:
        nonlocal late
        async with gate:  # waiting for a free slot counts as send lag
            lag_ms = (clock.now_s() - intended_abs_s) * 1000.0
            replies = await target.send(index, config.samples_per_query)
        lags_ms.append(max(lag_ms, 0.0))
        if lag_ms > config.late_threshold_ms:
            late += 1
        target.record(index, intended_abs_s, replies, t0_s)

    async with asyncio.TaskGroup() as group:
        for index, offset_s in enumerate(schedule_s):
            intended_abs_s = t0_s + float(offset_s)
            delay_s = intended_abs_s - clock.now_s()
            # Always yield: when behind schedule, replies and started requests still get the loop.
            await asyncio.sleep(max(delay_s, 0.0))
            group.create_task(one(index, intended_abs_s))
    wall_s = clock.now_s() - t0_s
    window_s = float(schedule_s[-1] - schedule_s[0]) if schedule_s.size else 0.0
    return DispatchStats(
        mode="open",
        queries_sent=int(schedule_s.size),
        late_sends=late,
        max_send_lag_ms=max(lags_ms, default=0.0),
        mean_send_lag_ms=float(np.mean(lags_ms)) if lags_ms else 0.0,
        wall_s=wall_s,
        send_window_s=window_s,
    )


async def run_closed_loop(target: DispatchTarget, config: DispatchConfig) -> DispatchStats:
    """`concurrency` workers send back to back until `duration_s` or `max_queries`; latency from the send."""
    clock = target.clock
    t0_s = clock.now_s()
    deadline_s = t0_s + config.duration_s
    next_index = 0
    last_send_s = t0_s

    async def worker() -> None:
        nonlocal next_index, last_send_s
        while clock.now_s() < deadline_s and (config.max_queries == 0 or next_index < config.max_queries):
            index = next_index
            next_index += 1
            start_s = clock.now_s()
            last_send_s = max(last_send_s, start_s)
            target.record(index, start_s, await target.send(index, config.samples_per_query), t0_s)

    async with asyncio.TaskGroup() as group:
        for _ in range(config.concurrency):
            group.create_task(worker())
    return DispatchStats(
        mode="closed",
        queries_sent=next_index,
        late_sends=0,
        max_send_lag_ms=0.0,
        mean_send_lag_ms=0.0,
        wall_s=clock.now_s() - t0_s,
        send_window_s=last_send_s - t0_s,
    )
