"""OpenAI's error schema, one definition for every /v1 route (chat, completions, embeddings, models).

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": "..."}}

`type` follows the status as OpenAI's API does; `code` is OpenAI's machine-readable code where one exists
(`context_length_exceeded`, `model_not_found`, `unknown_parameter`, ...), else null.
"""

from __future__ import annotations

from headroom.core.errors import HeadroomError

_TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
    504: "timeout_error",
}

_CODES = {  # headroom's error reason -> OpenAI's code
    "context_length_exceeded": "context_length_exceeded",
    "model_not_found": "model_not_found",
    "payload_too_large": "request_too_large",
    "rate_limited": "rate_limit_exceeded",
    "overloaded": "server_overloaded",
    "not_ready": "engine_unavailable",
    "deadline_exceeded": "request_timeout",
}


def error_code(exc: HeadroomError) -> str | None:
    """OpenAI's `code` for a headroom error (None where OpenAI has none)."""
    return _CODES.get(exc.reason)


def openai_error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, object]:
    """The JSON body of an OpenAI error with this HTTP status."""
    kind = _TYPES.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
