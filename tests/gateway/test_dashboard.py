"""The Grafana dashboard only queries metrics headroom really exports (names from the live registries)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from headroom.gateway.middleware import GatewayConfig, GatewayMiddleware
from headroom.llm.metrics import LLMMetrics
from headroom.server.metrics import ServerMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "headroom-dashboard.json"


async def _noop(scope: object, receive: object, send: object) -> None:
    return None


def exported_series() -> set[str]:
    """Every sample name the server, the LLM engine and the gateway can expose."""
    registry = CollectorRegistry()
    ServerMetrics(registry)
    LLMMetrics(registry, "m")
    GatewayMiddleware(_noop, GatewayConfig(), registry=registry)
    names: set[str] = set()
    for family in registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
        names.update(family.name + s for s in suffixes.get(family.type, [""]))
    return names


def test_dashboard_is_valid_and_queries_real_metrics() -> None:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in doc["templating"]["list"] if "definition" in v]
    assert len(exprs) > 20
    used = {m for e in exprs for m in re.findall(r"\b(headroom_[a-z0-9_]+)", e)}
    missing = used - exported_series()
    assert not missing, f"dashboard queries metrics nobody exports: {sorted(missing)}"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    families = {re.sub(r"_(total|bucket|sum|count)$", "", m) for m in used}
    assert {"headroom_requests", "headroom_compute_seconds", "headroom_llm_time_to_first_token_seconds",
            "headroom_gateway_refused"} <= families
