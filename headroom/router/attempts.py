"""One request's attempts on the replicas: retries, the race of copies, the fallback model.

`attempts_or_fallback` runs `attempts` (the first replica, then retries elsewhere under the retry budget for
attempts that never started or lost their connection before any answer byte, on replayable routes) and, when
the primary model failed and has a fallback, the fallback's attempts once (`headroom.router.degrade`). Each
attempt is a `race`.

Hedging (Tail at Scale): a backup after the p95 of recent latency, under the hedge budget. Tied requests: the
second copy after `tied_delay_s` (~2 ms), both tagged; the copy whose replica reports first that it started
executing wins, and its twin is cancelled at once (or never sent). Without a notice, the first usable answer
wins. A cancelled copy's connection is closed, so its replica drops the work (a queued request is removed
from its queue).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from headroom.core.errors import NotReady
from headroom.router import degrade, tail
from headroom.router.request_keys import RouteKey
from headroom.router.tied import TiedRace
from headroom.router.upstream import HttpAttempt
from headroom.router.wire import Outgoing

if TYPE_CHECKING:
    from headroom.router.proxy import Router


async def race(router: Router, first: HttpAttempt, out: Outgoing, key: RouteKey, tried: set[str]) -> HttpAttempt:
    """Run `first`; after the hedge (or tied) delay, maybe send a second copy; return the winning attempt.

    Whatever is still running when this returns or is cancelled (client gone) is cancelled, which
    closes its connection so the replica drops the work, and its outstanding slot is released.
    """
    client = router.require_client()
    tied = router.tied.open() if router.config.tied and out.callback_port else None
    tasks: dict[asyncio.Task[HttpAttempt], HttpAttempt] = {}
    sent = tied.outgoing(out, 0) if tied is not None else out
    tasks[asyncio.create_task(first.run(client, router.build(first.replica, sent)))] = first
    winner: HttpAttempt | None = None
    try:
        winner = await _second_copy(router, first, tasks, out, key, tried, tied)
        return winner
    finally:
        if tied is not None:
            router.tied.close(tied)
        for t, attempt in tasks.items():
            if attempt is winner:
                continue
            if not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await attempt.discard()  # idempotent: releases the slot of losers and abandoned attempts


async def _second_copy(router: Router, first: HttpAttempt, tasks: dict[asyncio.Task[HttpAttempt], HttpAttempt],
                       out: Outgoing, key: RouteKey, tried: set[str], tied: TiedRace | None) -> HttpAttempt:
    """Hedging or tied requests: wait out the delay, send the second copy, and run the race of the two.

    Tied: a copy whose replica reports it started executing (`headroom.router.tied`) has its twin cancelled
    (or never sent, when the notice comes within the delay); the started copy's answer is the answer.
    """
    (primary,) = tasks
    pipe = router.pipeline
    delay = pipe.second_copy_delay_s()
    if delay is None:
        return await primary
    started: asyncio.Future[int] | None = tied.started if tied is not None else None
    done, _ = await asyncio.wait({primary, *(() if started is None else (started,))}, timeout=delay,
                                 return_when=asyncio.FIRST_COMPLETED)
    if primary in done:
        return primary.result()
    if started is not None and started.done():  # already executing: a twin could only run it twice
        pipe.counters["tied_unsent"] += 1
        return await primary
    backup_rt = pipe.pick(key, tried, first.arm)
    if backup_rt is None or not pipe.allow_second_copy(backup_rt.upstream.replica_id):
        return await primary
    tried.add(backup_rt.upstream.replica_id)
    second = HttpAttempt(backup_rt, router.clock, hedge=True, arm=first.arm)
    sent = tied.outgoing(out, 1) if tied is not None else out
    backup = asyncio.create_task(second.run(router.require_client(), router.build(backup_rt, sent)))
    tasks[backup] = second
    winner = await _first_usable(router, (primary, backup), started)
    if winner is second:
        pipe.counters["hedge_wins"] += 1
    return winner


async def _first_usable(router: Router, copies: tuple[asyncio.Task[HttpAttempt], asyncio.Task[HttpAttempt]],
                        started: asyncio.Future[int] | None) -> HttpAttempt:
    """The first usable answer of the two copies; when nothing is left running, the last result. A start
    notice (tied) withdraws the other copy: its task is cancelled, and `race` releases its slot."""
    pending: set[asyncio.Task[HttpAttempt]] = set(copies)
    watching = started is not None and not started.done()
    while True:
        waits: set[asyncio.Future[Any]] = {*pending}
        if watching and started is not None:
            waits.add(started)
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if watching and started is not None and started in done:
            watching = False
            twin = copies[1 - started.result()]
            if twin in pending and len(pending) == 2:
                pending.discard(twin)
                twin.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await twin
                router.pipeline.counters["tied_withdrawn"] += 1
        finished = [t for t in pending if t.done()]
        pending.difference_update(finished)
        # a usable answer wins; when nothing is left running, the last result is the answer
        results = sorted((t.result() for t in finished), key=lambda a: a.outcome != "ok")
        for i, a in enumerate(results):
            if a.outcome == "ok" or (not pending and i == len(results) - 1):
                for other in results[i + 1:]:
                    await (other.discard() if other.outcome == "ok" else router.drop(other))
                return a
            await router.drop(a)  # an error while the other copy may still answer


async def attempts_or_fallback(router: Router, out: Outgoing, key: RouteKey) -> tuple[HttpAttempt, Outgoing]:
    """The primary's attempts; when they fail and its model has a fallback, the fallback's, once (and the
    primary's failures feed its breaker: enough in a row eject it, see `degrade`)."""
    cfg, pipe = router.config.degrade, router.pipeline
    primary = degrade.model_of(out.path_and_query.partition("?")[0], out.body) if not out.degraded_to else ""
    refused: NotReady | None = None
    try:
        first: HttpAttempt | None = await attempts(router, out, key)
    except NotReady as exc:  # no replica would take it
        first, refused = None, exc
    failed = first is None or degrade.primary_failed(first.outcome)
    if primary and primary in cfg.fallbacks:
        pipe.primary_result(primary, failed)
    fallback = degrade.fallback_outgoing(out, cfg.fallbacks) if failed and cfg.on_error else None
    if fallback is None:
        if first is None and refused is not None:
            raise refused
        if first is None:
            raise NotReady("no replica is ready; retry later", retry_after_s=1.0)
        return first, out
    if first is not None:
        await router.drop(first)
    pipe.counters["degraded_on_error"] += 1
    return await attempts(router, fallback, key), fallback


async def attempts(router: Router, out: Outgoing, key: RouteKey) -> HttpAttempt:
    pipe = router.pipeline
    tried: set[str] = set()
    last: HttpAttempt | None = None
    arm = pipe.arm()
    for attempt_no in range(router.config.max_attempts):
        rt = pipe.pick(key, tried, arm)
        if rt is None:
            break
        if attempt_no > 0 and not pipe.allow_retry(*((last.outcome, last.replica.upstream.replica_id)
                                                      if last is not None else ())):
            break
        tried.add(rt.upstream.replica_id)
        last = await race(router, HttpAttempt(rt, router.clock, arm=arm), out, key, tried)
        if not tail.retryable(last.outcome, out.replayable):
            return last
        await router.drop(last)
    if last is None:
        pipe.counters["no_replica"] += 1
        raise NotReady("no replica is ready (loading, warming, draining or ejected); retry later",
                       retry_after_s=1.0)
    if last.outcome == "connect_error":
        pipe.counters["upstream_failed"] += 1
        raise NotReady(f"could not reach a replica (last tried {last.replica.upstream.replica_id}); "
                       "retry later", retry_after_s=1.0)
    return last  # a not_ready 503 from the replica: pass it through
