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
import logging
from typing import TYPE_CHECKING

from headroom.core.errors import NotReady
from headroom.router import degrade, tail
from headroom.router.request_keys import RouteKey
from headroom.router.upstream import Attempt
from headroom.router.wire import Outgoing

log = logging.getLogger("headroom.router")

if TYPE_CHECKING:
    from headroom.router.proxy import Router


async def race(router: Router, first: Attempt, out: Outgoing, key: RouteKey, tried: set[str]) -> Attempt:
    """Run `first`; after the hedge delay, maybe send a backup; return the winning attempt.

    Whatever is still running when this returns or is cancelled (client gone) is cancelled, which
    closes its connection so the replica drops the work, and its outstanding slot is released.
    """
    client = router._require_client()
    tasks: dict[asyncio.Task[Attempt], Attempt] = {}
    tasks[asyncio.create_task(first.run(client, router._build(first.replica, out)))] = first
    winner: Attempt | None = None
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

async def _hedged(router: Router, first: Attempt, tasks: dict[asyncio.Task[Attempt], Attempt], out: Outgoing,
              key: RouteKey, tried: set[str]) -> Attempt:
    (primary,) = tasks
    c = router.config
    delay = c.tied_delay_s if c.tied else tail.hedge_delay_s(router.latencies, c.hedge) if c.hedging else None
    if delay is None:
        return await primary
    done, _ = await asyncio.wait({primary}, timeout=delay)
    if done:
        return primary.result()
    backup_rt = router._pick(key, tried, first.arm)
    if backup_rt is None:
        return await primary
    allowed, router.hedge_state = tail.budget_withdraw(router.hedge_state, router.clock.now_s(),
                                                     router.config.hedge_budget)
    if not allowed:
        return await primary
    router.counters["tied" if c.tied else "hedges"] += 1
    tried.add(backup_rt.upstream.replica_id)
    second = Attempt(backup_rt, router.clock, hedge=True, arm=first.arm)
    tasks[asyncio.create_task(second.run(router._require_client(), router._build(backup_rt, out)))] = second
    pending: set[asyncio.Task[Attempt]] = set(tasks)
    winner: Attempt = first
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
                await router._drop(a)  # an error while the other copy may still answer
    if winner is second:
        router.counters["hedge_wins"] += 1
    return winner


async def attempts_or_fallback(router: Router, out: Outgoing, key: RouteKey) -> tuple[Attempt, Outgoing]:
    """The primary's attempts; when they fail and its model has a fallback, the fallback's, once (and the
    primary's failures feed its breaker: enough in a row eject it, see `degrade`)."""
    cfg = router.config.degrade
    primary = degrade.model_of(out.path_and_query.partition("?")[0], out.body) if not out.degraded_to else ""
    refused: NotReady | None = None
    try:
        first: Attempt | None = await attempts(router, out, key)
    except NotReady as exc:  # no replica would take it
        first, refused = None, exc
    failed = first is None or degrade.primary_failed(first.outcome)
    if primary and primary in cfg.fallbacks:
        router.breaker, ejected = degrade.breaker_record(router.breaker, primary, failed, router.clock.now_s(), cfg)
        if ejected:
            log.warning("event=model_ejected model=%s fallback=%s ejection_s=%.0f", primary,
                        cfg.fallbacks[primary], cfg.ejection_s)
    fallback = degrade.fallback_outgoing(out, cfg.fallbacks) if failed and cfg.on_error else None
    if fallback is None:
        if first is None and refused is not None:
            raise refused
        if first is None:
            raise NotReady("no replica is ready; retry later", retry_after_s=1.0)
        return first, out
    if first is not None:
        await router._drop(first)
    router.counters["degraded_on_error"] += 1
    return await attempts(router, fallback, key), fallback


async def attempts(router: Router, out: Outgoing, key: RouteKey) -> Attempt:
    tried: set[str] = set()
    last: Attempt | None = None
    arm = router._arm()
    for attempt_no in range(router.config.max_attempts):
        rt = router._pick(key, tried, arm)
        if rt is None:
            break
        if attempt_no > 0 and not router.allow_retry():
            break
        tried.add(rt.upstream.replica_id)
        last = await race(router, Attempt(rt, router.clock, arm=arm), out, key, tried)
        if not tail.retryable(last.outcome, out.replayable):
            return last
        await router._drop(last)
    if last is None:
        router.counters["no_replica"] += 1
        raise NotReady("no replica is ready (loading, warming, draining or ejected); retry later",
                       retry_after_s=1.0)
    if last.outcome == "connect_error":
        router.counters["upstream_failed"] += 1
        raise NotReady(f"could not reach a replica (last tried {last.replica.upstream.replica_id}); "
                       "retry later", retry_after_s=1.0)
    return last  # a not_ready 503 from the replica: pass it through
