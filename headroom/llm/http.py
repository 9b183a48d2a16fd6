"""Starlette routes for `OpenAIServing`: `POST /v1/chat/completions` and `POST /v1/completions`.

The server mounts these next to its own `/v1/models` (fed by `OpenAIServing.model_cards()`).
A client that disconnects mid-stream cancels the response task; the stream's cleanup aborts the request,
which frees its KV blocks before the engine's next step.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from headroom.llm.openai_protocol import ServingResponse, error_response
from headroom.llm.serving import OpenAIServing


def _to_response(result: ServingResponse) -> Response:
    if result.stream is not None:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **result.headers}
        return StreamingResponse(result.stream, media_type="text/event-stream", headers=headers)
    return JSONResponse(dict(result.body or {}), status_code=result.status, headers=dict(result.headers))


def _endpoint(call: Callable[[object], Awaitable[ServingResponse]]) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _to_response(error_response(400, f"the request body is not valid JSON: {exc}"))
        if not isinstance(body, dict):
            return _to_response(error_response(400, "the request body must be a JSON object"))
        return _to_response(await call(body))

    return endpoint


def openai_routes(serving: OpenAIServing) -> list[Route]:
    """The OpenAI generation routes for one served model."""
    return [
        Route("/v1/chat/completions", _endpoint(serving.create_chat_completion), methods=["POST"]),
        Route("/v1/completions", _endpoint(serving.create_completion), methods=["POST"]),
    ]
