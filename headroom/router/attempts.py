"""One request's attempts on the replicas: retries, the race of copies, the fallback model.

`attempts_or_fallback` runs `attempts` (the first replica, then retries elsewhere under the retry budget for
attempts that never started or lost their connection before any answer byte, on replayable routes) and, when
the primary model failed and has a fallback, the fallback's attempts once (`headroom.router.degrade`). Each
attempt is a `race`.

Hedging (Tail at Scale): a backup after the p95 of recent latency, under the hedge budget. Tied requests: the
second copy after `tied_delay_s` (~2 ms). The first usable answer wins; the other copy is cancelled, which
closes its connection so the replica drops the work (a queued request is removed from its queue).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from headroom.core.errors import NotReady
from headroom.router import degrade, tail
from headroom.router.request_keys import RouteKey
from headroom.router.upstream import HttpAttempt
from headroom.router.wire import Outgoing

if TYPE_CHECKING:
    from headroom.router.proxy import Router


async def race(router: Router, first: HttpAttempt, out: Outgoing, key: RouteKey, tried: set[str]) -> HttpAttempt:
    """Run `first`; after the hedge delay, maybe send a backup; return the winning attempt.

    Whatever is still running when this returns or is cancelled (client gone) is cancelled, which
    closes its connection so the replica drops the work, and its outstanding slot is released.
    """
    client = router.require_client()
    tasks: dict[asyncio.Task[HttpAttempt], HttpAttempt] = {}
    tasks[asyncio.create_task(first.run(client, router.build(first.replica, out)))] = first
    winner: HttpAttempt | None = None
    try:
        winner = await _hedged(router, first, tasks, out, key, tried)
        return winner
    finally:
        for t, attempt in tasks.items():
            if attempt is winner:
                continue
            if not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await attempt.discard()  # idempotent: releases the slot of losers and abandoned attempts


async def _hedged(router: Router, first: HttpAttempt, tasks: dict[asyncio.Task[HttpAttempt], HttpAttempt],
                  out: Outgoing, key: RouteKey, tried: set[str]) -> HttpAttempt:
    (primary,) = tasks
    pipe = router.pipeline
    delay = pipe.second_copy_delay_s()
    if delay is None:
        return await primary
    done, _ = await asyncio.wait({primary}, timeout=delay)
    if done:
        return primary.result()
    backup_rt = pipe.pick(key, tried, first.arm)
    if backup_rt is None or not pipe.allow_second_copy(backup_rt.upstream.replica_id):
        return await primary
    tried.add(backup_rt.upstream.replica_id)
    second = HttpAttempt(backup_rt, router.clock, hedge=True, arm=first.arm)
    tasks[asyncio.create_task(second.run(router.require_client(), router.build(backup_rt, out)))] = second
    pending: set[asyncio.Task[HttpAttempt]] = set(tasks)
    winner: HttpAttempt = first
    decided = False
    while pending and not decided:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        # a usable answer wins; when nothing is left running, the last result is the answer
        results = sorted((t.result() for t in done), key=lambda a: a.outcome != "ok")
        for a in results:
            if not decided and (a.outcome == "ok" or (not pending and a is results[-1])):
                winner, decided = a, True
            elif a.outcome == "ok":
                await a.discard()  # both answered at once: keep one
            else:
                await router.drop(a)  # an error while the other copy may still answer
    if winner is second:
        pipe.counters["hedge_wins"] += 1
    return winner


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
