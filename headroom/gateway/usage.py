"""What an LLM request used, handed from the OpenAI routes back to the gateway through the ASGI scope.

The gateway charges a tenant's LLM-token bucket up front (prompt estimate + `max_tokens` × `n`), so admission
is immediate. When the request ends, the route stores one `LLMUsage` in `scope["state"]` (`report_usage`);
the gateway reads it (`reported_usage`) after the app returns, refunds what was reserved but not generated,
records the `llm.queue` / `llm.prefill` / `llm.decode` spans and adds the numbers to its access line.
No usage and an error status (the request failed before generating, or the client left before an answer)
means nothing was generated: the reservation is refunded whole; no usage with a 2xx answer keeps the whole
charge (an app that does not report). This module is plain data, so the gateway does not import the LLM
engine (or torch).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

STATE_KEY = "headroom_llm_usage"  # the key in scope["state"] (Starlette's `request.state`)


@dataclass(frozen=True, slots=True)
class LLMUsage:
    """One OpenAI generation request, as it ended (finished, aborted, timed out or failed mid-way)."""

    prompt_tokens: int  # prompt tokens after the chat template
    completion_tokens: int  # output tokens generated over all `n` choices (delivered to the route)
    cached_tokens: int  # prompt tokens served from the prefix cache
    preprocess_ms: float  # from the route's start to the engine's admission (parse, template, tokenize)
    queue_ms: float  # admitted -> first scheduled (n > 1: the earliest choice to start)
    prefill_ms: float  # first scheduled -> first output token
    decode_ms: float  # first output token -> the last choice finished
    total_ms: float  # the route's whole time, >= preprocess + queue + prefill + decode
    finish_reason: str  # "stop", "length", "abort", or "error" when the generation failed

    def __post_init__(self) -> None:
        if min(self.prompt_tokens, self.completion_tokens, self.cached_tokens) < 0:
            raise ValueError("token counts must be >= 0")

    def server_timing(self) -> str:
        """The `Server-Timing` value: preprocess, queue, prefill, decode, other (the rest of total: the route's
        work after the last token) and total, in ms; the stages are disjoint and sum to total."""
        stages_ms = self.preprocess_ms + self.queue_ms + self.prefill_ms + self.decode_ms
        parts = (
            ("preprocess", self.preprocess_ms),
            ("queue", self.queue_ms),
            ("prefill", self.prefill_ms),
            ("decode", self.decode_ms),
            ("other", max(0.0, self.total_ms - stages_ms)),
            ("total", self.total_ms),
        )
        return ", ".join(f"{name};dur={value:.3f}" for name, value in parts)

    def log_fields(self) -> dict[str, Any]:
        """Fields for a JSON access line."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "queue_ms": round(self.queue_ms, 3),
            "prefill_ms": round(self.prefill_ms, 3),
            "decode_ms": round(self.decode_ms, 3),
            "finish_reason": self.finish_reason,
            "server_timing": self.server_timing(),
        }


def report_usage(state: MutableMapping[str, Any], usage: LLMUsage) -> None:
    """Store `usage` for the gateway (`state` is `scope["state"]`); a later report replaces an earlier one."""
    state[STATE_KEY] = usage


def reported_usage(state: MutableMapping[str, Any]) -> LLMUsage | None:
    value = state.get(STATE_KEY)
    return value if isinstance(value, LLMUsage) else None


def unused_tokens(reserved_tokens: int, usage: LLMUsage | None, status_code: int) -> int:
    """The completion tokens to give back of `reserved_tokens` charged up front (negative: an overrun to charge).

    With a report: reserved - generated. Without one: all of it when the answer is an error or never came
    (`status_code` 0), nothing when it is a 2xx (an app that does not report keeps the whole charge).
    """
    if usage is not None:
        return reserved_tokens - usage.completion_tokens
    return 0 if 200 <= status_code < 300 else reserved_tokens
