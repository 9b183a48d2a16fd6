"""OpenAI's error schema, one definition for every /v1 route (chat, completions, embeddings, models).

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": "..."}}

`type` follows the status as OpenAI's API does; `code` is OpenAI's machine-readable code where one exists
(`context_length_exceeded`, `model_not_found`, `unknown_parameter`, ...), else null.
"""

from __future__ import annotations

from headroom.core.errors import HeadroomError, InvalidRequest

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
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
    "draining": "engine_unavailable",
    "deadline_exceeded": "request_timeout",
    "unauthenticated": "invalid_api_key",
    "request_timeout": "request_timeout",
}


class FieldError(InvalidRequest):
    """A request field has the wrong type or range: 400 naming the field (OpenAI's `param`) and `code`."""

    def __init__(self, param: str | None, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def error_code(exc: HeadroomError) -> str | None:
    """OpenAI's `code` for a headroom error (None where OpenAI has none)."""
    return _CODES.get(exc.reason)


def exception_body(exc: HeadroomError) -> dict[str, object]:
    """The OpenAI error body for a headroom error (FieldError keeps its param and code)."""
    if isinstance(exc, FieldError):
        return openai_error_body(exc.http_status, exc.message, exc.param, exc.code)
    return openai_error_body(exc.http_status, exc.message, None, error_code(exc))


def openai_error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, object]:
    """The JSON body of an OpenAI error with this HTTP status."""
    kind = _TYPES.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
