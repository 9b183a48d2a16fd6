"""Sampling parameters, the engine's per-sequence request state, and what the engine emits per step."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from headroom.llm.validation import TEMPERATURE_GREEDY_BELOW, check_range


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens and when to stop (OpenAI/vLLM meanings)."""

    n: int = 1  # completions per prompt; siblings share the prompt's cached blocks
    max_tokens: int = 16  # most generated tokens
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus sampling mass (1 = off)
    top_k: int = 0  # keep the k most likely tokens (0 or -1 = off)
    min_p: float = 0.0  # drop tokens below min_p * p(most likely) (0 = off)
    repetition_penalty: float = 1.0  # HF-style multiplicative penalty over prompt+output tokens (1 = off)
    presence_penalty: float = 0.0  # OpenAI additive penalty on tokens already generated
    frequency_penalty: float = 0.0  # OpenAI additive penalty scaled by the generated count
    seed: int | None = None  # per-request seed: same seed, same prompt -> same output
    stop: tuple[str, ...] = ()  # stop strings (not included in the output unless asked)
    stop_token_ids: tuple[int, ...] = ()  # extra token ids that stop generation
    ignore_eos: bool = False  # keep going past the end-of-sequence token
    logprobs: int | None = None  # return the chosen token's logprob and this many top alternatives
    include_stop_str_in_output: bool = False  # keep the matched stop string in the text
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit), sorted by id
    grammar: str | None = None  # llguidance grammar the output must follow (headroom.llm.grammar); None = free

    def validate(self) -> None:
        """Raise `FieldError` (a 400 at the edge) naming the bad field; the ranges are `validation.RANGES`."""
        for name in ("n", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                     "presence_penalty", "frequency_penalty"):
            check_range(name, getattr(self, name))
        for name in ("seed", "logprobs"):
            if getattr(self, name) is not None:
                check_range(name, getattr(self, name))
        for _, bias in self.logit_bias:
            check_range("logit_bias", bias)

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to argmax (a temperature below vLLM's 1e-5 counts as 0)."""
        return self.temperature < TEMPERATURE_GREEDY_BELOW or self.top_k == 1

    @property
    def adjusts_logits(self) -> bool:
        """True when penalties or a logit bias change the logits before a token is picked."""
        return bool(
            self.repetition_penalty != 1.0 or self.presence_penalty or self.frequency_penalty or self.logit_bias
        )


class FinishReason(enum.Enum):
    """Why a sequence ended (OpenAI's finish_reason values, plus abort)."""

    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the context limit
    ABORT = "abort"  # the client went away or the request was cancelled
    ERROR = "error"  # a failure of this sequence alone (non-finite logits, a detokenizer error): see `error`


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log-probability and the most likely alternatives."""

    token_id: int  # the chosen token
    logprob: float  # its log-probability under the model
    top: tuple[tuple[int, float], ...]  # (token id, logprob) of the top alternatives, best first


@dataclass(slots=True, eq=False)
class Request:
    """Mutable per-sequence state owned by the engine thread (never shared with the event loop).
    Compared by identity (queues hold the objects themselves)."""

    request_id: str  # unique id of this sequence
    prompt_token_ids: list[int]  # the prompt
    params: SamplingParams  # how to sample
    arrival_s: float  # when it arrived (engine clock)
    seq_no: int  # arrival order, ties priority (FCFS)
    priority: int = 0  # lower value = served first
    parent_id: str = ""  # the user-visible request this sequence belongs to (n > 1)
    index: int = 0  # which of the n completions
    leader_id: str = ""  # sibling whose prompt prefill this one waits for (shares its blocks)
    cache_key: str = ""  # prefix-cache isolation key (tenant + cache_salt); "" = the shared cache
    token_ids: list[int] = field(default_factory=list)  # prompt + output so far
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission
    generator: np.random.Generator | None = None  # per-request RNG for sampling (seeded; None when greedy)
    text: str = ""  # detokenised output so far (stop strings removed)
    finish_reason: FinishReason | None = None  # set when finished
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per output token, when asked
    first_scheduled_s: float | None = None  # when it first ran (queue time ends)
    first_token_s: float | None = None  # when the first output token was produced
    last_token_s: float | None = None  # when the latest output token was produced
    num_preemptions: int = 0  # times it was preempted (recomputed)
    extra: dict[str, Any] = field(default_factory=dict)  # detokeniser state etc.

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)
        if not self.parent_id:
            self.parent_id = self.request_id

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class RequestTimeline:
    """When a sequence went through each stage, on the engine's (injected, monotonic) clock, in seconds.

    queue = arrival -> first scheduled, prefill = first scheduled -> first token (chunked prefill spans
    several steps), decode = first token -> finished. A stage that never started has length 0, so the three
    always add up to `end_s - arrival_s`.
    """

    arrival_s: float  # admitted by the engine
    first_scheduled_s: float | None  # the first step that ran it (queue ends); None: never ran
    first_token_s: float | None  # its first output token was sampled (prefill ends); None: no token yet
    last_token_s: float | None  # its latest output token was sampled; None: no token yet
    finished_s: float | None  # it stopped (stop, length or abort); None while running

    @property
    def end_s(self) -> float:
        """`finished_s`, or the latest thing that happened while it is still running."""
        for t in (self.finished_s, self.last_token_s, self.first_token_s, self.first_scheduled_s):
            if t is not None:
                return t
        return self.arrival_s

    def stage_ms(self) -> tuple[float, float, float]:
        """(queue, prefill, decode) in milliseconds; each >= 0 and their sum is `end_s - arrival_s`."""
        end = max(self.arrival_s, self.end_s)
        scheduled = self.first_scheduled_s if self.first_scheduled_s is not None else end
        queue_end = min(end, max(self.arrival_s, scheduled))
        first_token = self.first_token_s if self.first_token_s is not None else end
        prefill_end = min(end, max(queue_end, first_token))
        return (
            (queue_end - self.arrival_s) * 1e3,
            (prefill_end - queue_end) * 1e3,
            (end - prefill_end) * 1e3,
        )


def merge_timelines(timelines: Sequence[RequestTimeline]) -> RequestTimeline:
    """One user-visible request's timeline from its n sequences: earliest start of each stage, latest end."""
    if not timelines:
        raise ValueError("merge_timelines needs at least one timeline")

    def first(values: Sequence[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return min(known) if known else None

    def last(values: Sequence[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    return RequestTimeline(
        arrival_s=min(t.arrival_s for t in timelines),
        first_scheduled_s=first([t.first_scheduled_s for t in timelines]),
        first_token_s=first([t.first_token_s for t in timelines]),
        last_token_s=last([t.last_token_s for t in timelines]),
        finished_s=None if any(t.finished_s is None for t in timelines) else last([t.finished_s for t in timelines]),
    )


@dataclass(frozen=True, slots=True)
class SequenceOutput:
    """What the engine reports for one sequence after a step that produced a token or finished it."""

    request_id: str  # the sequence
    parent_id: str  # the user-visible request (n > 1 groups share it)
    index: int  # completion index within the parent
    prompt_token_ids: tuple[int, ...]  # the prompt
    token_ids: tuple[int, ...]  # every output token so far
    new_token_ids: tuple[int, ...]  # output tokens added by this step
    text: str  # output text so far
    delta_text: str  # text added by this step
    finish_reason: FinishReason | None  # None while running
    logprobs: tuple[TokenLogprob, ...]  # per output token so far (empty unless asked)
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    arrival_s: float  # engine-clock arrival
    first_token_s: float | None  # engine-clock time of the first token
    finished_s: float | None  # engine-clock time it finished
    timeline: RequestTimeline | None = None  # every stage's timestamps (complete on the final output)
    error: Exception | None = None  # why it failed (finish_reason ERROR): a HeadroomError with its status

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
