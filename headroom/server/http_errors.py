"""One place that turns errors into HTTP responses: `{"error": message, "reason": ...}` + the right status."""

from __future__ import annotations

import math

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from headroom.core.errors import DRAINING_HEADER, Draining, HeadroomError


def error_response(exc: HeadroomError) -> Response:
    headers = {}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    if isinstance(exc, Draining):
        headers[DRAINING_HEADER] = "1"
    return Response(orjson.dumps(exc.to_json()), status_code=exc.http_status, headers=headers,
                    media_type="application/json")


async def headroom_error_handler(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, HeadroomError):
        raise exc
    return error_response(exc)


async def http_exception_handler(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, HTTPException):
        raise exc
    reasons = {404: "not_found", 405: "method_not_allowed"}
    message = exc.detail if exc.status_code != 404 else f"no route for {request.method} {request.url.path}"
    return Response(orjson.dumps({"error": message, "reason": reasons.get(exc.status_code, "http_error")}),
                    status_code=exc.status_code, media_type="application/json", headers=exc.headers)
