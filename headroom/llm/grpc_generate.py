"""The LLM over gRPC `ModelInfer` and `ModelStreamInfer`, in Triton's LLM tensor convention.

Request (as Triton's vLLM and TensorRT-LLM models take it):

- BYTES input `text_input`, one element: the prompt (UTF-8).
- Sampling settings, each key at most once, from any of: request `parameters` (`max_tokens`, `temperature`,
  ...: the keys of `/v2/models/{m}/generate`), a BYTES input `sampling_parameters` holding a JSON object
  (Triton's vLLM backend), or a one-element input named after the key (`max_tokens` INT32: TensorRT-LLM).
- `stream` (BOOL input or parameter): on ModelStreamInfer, one response per token chunk (the default) or
  one response in all (false). ModelInfer always answers once; `stream: true` there is refused.

Response: BYTES output `text_output` [1] and a `finish_reason` parameter. ModelStreamInfer answers as
Triton's decoupled models: every response carries the bool parameter `triton_final_response`, true on the
last (the chunk with the finish reason); with `triton_enable_empty_final_response` (tritonclient's
`enable_empty_final_response=True`) the chunks all say false and an extra empty response says true.

Everything else is `/v2/models/{m}/generate`'s (headroom.llm.generate.completion_body →
`OpenAIServing.create_completion`): validation, sampling, admission, usage and statistics; a refused request
keeps its status as a gRPC code (400 → INVALID_ARGUMENT, 404 → NOT_FOUND, 429 → RESOURCE_EXHAUSTED,
503 → UNAVAILABLE, 504 → DEADLINE_EXCEEDED). Client cancellation closes the completion stream, which aborts
the request in the engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from headroom.core.errors import (
    DeadlineExceeded,
    HeadroomError,
    InvalidRequest,
    ModelNotFound,
    NotReady,
    RateLimited,
)
from headroom.core.json_object import json_object
from headroom.core.types import InferenceResponse, Tensor
from headroom.gateway.context import current_context
from headroom.gateway.limits import InputLimits, estimate_openai_body
from headroom.gateway.llm_budget import current_llm_budget
from headroom.gateway.usage import LLMUsage
from headroom.llm.generate import GenerateRoutes, completion_body, generate_events, result_message
from headroom.llm.openai_protocol import ServingResponse
from headroom.llm.serving import OpenAIServing
from headroom.protocol.generated import headroom_inference_pb2 as pb
from headroom.protocol.grpc_codec import decode_model_infer, encode_model_infer

TEXT_INPUT, TEXT_OUTPUT, SAMPLING_INPUT = "text_input", "text_output", "sampling_parameters"
FINAL, EMPTY_FINAL = "triton_final_response", "triton_enable_empty_final_response"
#: request parameters with a Triton meaning that an LLM request cannot honour (refused, naming them).
_REFUSED_PARAMETERS = {
    "timeout": "the LLM's deadline is its config's request_timeout_s (use the client's deadline to give up)",
    "sequence_id": "LLM requests are not sequences", "sequence_start": "LLM requests are not sequences",
    "sequence_end": "LLM requests are not sequences",
}


@dataclass(frozen=True, slots=True)
class LLMInferRequest:
    """A decoded ModelInferRequest for an LLM."""

    request_id: str
    serving: OpenAIServing
    text: str
    settings: Mapping[str, object]  # generate parameters (completion fields)
    stream: bool | None  # None: not given
    empty_final: bool  # triton_enable_empty_final_response


def _scalar(tensor: Tensor) -> object:
    data = np.asarray(tensor.data)
    if data.size != 1:
        raise InvalidRequest(f"input {tensor.name!r} must hold one element, got shape {list(tensor.shape)}")
    value = data.reshape(-1)[0]
    return value.item() if isinstance(value, np.generic) else value


def _utf8(value: object, where: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequest(f"{where} is not valid UTF-8: {exc}") from None
    raise InvalidRequest(f"{where} must be BYTES")


def _add(settings: dict[str, object], key: str, value: object, source: str) -> None:
    if key in settings:
        raise InvalidRequest(f"'{key}' is given twice (again in {source}); send it once")
    settings[key] = value


def decode_llm_request(message: pb.ModelInferRequest, serving: OpenAIServing, request_id: str) -> LLMInferRequest:
    """The prompt and settings of a ModelInferRequest (InvalidRequest naming what is wrong)."""
    decoded = decode_model_infer(message, request_id)
    settings: dict[str, object] = {}
    text: str | None = None
    stream: bool | None = None
    for tensor in decoded.inputs:
        if tensor.name == TEXT_INPUT:
            if tensor.datatype != "BYTES":
                raise InvalidRequest(f"input '{TEXT_INPUT}' must be BYTES (the prompt), got {tensor.datatype}")
            text = _utf8(_scalar(tensor), f"input '{TEXT_INPUT}'")
        elif tensor.name == SAMPLING_INPUT:
            doc = json_object(_utf8(_scalar(tensor), f"input '{SAMPLING_INPUT}'"), f"input '{SAMPLING_INPUT}'",
                              InvalidRequest, " of sampling settings")
            for key, value in doc.items():
                _add(settings, str(key), value, f"input '{SAMPLING_INPUT}'")
        else:
            _add(settings, tensor.name, _scalar(tensor), f"input '{tensor.name}'")
    if text is None:
        raise InvalidRequest(f"input '{TEXT_INPUT}' (BYTES, one element: the prompt) is required")
    empty_final = False
    for key, value in decoded.parameters.items():
        if key in _REFUSED_PARAMETERS:
            raise InvalidRequest(f"parameter '{key}' is not supported for an LLM: {_REFUSED_PARAMETERS[key]}")
        if key == EMPTY_FINAL:
            empty_final = bool(value)
        elif key != "priority" or value:  # tritonclient sends priority 0 for "unset"
            _add(settings, key, value, "the request parameters")
    if "stream" in settings:
        value = settings.pop("stream")
        if not isinstance(value, bool):
            raise InvalidRequest(f"'stream' must be a bool, got {value!r}")
        stream = value
    if settings.get("n", 1) != 1:
        raise InvalidRequest("'n' must be 1 over gRPC: one text_output per request")
    for out in decoded.outputs:
        if out.name != TEXT_OUTPUT:
            raise InvalidRequest(f"model '{serving.model_name}' has no output '{out.name}' (it has '{TEXT_OUTPUT}')")
    return LLMInferRequest(decoded.request_id, serving, text, settings, stream, empty_final)


def _refused(result: ServingResponse) -> HeadroomError:
    """The completion route's refusal as the error that carries its status."""
    message = result_message(result.body)
    kinds: dict[int, type[HeadroomError]] = {400: InvalidRequest, 404: ModelNotFound, 413: InvalidRequest,
                                             422: InvalidRequest, 429: RateLimited, 503: NotReady,
                                             504: DeadlineExceeded}
    return kinds.get(result.status, HeadroomError)(message)


def _response(req: LLMInferRequest, text: str, finish: str | None, final: bool | None) -> pb.ModelInferResponse:
    data = np.empty(1, dtype=object)
    data[0] = text.encode("utf-8")
    params: dict[str, object] = {"finish_reason": finish} if finish else {}
    if final is not None:
        params[FINAL] = final
    response = InferenceResponse(request_id=req.request_id, model_name=req.serving.model_name, model_version="",
                                 outputs=(Tensor(TEXT_OUTPUT, "BYTES", (1,), data),), parameters=params)
    return encode_model_infer(response)


def _empty_final(req: LLMInferRequest) -> pb.ModelInferResponse:
    message = pb.ModelInferResponse(model_name=req.serving.model_name, model_version="", id=req.request_id)
    message.parameters[FINAL].bool_param = True
    return message


class GrpcGenerate:
    """ModelInfer / ModelStreamInfer for the LLMs of a `GenerateRoutes` (the same lookup and errors)."""

    def __init__(self, routes: GenerateRoutes) -> None:
        self._routes = routes

    def serves(self, name: str) -> bool:
        return self._routes.serves(name)

    def _decode(self, message: pb.ModelInferRequest, request_id: str) -> LLMInferRequest:
        serving = self._routes.serving(message.model_name, message.model_version)
        return decode_llm_request(message, serving, request_id)

    async def _complete(self, req: LLMInferRequest, stream: bool) -> ServingResponse:
        body = completion_body(req.serving.model_name, {"text_input": req.text, "parameters": dict(req.settings)},
                               stream)
        ctx = current_context()  # the gateway interceptor's: the caller's tenant scopes the prefix cache
        tenant = ctx.tenant if ctx is not None else ""
        budget = current_llm_budget()  # the tenant's LLM-token bucket, when it has a limit
        if budget is None:
            result = await req.serving.create_completion(body, None, tenant)
        else:
            estimate = estimate_openai_body("/v1/completions", orjson.dumps(body), InputLimits())
            reserved = budget.reserve(estimate.prompt_tokens, estimate.completion_tokens)
            settled: list[bool] = []

            def settle(usage: LLMUsage | None, status_code: int) -> None:
                if not settled:
                    settled.append(True)
                    budget.settle(reserved, usage, status_code)

            try:
                result = await req.serving.create_completion(body, lambda usage: settle(usage, 200), tenant)
            except BaseException:
                settle(None, 0)
                raise
            if result.status != 200:
                settle(None, result.status)
        if result.status != 200:
            raise _refused(result)
        return result

    async def infer(self, message: pb.ModelInferRequest, request_id: str) -> pb.ModelInferResponse:
        """ModelInfer: the whole text in one response."""
        req = self._decode(message, request_id)
        if req.stream:
            raise InvalidRequest("'stream: true' needs ModelStreamInfer (tritonclient: start_stream, "
                                 "async_stream_infer); ModelInfer answers once")
        result = await self._complete(req, stream=False)
        choice = ((result.body or {}).get("choices") or [{}])[0]
        return _response(req, str(choice.get("text", "")), choice.get("finish_reason"), None)

    async def stream(self, message: pb.ModelInferRequest, request_id: str) -> AsyncIterator[pb.ModelInferResponse]:
        """ModelStreamInfer: one response per token chunk (or one, with `stream: false`), decoupled-style."""
        req = self._decode(message, request_id)
        result = await self._complete(req, stream=req.stream is not False)
        if result.stream is None:
            choice = ((result.body or {}).get("choices") or [{}])[0]
            yield _response(req, str(choice.get("text", "")), choice.get("finish_reason"), not req.empty_final)
            if req.empty_final:
                yield _empty_final(req)
            return
        events = generate_events(req.serving.model_name, result.stream)
        final_sent = False
        try:
            async for event in events:
                if "sse_comment" in event:  # the stream's Server-Timing: HTTP only
                    continue
                if "error" in event:
                    raise HeadroomError(str(event["error"]))
                finish: Any = event.get("finish_reason")
                final = bool(finish) and not req.empty_final
                yield _response(req, str(event.get("text_output", "")), finish, final)
                final_sent = final_sent or final
        finally:
            await events.aclose()
        if not final_sent:
            yield _empty_final(req)


__all__ = ["GrpcGenerate", "LLMInferRequest", "decode_llm_request"]
