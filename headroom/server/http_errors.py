"""One place that turns errors into HTTP responses: `{"error": message, "reason": ...}` + the right status,
with a `Server-Timing` of the time the server spent on the request (`other` + `total`: an error's time is not
attributed to stages), measured from the HTTP app's entry (`START_KEY` in the ASGI scope)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from headroom.core.errors import DRAINING_HEADER, Draining, HeadroomError

START_KEY = "headroom.start_s"  # the ASGI scope key holding time.monotonic() at the HTTP app's entry


def error_timing(scope: Mapping[str, Any]) -> str | None:
    """`Server-Timing` for an error response: the time since the request entered the HTTP app."""
    start_s = scope.get(START_KEY)
    if not isinstance(start_s, float):
        return None
    ms = (time.monotonic() - start_s) * 1e3
    return f"other;dur={ms:.3f}, total;dur={ms:.3f}"


def error_response(exc: HeadroomError, scope: Mapping[str, Any] | None = None) -> Response:
    headers = {}
    timing = error_timing(scope) if scope is not None else None
    if timing is not None:
        headers["Server-Timing"] = timing
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    if isinstance(exc, Draining):
        headers[DRAINING_HEADER] = "1"
    return Response(orjson.dumps(exc.to_json()), status_code=exc.http_status, headers=headers,
                    media_type="application/json")


async def headroom_error_handler(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, HeadroomError):
        raise exc
    await hold(exc)
    return error_response(exc, request.scope)


async def hold(exc: HeadroomError) -> None:
    """Wait before answering an error that asks for it: a refusal paced during a retry storm
    (`headroom.batching.refusal_pacing`). A timer, not CPU; the Server-Timing `total` then includes it."""
    if exc.hold_s > 0.0:
        await asyncio.sleep(exc.hold_s)


async def http_exception_handler(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, HTTPException):
        raise exc
    reasons = {404: "not_found", 405: "method_not_allowed"}
    message = exc.detail if exc.status_code != 404 else f"no route for {request.method} {request.url.path}"
    return Response(orjson.dumps({"error": message, "reason": reasons.get(exc.status_code, "http_error")}),
                    status_code=exc.status_code, media_type="application/json", headers=exc.headers)
