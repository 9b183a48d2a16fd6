"""`GET /router/stats`: the router's counters and per-replica state as JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from headroom.router.proxy import Router


def stats_json(router: Router) -> bytes:
    now = router.clock.now_s()
    reps = [{"id": s.replica_id, "url": router.replicas[s.replica_id].upstream.base_url, "ready": s.ready,
             "ejected": s.ejected(now), "outstanding": s.outstanding,
             "ewma_latency_ms": s.ewma_latency_s * 1e3, "requests": router.replicas[s.replica_id].requests,
             "failures": router.replicas[s.replica_id].failures} for s in router.snapshots()]
    canary = None if router.canary is None else {"version": router.canary.canary_version,
                                                 "weight": router.canary.weight, "phase": router.canary.state.phase}
    return orjson.dumps({"counters": router.counters, "replicas": reps, "inflight": router.inflight,
                         "concurrency_limit": router.vegas.effective_limit(router.config.vegas), "canary": canary})
