"""Hedged requests (The Tail at Scale): run an attempt and, after the hedge delay, maybe a backup on another
replica under the hedge budget; the first usable answer wins and the other attempt is cancelled."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from headroom.router import tail
from headroom.router.upstream import Attempt
from headroom.router.wire import Outgoing

if TYPE_CHECKING:
    from headroom.router.proxy import Router


async def race(router: Router, first: Attempt, out: Outgoing, key: str | None, tried: set[str]) -> Attempt:
    """Run `first`; after the hedge delay, maybe send a backup; return the winning attempt.

    Whatever is still running when this returns or is cancelled (client gone) is cancelled, which
    closes its connection so the replica drops the work, and its outstanding slot is released.
    """
    client = router.require_client()
    tasks: dict[asyncio.Task[Attempt], Attempt] = {}
    tasks[asyncio.create_task(first.run(client, router.build_request(first.replica, out)))] = first
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
                  key: str | None, tried: set[str]) -> Attempt:
    (primary,) = tasks
    delay = tail.hedge_delay_s(router.latencies, router.config.hedge) if router.config.hedging else None
    if delay is None:
        return await primary
    done, _ = await asyncio.wait({primary}, timeout=delay)
    if done:
        return primary.result()
    backup_rt = router.pick_in_arm(key, tried, first.arm)
    if backup_rt is None:
        return await primary
    allowed, router.hedge_state = tail.budget_withdraw(router.hedge_state, router.clock.now_s(),
                                                     router.config.hedge_budget)
    if not allowed:
        return await primary
    router.counters["hedges"] += 1
    tried.add(backup_rt.upstream.replica_id)
    second = Attempt(backup_rt, router.clock, hedge=True, arm=first.arm)
    tasks[asyncio.create_task(second.run(router.require_client(), router.build_request(backup_rt, out)))] = second
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
                await router.drop(a)  # an error while the other copy may still answer
    if winner is second:
        router.counters["hedge_wins"] += 1
    return winner
