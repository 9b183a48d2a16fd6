"""Overload: minilm at twice its measured capacity. Are rejections fast, accepted requests within the SLO,
goodput near capacity, and no connection refused or reset?

Capacity and the overload run use the same lean client (`lean_client`), and the run reports the client's own lag
from its schedule and its CPU share, so a figure from a client that could not keep up is visible as such.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from benchmarks.reliability.common import MODELS, ROOT, Outcome, headroom, percentile_ms
from benchmarks.reliability.lean_client import closed_loop, open_loop
from headroom.core.server_timing import parse_server_timing

BODY = orjson.dumps({"model": "minilm", "input": ["the quick brown fox jumps over the lazy dog"]})
ROUTE = "/v1/embeddings"
#: Connections of the capacity loop: batches of ~8 on each of minilm's 2 instances. With 8 connections, batches of
#: ~4 read 260/s, while the server went on to serve 370/s within the SLO at 2x that. With 64, admission refused most
#: requests, and the clients' instant re-sends starved the model (34/s).
CAPACITY_CONNECTIONS = 16


def run(log_dir: Path, duration_s: float, capacity_s: float, slo_ms: float, factor: float = 2.0,
        repository: Path = MODELS, serve_args: Sequence[str] = (), code: Path = ROOT) -> dict[str, Any]:
    """Serve minilm from `repository` (an A/B arm may be a copy with its config changed, other `serve_args`, or
    another checkout's `code`), measure its closed-loop capacity, then offer `factor` x that as an open loop for
    `duration_s`."""
    args = ["--model-repository", str(repository), "--model", "minilm", "--no-access-log", *serve_args]
    with headroom("serve", args, log_dir, code=code) as srv:
        url = srv.url + ROUTE
        asyncio.run(closed_loop(url, BODY, min(3.0, capacity_s)))  # warm the process up first
        capacity = asyncio.run(closed_loop(url, BODY, capacity_s, concurrency=CAPACITY_CONNECTIONS))
        rate = factor * capacity
        load = asyncio.run(open_loop(url, BODY, rate, duration_s))
    outcomes = load.outcomes
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
        "run_wall_s": load.wall_s, "connections_opened": load.connections_opened, **load.lag_summary(),
        "accepted_stages_ms": stage_percentiles([o for o in outcomes if o.status == 200]),
    }


def stage_percentiles(answered: list[Outcome]) -> dict[str, dict[str, float | None]]:
    """p50/p99 of each Server-Timing stage of the answers, and of the client's latency outside the server's
    total (the HTTP hop, the event loops' lag on both sides): where an accepted request's time went."""
    stages: dict[str, list[float]] = {}
    for o in answered:
        timing = parse_server_timing(o.server_timing)
        for name, ms in timing.items():
            stages.setdefault(name, []).append(ms / 1e3)
        if "total" in timing:
            stages.setdefault("outside_server", []).append(o.latency_s - timing["total"] / 1e3)
    return {name: {"p50": percentile_ms(v, 0.5), "p99": percentile_ms(v, 0.99)} for name, v in stages.items()}
