"""What the engine reports: `StepStats` after every step, and the `EngineObserver` that receives them with
per-token, finish and gauge events (the Prometheus metrics implement it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from headroom.llm.request import Request


@dataclass(frozen=True, slots=True)
class StepStats:
    """What one step did (for metrics and logs)."""

    num_running: int  # sequences running after the step
    num_waiting: int  # sequences waiting after the step
    kv_cache_usage: float  # fraction of blocks referenced
    num_batched_tokens: int  # tokens run in the step
    num_preempted: int  # preemptions during the step's scheduling
    prompt_tokens: int  # prompt tokens of sequences that got their first token this step
    generation_tokens: int  # output tokens produced this step
    prefix_queries_tokens: int  # prompt tokens looked up in the prefix cache this step
    prefix_hits_tokens: int  # of those, found cached
    spec_draft_tokens: int = 0  # speculative tokens proposed this step
    spec_accepted_tokens: int = 0  # of those, accepted by verification
    spec_drafts: int = 0  # sequences verified against a draft this step
    spec_accepted_per_pos: tuple[int, ...] = ()  # [p]: drafts whose token at position p was accepted
    cancelled: bool = False  # the step stopped early: every request in it was being aborted (StepCancel)


@dataclass(slots=True)
class SpecTally:
    """One step's speculative decoding: drafts verified, their tokens, and what was accepted (a prefix of each
    draft, so position p counts when the first p + 1 draft tokens were accepted)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def add(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.drafts += 1
        self.draft_tokens += num_draft_tokens
        self.accepted_tokens += num_accepted
        self.accepted_per_pos.extend([0] * (num_draft_tokens - len(self.accepted_per_pos)))
        for p in range(num_accepted):
            self.accepted_per_pos[p] += 1


class EngineObserver(Protocol):
    """Receives timings; the Prometheus metrics implement it."""

    def on_step(self, stats: StepStats) -> None: ...

    def on_token(self, req: Request, now_s: float, first: bool) -> None: ...

    def on_finish(self, req: Request, now_s: float) -> None: ...

    def on_gauges(self, num_running: int, num_waiting: int, kv_cache_usage: float) -> None: ...

    def on_rejected(self, reason: str) -> None:
        """A request refused at admission; `reason` is vLLM's (`max_num_queued_reqs`: the waiting queue is full)."""
