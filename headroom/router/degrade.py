"""Graceful degradation: serve a cheaper fallback model instead of failing or shedding.

The textbook orders overload defences from least to most intrusive: shorter batching windows, stop hedging,
*serve a smaller fallback model*, and only then shed. The proxy degrades requests for a model that has a
fallback in three cases:

* load: aggregate utilisation reaches `DegradeConfig.start_utilisation` (below shedding's 80%);
* errors (`on_error`): the primary's attempts failed (5xx, timeout, connection lost, no replica would take it):
  the request is sent once more, to the fallback, instead of returning the failure;
* ejection: after `eject_after_failures` failures of the primary in a row, the primary is ejected for
  `ejection_s` (a per-model circuit breaker, `BreakerState`): its requests go straight to the fallback until
  then, after which one request probes the primary again.

`rewrite`, `model_of` and the breaker functions are pure: the proxy owns the state and the clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

from headroom.router.wire import Outgoing

_V2_PREFIX = "/v2/models/"
_OPENAI_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings")


@dataclass(frozen=True, slots=True)
class DegradeConfig:
    """Which models have a fallback, and when to use it."""

    fallbacks: Mapping[str, str] = field(default_factory=dict)  # primary model name -> fallback model name
    start_utilisation: float = 0.7  # degrade at or above this aggregate load/capacity (shedding starts at 0.8)
    on_error: bool = True  # a request whose primary attempts failed is sent once more, to the fallback
    eject_after_failures: int = 5  # primary failures in a row that eject it (0 = never; Envoy's consecutive_5xx)
    ejection_s: float = 30.0  # how long an ejected primary's requests go straight to the fallback

    def __post_init__(self) -> None:
        if not 0.0 <= self.start_utilisation <= 1.0:
            raise ValueError(f"start_utilisation must be in [0, 1], got {self.start_utilisation}")
        if self.eject_after_failures < 0 or self.ejection_s <= 0:
            raise ValueError("eject_after_failures must be >= 0 and ejection_s > 0")
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


#: attempt outcomes that count as the primary failing (not load: "overloaded" is shedding's business)
FAILED_OUTCOMES = frozenset({"timeout", "connection_lost", "connect_error", "not_ready", "draining"})


def primary_failed(outcome: str) -> bool:
    """Whether an attempt's final outcome means the primary model could not answer."""
    return outcome in FAILED_OUTCOMES or outcome.startswith("http_5")


def model_of(path: str, body: bytes) -> str:
    """The model a V2 path or an OpenAI JSON body names ("" when neither does)."""
    if path.startswith(_V2_PREFIX):
        return path[len(_V2_PREFIX):].partition("/")[0]
    if path in _OPENAI_PATHS and body[:1] == b"{":
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return ""
        return str(doc.get("model", "")) if isinstance(doc, dict) else ""
    return ""


@dataclass(frozen=True, slots=True)
class BreakerState:
    """Per primary model: failures in a row, and until when it is ejected."""

    failures: Mapping[str, int] = field(default_factory=dict)
    ejected_until_s: Mapping[str, float] = field(default_factory=dict)

    def ejected(self, model: str, now_s: float) -> bool:
        return self.ejected_until_s.get(model, 0.0) > now_s


def breaker_record(state: BreakerState, model: str, failed: bool, now_s: float,
                   cfg: DegradeConfig) -> tuple[BreakerState, bool]:
    """Fold one primary result in; returns the new state and whether this result ejected the model."""
    failures = dict(state.failures)
    until = dict(state.ejected_until_s)
    if not failed:
        failures.pop(model, None)
        return BreakerState(failures, until), False
    failures[model] = failures.get(model, 0) + 1
    if cfg.eject_after_failures and failures[model] >= cfg.eject_after_failures:
        until[model] = now_s + cfg.ejection_s
        failures.pop(model)
        return BreakerState(failures, until), True
    return BreakerState(failures, until), False


def fallback_outgoing(out: Outgoing, fallbacks: Mapping[str, str]) -> Outgoing | None:
    """`out` re-aimed at its model's fallback, or None (no fallback, or already degraded)."""
    if out.degraded_to:
        return None
    path, sep, query = out.path_and_query.partition("?")
    rewritten = rewrite(path, out.body, fallbacks)
    if rewritten is None:
        return None
    new_path, body, fallback = rewritten
    return dataclasses.replace(out, path_and_query=new_path + sep + query, body=body, degraded_to=fallback)
