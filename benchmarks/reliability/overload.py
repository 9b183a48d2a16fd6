"""Overload: minilm at twice its measured capacity. Are rejections fast, accepted requests within the SLO,
goodput near capacity, and no connection refused or reset?"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks.reliability.common import headroom, open_loop, percentile_ms

BODY = orjson.dumps({"model": "minilm", "input": ["the quick brown fox jumps over the lazy dog"]})
ROUTE = "/v1/embeddings"


async def measure_capacity(url: str, seconds: float, concurrency: int = 8) -> float:
    """Closed loop at `concurrency`: successful requests per second (the server's capacity here)."""
    done = 0
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=30.0) as client:
        async def worker() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                r = await client.post(url, content=BODY, headers={"content-type": "application/json"})
                done += r.status_code == 200
        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.monotonic() - t0)


def run(log_dir: Path, duration_s: float, capacity_s: float, slo_ms: float, factor: float = 2.0) -> dict[str, Any]:
    with headroom("serve", ["--model-repository", "models", "--model", "minilm", "--no-access-log"], log_dir) as srv:
        url = srv.url + ROUTE
        asyncio.run(measure_capacity(url, min(3.0, capacity_s)))  # warm the process up first
        capacity = asyncio.run(measure_capacity(url, capacity_s))
        rate = factor * capacity
        outcomes = asyncio.run(open_loop(url, BODY, rate, duration_s))
    ok = [o.latency_s for o in outcomes if o.status == 200]
    rejected = [o.latency_s for o in outcomes if o.status in (429, 503)]
    goodput = sum(1 for s in ok if s * 1e3 <= slo_ms) / duration_s
    return {
        "capacity_per_s": capacity, "offered_per_s": rate, "duration_s": duration_s, "requests": len(outcomes),
        "accepted": len(ok), "rejected": len(rejected),
        "other_status": sum(1 for o in outcomes if o.status not in (0, 200, 429, 503)),
        "connection_errors": sum(1 for o in outcomes if o.status == 0),
        "accepted_p50_ms": percentile_ms(ok, 0.5), "accepted_p99_ms": percentile_ms(ok, 0.99),
        "rejection_p99_ms": percentile_ms(rejected, 0.99), "slo_ms": slo_ms,
        "goodput_per_s": goodput, "goodput_vs_capacity": goodput / capacity if capacity else None,
    }
