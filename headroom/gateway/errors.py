"""Gateway errors that the server's error tree does not have yet (401, 403, 408, 431).

They subclass `HeadroomError`, so `to_json()` gives the same `{"error": message, "reason": ...}` body and
transports map them like every other error.
"""

from __future__ import annotations

from headroom.core.errors import HeadroomError


class Unauthenticated(HeadroomError):
    http_status = 401
    grpc_code = "UNAUTHENTICATED"
    reason = "unauthenticated"


class Forbidden(HeadroomError):
    http_status = 403
    grpc_code = "PERMISSION_DENIED"
    reason = "forbidden"


class RequestTimeout(HeadroomError):
    http_status = 408
    grpc_code = "DEADLINE_EXCEEDED"
    reason = "request_timeout"


class HeadersTooLarge(HeadroomError):
    http_status = 431
    grpc_code = "RESOURCE_EXHAUSTED"
    reason = "headers_too_large"
