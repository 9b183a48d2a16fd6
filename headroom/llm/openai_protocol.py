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
from headroom.protocol.openai_errors import exception_body, openai_error_body


class BaseRequest(BaseModel):
    """Types only: `headroom.llm.validation.check_body` refuses unknown fields and range-checks every value
    before this model sees the body (so the ranges live in one place)."""

    model_config = ConfigDict(extra="forbid")

    model: str = ""
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    # vendor extensions (vLLM's meanings): validation.VENDOR_EXTENSIONS
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    priority: int = 0
    response_format: Any = None  # checked by headroom.llm.structured_output
    # vLLM's prefix-cache salt: cached prompt blocks are shared only among requests with the same salt
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # assistant: calls it made (headroom.llm.chat_messages)
    tool_call_id: str | None = None  # tool: the call this message answers


class ChatRequest(BaseRequest):
    """OpenAI's chat completion request: every field is honoured or refused (validation.REFUSED)."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: Any = None  # checked by headroom.llm.structured_output
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(BaseRequest):
    """OpenAI's (legacy) completion request."""

    prompt: str | list[int] | list[str]
    logprobs: int | None = None
    echo: bool = False


@dataclass(frozen=True, slots=True)
class ServingResponse:
    """What a transport sends back."""

    status: int  # HTTP status
    body: Mapping[str, Any] | None = None  # JSON body (None when streaming)
    stream: AsyncIterator[str] | None = None  # SSE chunks, each `data: ...\n\n`
    headers: Mapping[str, str] = field(default_factory=dict)  # extra headers (Retry-After)


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    retry_after_s: float | None = None,
    code: str | None = None,
) -> ServingResponse:
    """An OpenAI-shaped error."""
    body = openai_error_body(status, message, param, code)
    headers = {"Retry-After": str(max(1, round(retry_after_s)))} if retry_after_s is not None else {}
    return ServingResponse(status=status, body=body, headers=headers)


def from_exception(exc: Exception) -> ServingResponse:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        code = "unknown_parameter" if err["type"] == "extra_forbidden" else "invalid_value"
        return error_response(400, f"{param}: {err['msg']}" if param else err["msg"], param, code=code)
    if isinstance(exc, HeadroomError):
        headers = {"Retry-After": str(max(1, round(exc.retry_after_s)))} if exc.retry_after_s is not None else {}
        if isinstance(exc, Draining):
            headers[DRAINING_HEADER] = "1"
        return ServingResponse(status=exc.http_status, body=exception_body(exc), headers=headers)
    return error_response(500, f"internal error: {exc}")


def sse(obj: Mapping[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
