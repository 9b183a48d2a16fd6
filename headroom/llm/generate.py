"""Triton's generate extension for the LLM: `POST /v2/models/{m}[/versions/{v}]/generate` and `generate_stream`.

The body is `{"text_input": "...", "parameters": {"max_tokens": 16, "temperature": 0, ...}}` (sampling keys
may also sit at the top level, as Triton's ensembles take them); the answer is `{"model_name",
"model_version", "text_output"}`, streamed as server-sent events by `generate_stream`. The request becomes an
OpenAI completion (`prompt` = `text_input`) and goes through `OpenAIServing.create_completion`: the same
validation, sampling, admission, usage reporting and engine as `/v1/completions`, so nothing is validated
twice. A key that no completion field takes is refused (400 naming it); errors use Triton's `{"error": msg}`
with the completion route's status (and Retry-After).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from headroom.core.errors import HeadroomError, InvalidRequest, ModelNotFound
from headroom.gateway.usage import LLMUsage, report_usage
from headroom.llm.http import ClosingStreamingResponse
from headroom.llm.openai_protocol import CompletionRequest, ServingResponse
from headroom.llm.serving import OpenAIServing

#: completion fields a generate request may set (prompt comes from text_input, streaming from the route).
GENERATE_KEYS = frozenset(CompletionRequest.model_fields) - {"prompt", "stream", "stream_options", "model", "echo"}


def completion_body(model: str, body: object, stream: bool) -> dict[str, Any]:
    """The `/v1/completions` body for a generate request; InvalidRequest naming a key it cannot take."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("the request body must be a JSON object with 'text_input'")
    text = body.get("text_input")
    if not isinstance(text, str):
        raise InvalidRequest("'text_input' must be a string (the prompt)")
    params = body.get("parameters") or {}
    if not isinstance(params, Mapping):
        raise InvalidRequest("'parameters' must be an object of sampling settings")
    top = {k: v for k, v in body.items() if k not in ("text_input", "parameters", "id")}
    both = sorted(set(top) & set(params))
    if both:
        raise InvalidRequest(f"'{both[0]}' is given both at the top level and in 'parameters'; send it once")
    merged = {**top, **params}
    merged.pop("stream", None)  # Triton clients send it; the route decides (generate vs generate_stream)
    unknown = sorted(set(merged) - GENERATE_KEYS)
    if unknown:
        raise InvalidRequest(f"'{unknown[0]}' is not a generate parameter (known: {', '.join(sorted(GENERATE_KEYS))})")
    return {**merged, "model": model, "prompt": text, "stream": stream}


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return JSONResponse({"error": message}, status_code=status, headers=dict(headers or {}))


def result_message(body: Mapping[str, Any] | None) -> str:
    """The error message of an OpenAI error body."""
    err = (body or {}).get("error")
    return str(err.get("message", err)) if isinstance(err, Mapping) else str(err)


async def generate_events(model: str, chunks: AsyncIterator[str]) -> AsyncGenerator[dict[str, Any], None]:
    """Completion SSE chunks -> Triton generate events (`{"model_name", "model_version", "text_output"[,
    "finish_reason"]}`, `{"error": message}`, or `{"sse_comment": text}`: the stream's Server-Timing comment).
    Closing this generator closes the completion stream (which
    aborts the request in the engine). Shared by `generate_stream` and gRPC `ModelStreamInfer`."""
    try:
        async for chunk in chunks:
            if chunk.startswith(":"):  # an SSE comment (the stream's Server-Timing), for transports that keep it
                yield {"sse_comment": chunk}
                continue
            data = chunk.removeprefix("data: ").strip()
            if not data or data == "[DONE]":
                continue
            doc = json.loads(data)
            if "error" in doc:
                yield {"error": result_message(doc)}
                continue
            for choice in doc.get("choices", ()):
                event = {"model_name": model, "model_version": "", "text_output": choice.get("text", "")}
                if choice.get("finish_reason"):
                    event["finish_reason"] = choice["finish_reason"]
                yield event
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


async def _events(model: str, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    """`generate_events` as server-sent events (`data: {...}`; no [DONE])."""
    events = generate_events(model, chunks)
    try:
        async for event in events:
            comment = event.get("sse_comment")
            yield comment if isinstance(comment, str) else f"data: {json.dumps(event)}\n\n"
    finally:
        await events.aclose()


class GenerateRoutes:
    """The generate routes for every LLM the server runs (one route set, dispatched by model name)."""

    def __init__(self, servings: Mapping[str, OpenAIServing], is_tensor_model: Any = None) -> None:
        self._servings = servings  # live: the server's table (an LLM added after start is served too)
        self._is_tensor_model = is_tensor_model  # name -> bool: a tensor model gets a 400 pointing at /infer

    def serves(self, name: str) -> bool:
        """Whether `name` is one of these LLMs."""
        return name in self._servings

    def serving(self, name: str, version: str = "") -> OpenAIServing:
        """The LLM `name` (ModelNotFound for another name or any version; a tensor model gets a 400)."""
        serving = self._servings.get(name)
        if serving is None:
            if self._is_tensor_model is not None and self._is_tensor_model(name):
                raise InvalidRequest(f"model '{name}' is not a generative model: use /v2/models/{name}/infer")
            raise ModelNotFound(f"Request for unknown model: '{name}' is not found")
        if version:
            raise ModelNotFound(f"Request for unknown model: '{name}' version {version} is not found")
        return serving

    async def _handle(self, request: Request, stream: bool) -> Response:
        p = request.path_params
        try:
            serving = self.serving(p["model"], p.get("version", ""))
            try:
                body = json.loads(await request.body())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
            completion = completion_body(serving.model_name, body, stream)
        except HeadroomError as exc:
            return _error(exc.http_status, exc.message)
        state = request.scope.setdefault("state", {})

        def on_usage(usage: LLMUsage) -> None:
            report_usage(state, usage)

        result: ServingResponse = await serving.create_completion(completion, on_usage)
        if result.status != 200:
            return _error(result.status, result_message(result.body), result.headers)
        if result.stream is not None:
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **result.headers}
            return ClosingStreamingResponse(_events(serving.model_name, result.stream),
                                             media_type="text/event-stream", headers=headers)
        choices = (result.body or {}).get("choices") or [{}]
        return JSONResponse({"model_name": serving.model_name, "model_version": "",
                             "text_output": choices[0].get("text", "")}, headers=dict(result.headers))

    async def generate(self, request: Request) -> Response:
        return await self._handle(request, stream=False)

    async def generate_stream(self, request: Request) -> Response:
        return await self._handle(request, stream=True)

    def routes(self) -> list[Route]:
        out = []
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            out.append(Route(f"{prefix}/generate", self.generate, methods=["POST"]))
            out.append(Route(f"{prefix}/generate_stream", self.generate_stream, methods=["POST"]))
        return out


__all__ = ["GENERATE_KEYS", "GenerateRoutes", "completion_body", "generate_events", "result_message"]
