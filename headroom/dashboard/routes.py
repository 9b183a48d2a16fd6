"""Starlette routes for the dashboard: the static page and the simulator playground API.

    GET  /dashboard                  the single-page playground (vanilla JS, inline SVG; nothing fetched)
    GET  /dashboard/api/presets      servers, batching modes and the page's three suggested experiments
    POST /dashboard/api/simulate     {server, batching, replicas, autoscale, qps[, duration_s, seed]}
                                     -> metrics and a coloured histogram (the simulation runs in a thread)

The lead mounts these into the server: ``routes.extend(dashboard_routes())``.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from headroom.dashboard.playground import BATCHING, PRESETS, SERVERS, PlaygroundRequest, run_playground


class SimulateBody(BaseModel):
    """The POST body (validated at the edge, then turned into the frozen PlaygroundRequest)."""

    server: str = "vllm"
    batching: str = "continuous"
    replicas: int = Field(2, ge=1, le=16)
    autoscale: bool = False
    qps: float = Field(12.0, gt=0, le=500)
    duration_s: float = Field(180.0, ge=1, le=3600)
    seed: int = 0


def _page() -> str:
    return resources.files("headroom.dashboard").joinpath("page.html").read_text(encoding="utf-8")


def dashboard_routes(prefix: str = "/dashboard") -> list[Route]:
    """The dashboard's routes under `prefix`."""
    page = _page()

    async def index(request: Request) -> Response:
        return HTMLResponse(page)

    async def presets(request: Request) -> Response:
        servers = {k: {"label": s.label, "blurb": s.blurb, "default_batching": s.default_batching}
                   for k, s in SERVERS.items()}
        return JSONResponse({"servers": servers, "batching": list(BATCHING), "presets": PRESETS})

    async def simulate(request: Request) -> Response:
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
        Route(f"{prefix}/api/presets", presets, methods=["GET"]),
        Route(f"{prefix}/api/simulate", simulate, methods=["POST"]),
    ]
