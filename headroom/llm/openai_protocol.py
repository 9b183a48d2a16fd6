"""The OpenAI wire protocol: request models (pydantic, at the edge), the transport-free response, errors.

Errors use OpenAI's shape `{"error": {"message", "type", "param", "code"}}`; the status comes from the
headroom exception (`headroom.core.errors`): 400 bad input, 404 unknown model, 429 queue full (with
Retry-After), 503 not ready, 504 past the request deadline.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from headroom.core.errors import DRAINING_HEADER, Draining, HeadroomError


class BaseRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = ""
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    user: str | None = None
    # vLLM-style extensions
    top_k: int = Field(default=0, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    priority: int = 0
    # vLLM's prefix-cache salt: cached prompt blocks are shared only among requests with the same salt
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(BaseRequest):
    """The subset of OpenAI's chat completion request we honour (unknown fields are ignored)."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


class CompletionRequest(BaseRequest):
    """The subset of OpenAI's completion request we honour."""

    prompt: str | list[int] | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False


@dataclass(frozen=True, slots=True)
class ServingResponse:
    """What a transport sends back."""

    status: int  # HTTP status
    body: Mapping[str, Any] | None = None  # JSON body (None when streaming)
    stream: AsyncIterator[str] | None = None  # SSE chunks, each `data: ...\n\n`
    headers: Mapping[str, str] = field(default_factory=dict)  # extra headers (Retry-After)


_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    404: ("invalid_request_error", "model_not_found"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    503: ("server_error", "engine_unavailable"),
    504: ("timeout_error", "request_timeout"),
}


def error_response(
    status: int, message: str, param: str | None = None, retry_after_s: float | None = None
) -> ServingResponse:
    """An OpenAI-shaped error."""
    kind, code = _ERROR_TYPES.get(status, ("server_error", None))
    headers = {"Retry-After": str(max(1, round(retry_after_s)))} if retry_after_s is not None else {}
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return ServingResponse(status=status, body=body, headers=headers)


def from_exception(exc: Exception) -> ServingResponse:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        return error_response(400, f"{param}: {err['msg']}" if param else err["msg"], param)
    if isinstance(exc, HeadroomError):
        resp = error_response(exc.http_status, exc.message, retry_after_s=exc.retry_after_s)
        if isinstance(exc, Draining):
            return ServingResponse(resp.status, resp.body, headers={**resp.headers, DRAINING_HEADER: "1"})
        return resp
    return error_response(500, f"internal error: {exc}")


def sse(obj: Mapping[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
