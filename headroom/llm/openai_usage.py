"""One OpenAI request's accounting: the latest output of each choice, its `usage` body, and its one `LLMUsage`
report to the gateway (token refunds, stage spans, the access log) and to the serving's `RequestObserver`
(the Triton statistics)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from headroom.gateway.usage import LLMUsage
from headroom.llm.request import FinishReason, SequenceOutput, merge_timelines

UsageCallback = Callable[[LLMUsage], None]


class RequestObserver(Protocol):
    """Sees how every request ends (the server's Triton statistics for the LLM)."""

    def on_usage(self, usage: LLMUsage) -> None:
        """An admitted generation ended (its report; `finish_reason` "error" / "abort" when it did not finish)."""

    def on_refused(self, duration_s: float) -> None:
        """A request was refused before generating (bad input, queue full, not ready)."""


def observed(observer: RequestObserver | None, on_usage: UsageCallback | None) -> UsageCallback | None:
    """`on_usage`, and `observer`'s too."""
    if observer is None:
        return on_usage

    def both(usage: LLMUsage) -> None:
        observer.on_usage(usage)
        if on_usage is not None:
            on_usage(usage)

    return both


class Tally:
    """The latest output of each choice of one request, and its one `LLMUsage` report."""

    def __init__(self, started_s: float, num_prompt: int, on_usage: UsageCallback | None) -> None:
        self.started_s = started_s  # time.monotonic() when the route began
        self.submitted_s = started_s  # time.monotonic() when the request went to the engine
        self.num_prompt = num_prompt  # prompt tokens
        self.n = 1  # choices expected
        self.on_usage = on_usage  # where the report goes
        self.last: dict[int, SequenceOutput] = {}  # choice index -> its latest output
        self.usage: LLMUsage | None = None  # the report, once made

    def report(self, failed: bool = False) -> LLMUsage:
        """Build the report (once) and hand it to `on_usage`."""
        if self.usage is not None:
            return self.usage
        outs = list(self.last.values())
        timelines = [o.timeline for o in outs if o.timeline is not None]
        queue_ms = prefill_ms = decode_ms = 0.0
        if timelines:
            queue_ms, prefill_ms, decode_ms = merge_timelines(timelines).stage_ms()
        preprocess_ms = (self.submitted_s - self.started_s) * 1e3
        total_ms = max((time.monotonic() - self.started_s) * 1e3, preprocess_ms + queue_ms + prefill_ms + decode_ms)
        self.usage = LLMUsage(
            prompt_tokens=self.num_prompt,
            completion_tokens=sum(len(o.token_ids) for o in outs),
            cached_tokens=max((o.num_cached_tokens for o in outs), default=0),
            preprocess_ms=preprocess_ms,
            queue_ms=queue_ms,
            prefill_ms=prefill_ms,
            decode_ms=decode_ms,
            total_ms=total_ms,
            finish_reason="error" if failed else _finish_reason(outs, self.n),
        )
        if self.on_usage is not None:
            self.on_usage(self.usage)
        return self.usage


def _finish_reason(outs: Iterable[SequenceOutput], n: int) -> str:
    reasons = [o.finish_reason for o in outs]
    if len(reasons) < n or None in reasons or FinishReason.ABORT in reasons:
        return FinishReason.ABORT.value
    return "length" if FinishReason.LENGTH in reasons else "stop"


def usage_body(num_prompt: int, outs: list[SequenceOutput]) -> dict[str, Any]:
    completion = sum(len(o.token_ids) for o in outs)
    cached = max((o.num_cached_tokens for o in outs), default=0)
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": completion,
        "total_tokens": num_prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
