"""A dying replica behind `headroom route`: `kill -9` of one of 2 replicas, then (a fresh fleet) SIGTERM of
one, each under a constant open-loop rate. A request without a 200 is either shed (429, or 503 "overloaded":
refused before it ran, with Retry-After) or lost (any other failure: 502, 504, a reset, ...)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks.reliability.common import children, cmdline, headroom, percentile_ms
from benchmarks.reliability.lean_client import LoadRun, open_loop

BODY = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
ROUTE = "/v2/models/noop/infer"


def replica_pids(router_pid: int) -> list[int]:
    """The `headroom serve` replica processes the router started."""
    return [pid for pid in children(router_pid) if "serve" in cmdline(pid)]


def wait_replicas_ready(url: str, n: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = httpx.get(url + "/router/stats", timeout=2.0).json()
        if sum(r["ready"] for r in stats["replicas"]) >= n:
            return
        time.sleep(0.2)
    raise RuntimeError(f"fewer than {n} replicas ready after {timeout_s} s")


async def _load_with_fault(url: str, rate: float, duration_s: float, victim: int, sig: int) -> LoadRun:
    async def fault() -> None:
        await asyncio.sleep(duration_s / 4)
        os.kill(victim, sig)

    faulting = asyncio.create_task(fault())
    try:
        return await open_loop(url + ROUTE, BODY, rate, duration_s)
    finally:
        await faulting


#: What one noop replica serves concurrently: a whole batch (its config's max_batch_size), as docs/router.md
#: advises. The router's default (8, sized for a real model's SLO) sheds at 100/s on a busy 2-core machine
#: before any fault: ~70 ms per request there puts 2 x 7 in flight, past 80% of 2 x 8.
NOOP_CAPACITY = 64


def one(log_dir: Path, sig: int, rate: float, duration_s: float) -> dict[str, Any]:
    args = ["--replicas", "2", "--model-repository", "benchmarks/models", "--model", "noop", "--drain-timeout-s", "20",
            "--replica-capacity", str(NOOP_CAPACITY)]
    with headroom("route", args, log_dir) as router:
        wait_replicas_ready(router.url, 2, 300.0)
        victim = replica_pids(router.process.pid)[0]
        load = asyncio.run(_load_with_fault(router.url, rate, duration_s, victim, sig))
        stats = httpx.get(router.url + "/router/stats", timeout=2.0).json()
    outcomes = load.outcomes
    failed = [o for o in outcomes if o.status != 200]
    shed = [o for o in failed if o.status == 429 or (o.status == 503 and '"overloaded"' in o.error)]
    return {
        "signal": signal.Signals(sig).name, "rate_per_s": rate, "duration_s": duration_s,
        "requests": len(outcomes), "lost": len(failed) - len(shed), "shed": len(shed),
        "failed_by_status": dict(Counter(str(o.status) for o in failed)),
        "failed_examples": sorted({o.error for o in failed})[:5],
        "p99_ms": percentile_ms([o.latency_s for o in outcomes if o.status == 200], 0.99),
        "router_retries": stats["counters"]["retries"], "router_retries_denied": stats["counters"]["retries_denied"],
        **load.lag_summary(),
    }


def run(log_dir: Path, rate: float, duration_s: float) -> dict[str, Any]:
    return {"kill_9": one(log_dir, signal.SIGKILL, rate, duration_s),
            "sigterm": one(log_dir, signal.SIGTERM, rate, duration_s)}
