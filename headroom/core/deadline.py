"""The client's timeout on every route: the `X-Request-Timeout-Ms` header (the V2 `timeout` parameter, in
microseconds, is read by the V2 codecs). Every transport, the OpenAI and LLM routes included, parses it here.

The budget a request is admitted against is the shorter of this and the model's own objective (see
`headroom.batching.admission`); a timeout can shorten a model's default deadline, never lengthen it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from headroom.core.errors import InvalidRequest

TIMEOUT_HEADER = "X-Request-Timeout-Ms"
_TIMEOUT_HEADER_LOWER = TIMEOUT_HEADER.lower()


def parse_timeout_ms(raw: str | None) -> float | None:
    """The header's value in milliseconds (None when absent); InvalidRequest unless a finite number > 0."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InvalidRequest(f"{TIMEOUT_HEADER} must be a number of milliseconds > 0, got {raw!r:.60}")
    return value


def client_timeout_ms(headers: Mapping[str, str]) -> float | None:
    """`X-Request-Timeout-Ms` from a request's headers: a case-insensitive mapping (Starlette's), or one keyed
    by the canonical or the lower-case name (gRPC metadata). No scan of every header: this runs per request."""
    raw = headers.get(TIMEOUT_HEADER)
    if raw is None:
        raw = headers.get(_TIMEOUT_HEADER_LOWER)
    return parse_timeout_ms(raw)


def shorter(a_ms: float | None, b_ms: float | None) -> float | None:
    """The shorter of two optional timeouts."""
    if a_ms is None or b_ms is None:
        return a_ms if b_ms is None else b_ms
    return min(a_ms, b_ms)
