"""Retry storm: clients that re-send the moment they are refused (a retry loop that ignores Retry-After). Does
the server go on serving what it admits near its capacity, or do the refusals crowd the admitted work out?

minilm `/v1/embeddings`: the closed-loop capacity (16 connections, as in the overload scenario), then
`connections` connections (64) that each send their next request as soon as the previous one is answered,
whatever the answer, for `duration_s`. Before refusal pacing (`headroom.batching.refusal_pacing`) such a storm
left minilm 57-176 accepted requests/s of ~650 (session 16, a Zen 5 EPYC).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.reliability.common import MODELS, headroom
from benchmarks.reliability.lean_client import closed_loop, closed_loop_statuses
from benchmarks.reliability.overload import BODY, CAPACITY_CONNECTIONS, ROUTE

CONNECTIONS = 64


def run(log_dir: Path, duration_s: float, capacity_s: float, connections: int = CONNECTIONS,
        repository: Path = MODELS, serve_args: Sequence[str] = ()) -> dict[str, Any]:
    """Serve minilm from `repository`, measure its capacity, then storm it for `duration_s`."""
    args = ["--model-repository", str(repository), "--model", "minilm", "--no-access-log", *serve_args]
    with headroom("serve", args, log_dir) as srv:
        url = srv.url + ROUTE
        asyncio.run(closed_loop(url, BODY, min(3.0, capacity_s)))  # warm the process up first
        capacity = asyncio.run(closed_loop(url, BODY, capacity_s, concurrency=CAPACITY_CONNECTIONS))
        statuses, wall_s = asyncio.run(closed_loop_statuses(url, BODY, duration_s, concurrency=connections))
    accepted = statuses.get(200, 0) / wall_s
    refused = sum(n for s, n in statuses.items() if s in (429, 503)) / wall_s
    return {"capacity_per_s": capacity, "connections": connections, "duration_s": wall_s,
            "accepted_per_s": accepted, "refused_per_s": refused,
            "other_statuses": {str(s): n for s, n in statuses.items() if s not in (200, 429, 503)},
            "accepted_vs_capacity": accepted / capacity if capacity else None}
