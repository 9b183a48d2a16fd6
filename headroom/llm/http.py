"""Starlette routes for `OpenAIServing`: `POST /v1/chat/completions` and `POST /v1/completions`.

The server mounts these next to its own `/v1/models` (fed by `OpenAIServing.model_cards()`).
A client that disconnects mid-stream ends the response; the response then closes the SSE generator at once
(not whenever it is garbage-collected), whose cleanup aborts the request, which frees its KV blocks before
the engine's next step. Each admitted generation's `LLMUsage` lands in `request.state` (see
`headroom.gateway.usage`) before the route returns, where the gateway refunds unused LLM tokens. The
gateway's authenticated tenant (`request.state`) scopes the prefix cache.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from headroom.gateway.usage import LLMUsage, report_usage
from headroom.llm.openai_protocol import ServingResponse, error_response
from headroom.llm.openai_usage import UsageCallback
from headroom.llm.serving import OpenAIServing


class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that closes its generator when done, also when the client went away mid-stream."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


def _to_response(result: ServingResponse) -> Response:
    if result.stream is not None:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **result.headers}
        return ClosingStreamingResponse(result.stream, media_type="text/event-stream", headers=headers)
    return JSONResponse(dict(result.body or {}), status_code=result.status, headers=dict(result.headers))


def openai_endpoint(
    call: Callable[[object, UsageCallback, str], Awaitable[ServingResponse]],
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _to_response(error_response(400, f"the request body is not valid JSON: {exc}"))
        if not isinstance(body, dict):
            return _to_response(error_response(400, "the request body must be a JSON object"))
        state = request.scope.setdefault("state", {})

        def on_usage(usage: LLMUsage) -> None:
            report_usage(state, usage)

        return _to_response(await call(body, on_usage, str(state.get("tenant", ""))))

    return endpoint


def openai_routes(serving: OpenAIServing) -> list[Route]:
    """The OpenAI generation routes for one served model."""
    return [
        Route("/v1/chat/completions", openai_endpoint(serving.create_chat_completion), methods=["POST"]),
        Route("/v1/completions", openai_endpoint(serving.create_completion), methods=["POST"]),
    ]
