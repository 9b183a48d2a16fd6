"""Graceful degradation: when the fleet is busy, serve a cheaper fallback model instead of shedding.

The textbook orders overload defences from least to most intrusive: shorter batching windows, stop hedging,
*serve a smaller fallback model*, and only then shed. The proxy degrades requests for a model that has a
fallback once aggregate utilisation reaches `DegradeConfig.start_utilisation` (below shedding's 80%).
`rewrite` is pure: it renames the model in a V2 path (`/v2/models/<name>/...`) or in an OpenAI JSON body.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

_V2_PREFIX = "/v2/models/"
_OPENAI_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings")


@dataclass(frozen=True, slots=True)
class DegradeConfig:
    """Which models have a fallback, and when to use it."""

    fallbacks: Mapping[str, str] = field(default_factory=dict)  # primary model name -> fallback model name
    start_utilisation: float = 0.7  # degrade at or above this aggregate load/capacity (shedding starts at 0.8)

    def __post_init__(self) -> None:
        if not 0.0 <= self.start_utilisation <= 1.0:
            raise ValueError(f"start_utilisation must be in [0, 1], got {self.start_utilisation}")
        for primary, fallback in self.fallbacks.items():
            if not primary or not fallback or primary == fallback:
                raise ValueError(f"fallback {primary!r} -> {fallback!r}: both names needed, and different")


def rewrite(path: str, body: bytes, fallbacks: Mapping[str, str]) -> tuple[str, bytes, str] | None:
    """(new path, new body, fallback name) when the request targets a model with a fallback, else None."""
    if path.startswith(_V2_PREFIX):
        name, sep, rest = path[len(_V2_PREFIX):].partition("/")
        fallback = fallbacks.get(name)
        if fallback is None:
            return None
        rest = rest.split("/", 2)[-1] if rest.startswith("versions/") else rest  # the fallback's own version
        return f"{_V2_PREFIX}{fallback}{sep}{rest}", body, fallback
    if path in _OPENAI_PATHS and body[:1] == b"{":
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        fallback = fallbacks.get(str(doc.get("model", ""))) if isinstance(doc, dict) else None
        if fallback is None:
            return None
        doc["model"] = fallback
        return path, orjson.dumps(doc), fallback
    return None
