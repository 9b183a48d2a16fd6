"""Active health checks: probe every replica's `/v2/health/ready` concurrently and fold the answers into the
router's `HealthState` (the pure `health.record_check` decides what a run of answers means)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence

import httpx

from headroom.router import health as hp
from headroom.router.upstream import ReplicaRuntime

log = logging.getLogger("headroom.router")


async def probe_ready(client: httpx.AsyncClient, runtimes: Sequence[ReplicaRuntime], timeout_s: float) -> list[bool]:
    """Whether each replica answered its readiness probe with 200 within `timeout_s`."""

    async def probe(rt: ReplicaRuntime) -> bool:
        try:
            r = await client.get(rt.upstream.base_url + "/v2/health/ready", timeout=timeout_s)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    return list(await asyncio.gather(*(probe(rt) for rt in runtimes)))


def record_probes(health: hp.HealthState, runtimes: Sequence[ReplicaRuntime], ready: Sequence[bool],
                  current: Collection[str], now_s: float, cfg: hp.HealthConfig) -> hp.HealthState:
    """The health state after the probes' answers (replicas no longer in `current` are skipped)."""
    for rt, ok in zip(runtimes, ready, strict=True):
        if rt.upstream.replica_id not in current:
            continue  # removed while probing
        event, health = hp.record_check(health, rt.upstream.replica_id, ok, now_s, cfg)
        if event is not None:
            log.info("event=%s replica=%s", event.kind, event.replica_id)
    return health
