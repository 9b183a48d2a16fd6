"""Starlette routes for the dashboard: the static page, live server numbers and the simulator playground API.

    GET  /dashboard                  the single page: live charts + the playground (vanilla JS, inline SVG;
                                     nothing fetched from elsewhere)
    GET  /dashboard/api/live         per-model rate, p50/p99, queue, batch size, KV cache, ... over the last
                                     window, from the server's Prometheus registry (404 when not attached to one)
    GET  /dashboard/api/presets      servers, batching modes and the page's three suggested experiments
    POST /dashboard/api/simulate     {server, batching, replicas, autoscale, qps[, duration_s, seed]}
                                     -> metrics and a coloured histogram (the simulation runs in a thread)

The server mounts these with its registry: ``dashboard_routes(registry=registry)``. The playground (the
simulator) is imported on its first use, not at server start (issue 16: cold start).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from typing import Any

from prometheus_client import CollectorRegistry
from pydantic import BaseModel, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from headroom.core.clock import Clock, MonotonicClock
from headroom.dashboard.live import LiveSampler, point_json


class SimulateBody(BaseModel):
    """The POST body (validated at the edge, then turned into the frozen PlaygroundRequest)."""

    server: str = "vllm"
    batching: str = "continuous"
    replicas: int = Field(2, ge=1, le=16)
    autoscale: bool = False
    qps: float = Field(12.0, gt=0, le=500)
    duration_s: float = Field(180.0, ge=1, le=3600)
    seed: int = 0


def page_html() -> str:
    """The dashboard's single page (also served by the router, whose fleet view it shows)."""
    return resources.files("headroom.dashboard").joinpath("page.html").read_text(encoding="utf-8")


def dashboard_routes(prefix: str = "/dashboard", registry: CollectorRegistry | None = None,
                     clock: Clock | None = None, live_window_s: float = 5.0,
                     replicas: Callable[[], int | None] | None = None) -> list[Route]:
    """The dashboard's routes under `prefix`. With `registry` (the server's), `/api/live` serves its live
    numbers over `live_window_s`; `replicas` reports the serving replica count where something knows it."""
    page = page_html()
    sampler = (LiveSampler(registry, clock or MonotonicClock(), live_window_s, replicas)
               if registry is not None else None)

    async def live(request: Request) -> Response:
        if sampler is None:
            return JSONResponse({"error": "no live metrics: this dashboard is not attached to a server's "
                                          "registry (start it with `headroom serve`)", "reason": "not_found"},
                                status_code=404)
        return JSONResponse(point_json(sampler.point()), headers={"cache-control": "no-store"})

    async def index(request: Request) -> Response:
        return HTMLResponse(page)

    async def presets(request: Request) -> Response:
        from headroom.dashboard.playground import BATCHING, PRESETS, SERVERS

        servers = {k: {"label": s.label, "blurb": s.blurb, "default_batching": s.default_batching}
                   for k, s in SERVERS.items()}
        return JSONResponse({"servers": servers, "batching": list(BATCHING), "presets": PRESETS})

    async def simulate(request: Request) -> Response:
        from headroom.dashboard.playground import PlaygroundRequest, run_playground

        try:
            raw: Any = json.loads(await request.body() or b"{}")
            body = SimulateBody.model_validate(raw)
            req = PlaygroundRequest(**body.model_dump())
        except (ValueError, ValidationError) as exc:
            return JSONResponse({"error": str(exc), "reason": "invalid_request"}, status_code=400)
        result = await run_in_threadpool(run_playground, req)
        return JSONResponse(result)

    return [
        Route(prefix, index, methods=["GET"]),
        Route(f"{prefix}/api/live", live, methods=["GET"]),
        Route(f"{prefix}/api/presets", presets, methods=["GET"]),
        Route(f"{prefix}/api/simulate", simulate, methods=["POST"]),
    ]
