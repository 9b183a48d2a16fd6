"""The router's rollout endpoints, which `headroom rollout start|status` call.

    POST /router/rollout   {"model": "minilm", "version": "2", "replicas": 1, "steps": [5, 25, 50, 100],
                            "step_duration_s": 60, "min_requests": 100, "max_error_rate": 0.01,
                            "max_p99_ratio": 1.2}
                           -> 202 + the status; 409 while another rollout runs; 400 for a bad field
    GET  /router/rollout   -> {"phase": idle|starting|progressing|complete|rolled_back|failed, "weight", ...}

Steps are percentages of traffic (5 = 5%) or fractions (0.05); the last one must be 100% (full promotion).
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from headroom.router.rollout import CanaryConfig
from headroom.router.rollout_fleet import RolloutError, RolloutFleet, RolloutSpec


class RolloutRequest(BaseModel):
    """The wire form of a rollout (unknown fields refused)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    version: str
    replicas: int = Field(1, ge=1)
    steps: list[float] = Field(default_factory=lambda: [5.0, 50.0, 100.0], min_length=1)
    step_duration_s: float = Field(60.0, ge=0)
    min_requests: int = Field(100, ge=1)
    max_error_rate: float = Field(0.01, ge=0, le=1)  # allowed increase of the error rate over the stable one
    max_p99_ratio: float = Field(1.2, ge=1)

    def spec(self) -> RolloutSpec:
        fractions = tuple(s / 100.0 if max(self.steps) > 1.0 else s for s in self.steps)
        canary = CanaryConfig(steps=fractions, step_duration_s=self.step_duration_s, min_requests=self.min_requests,
                              max_error_rate_increase=self.max_error_rate, max_p99_ratio=self.max_p99_ratio)
        return RolloutSpec(self.model, self.version, self.replicas, canary)


def _json(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def rollout_routes(fleet: RolloutFleet) -> list[Route]:
    async def status(request: Request) -> Response:
        return _json(fleet.status())

    async def start(request: Request) -> Response:
        try:
            spec = RolloutRequest.model_validate_json(await request.body()).spec()
        except ValidationError as exc:
            return _json({"error": "invalid rollout", "details": exc.errors(include_url=False)}, 400)
        except ValueError as exc:
            return _json({"error": str(exc)}, 400)
        try:
            fleet.start(spec)
        except RolloutError as exc:
            return _json({"error": str(exc)}, 409)
        return _json(fleet.status(), 202)

    return [Route("/router/rollout", status, methods=["GET"]), Route("/router/rollout", start, methods=["POST"])]
