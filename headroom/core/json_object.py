"""Parse bytes or text that must hold one JSON object, with an error that names what was being read.

Used by the edges that take a JSON object from outside (Triton's load parameters and request bodies, the gRPC
generate route's sampling input, the load generator's dataset lines), so that each says the same thing the same way.
"""

from __future__ import annotations

import orjson


def json_object(raw: bytes | str, what: str, error: type[Exception] = ValueError,
                object_hint: str = "") -> dict[str, object]:
    """`raw` parsed as one JSON object; otherwise `error("<what> is not valid JSON: ...")` or
    `error("<what> must be a JSON object<object_hint>")`."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise error(f"{what} is not valid JSON: {exc.msg}") from None
    if not isinstance(doc, dict):
        raise error(f"{what} must be a JSON object{object_hint}")
    return doc


__all__ = ["json_object"]
