"""Active readiness checks: `GET /v2/health/ready` on every replica at once (the router folds the results
into `headroom.router.health`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx


async def probe_ready(client: httpx.AsyncClient, base_urls: Sequence[str], timeout_s: float) -> list[bool]:
    """Whether each replica answered its readiness check with 200 within `timeout_s`."""
    async def probe(base_url: str) -> bool:
        try:
            r = await client.get(base_url + "/v2/health/ready", timeout=timeout_s)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    return list(await asyncio.gather(*(probe(u) for u in base_urls)))
