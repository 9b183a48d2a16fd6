"""The exception tree. Every error a client can cause or observe maps to one HTTP status and one gRPC code.

    HeadroomError                      500 INTERNAL          unexpected failure inside the server
    ├── InvalidRequest                 400 INVALID_ARGUMENT  malformed body, wrong shape/datatype, bad params
    │   └── ContextLengthExceeded      400 INVALID_ARGUMENT  prompt + max_tokens over the model's context
    ├── ModelNotFound                  404 NOT_FOUND         unknown model or version
    ├── PayloadTooLarge                413 RESOURCE_EXHAUSTED body or tensor above a configured limit
    ├── Unprocessable                  422 INVALID_ARGUMENT  well-formed but semantically unusable input
    ├── Unsupported                    400 UNIMPLEMENTED     a protocol feature headroom does not offer
    ├── RateLimited                    429 RESOURCE_EXHAUSTED per-tenant / per-queue limit; has retry_after_s
    ├── Overloaded                     503 UNAVAILABLE       queue full / shedding; has retry_after_s
    ├── NotReady                       503 UNAVAILABLE       model loading or unloaded
    │   └── Draining                   503 UNAVAILABLE       shutting down: also `x-headroom-draining: 1`
    ├── DeadlineExceeded               504 DEADLINE_EXCEEDED request timed out before or while executing
    └── Cancelled                      499 CANCELLED         the client went away (never sent to a client)

Transports translate these with `http_status` / `grpc_code`; nothing else decides a status. An error with a
`hold_s` (a refusal paced during a retry storm, `headroom.batching.refusal_pacing`) is answered that much later.
"""

from __future__ import annotations


class HeadroomError(Exception):
    """Base class; `http_status` and `grpc_code` say how transports report it."""

    http_status: int = 500
    grpc_code: str = "INTERNAL"
    reason: str = "internal"

    def __init__(self, message: str, *, retry_after_s: float | None = None, hold_s: float = 0.0) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s
        self.hold_s = hold_s  # seconds a transport waits before it answers (refusal pacing: a retry storm)

    def to_json(self) -> dict[str, object]:
        """The body every transport returns: `{"error": message, "reason": reason}`."""
        return {"error": self.message, "reason": self.reason}


class InvalidRequest(HeadroomError):
    http_status = 400
    grpc_code = "INVALID_ARGUMENT"
    reason = "invalid_request"


class ContextLengthExceeded(InvalidRequest):
    reason = "context_length_exceeded"  # OpenAI's error code for the same condition


class ModelNotFound(HeadroomError):
    http_status = 404
    grpc_code = "NOT_FOUND"
    reason = "model_not_found"


class PayloadTooLarge(HeadroomError):
    http_status = 413
    grpc_code = "RESOURCE_EXHAUSTED"
    reason = "payload_too_large"


class Unprocessable(HeadroomError):
    http_status = 422
    grpc_code = "INVALID_ARGUMENT"
    reason = "unprocessable"


class Unsupported(HeadroomError):
    http_status = 400  # the client asked for something this server never does: its request, not a 5xx
    grpc_code = "UNIMPLEMENTED"
    reason = "unsupported"


class RateLimited(HeadroomError):
    http_status = 429
    grpc_code = "RESOURCE_EXHAUSTED"
    reason = "rate_limited"


class Overloaded(HeadroomError):
    http_status = 503
    grpc_code = "UNAVAILABLE"
    reason = "overloaded"


class NotReady(HeadroomError):
    http_status = 503
    grpc_code = "UNAVAILABLE"
    reason = "not_ready"


class DeadlineExceeded(HeadroomError):
    http_status = 504
    grpc_code = "DEADLINE_EXCEEDED"
    reason = "deadline_exceeded"


class Cancelled(HeadroomError):
    http_status = 499
    grpc_code = "CANCELLED"
    reason = "cancelled"


class Draining(NotReady):
    """The server stopped admitting (SIGTERM): transports add the header `x-headroom-draining: 1` (the router
    retries such a request on another replica)."""

    reason = "draining"


DRAINING_HEADER = "x-headroom-draining"  # on every drain refusal, value "1"
