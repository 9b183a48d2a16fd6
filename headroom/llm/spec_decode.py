"""Prompt-lookup (n-gram) speculative decoding: draft tokens by copying what followed the latest earlier
occurrence of the sequence's last n-gram, verify them all in one forward, keep the greedy-agreeing prefix.

Only greedy requests without penalties or logprobs speculate, so the output is token-for-token identical
to plain decoding: every kept token is the argmax the model would have produced one step at a time.

Where drafts come from is a seam: the scheduler asks a `DraftProposer` once per step for the drafts of all
eligible decodes. `NgramProposer` (prompt lookup, pure, stateless) is the default; `draft_model.
DraftModelProposer` runs a small draft model and keeps per-sequence state, freed through `release`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from headroom.llm.request import Request, SamplingParams


@dataclass(frozen=True, slots=True)
class DraftQuery:
    """One eligible decode the scheduler wants drafts for."""

    request: Request  # the sequence (its `token_ids` end with the token about to be decoded)
    max_tokens: int  # most draft tokens it may take (>= 1): k, capped by max_tokens and the context limit


class DraftProposer(Protocol):
    """Proposes draft tokens; may keep per-sequence state, which `release` frees."""

    def propose(self, queries: Sequence[DraftQuery]) -> list[tuple[int, ...]]:
        """Drafts for each query, in order (each at most `max_tokens` long; may be empty)."""
        ...

    def release(self, request_id: str) -> None:
        """Forget a sequence (finished, aborted or preempted); unknown ids are ignored."""
        ...


class NgramProposer:
    """Prompt lookup: drafts copied from the sequence's own history (stateless)."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram ({min_ngram}) <= max_ngram ({max_ngram})")
        self.max_ngram = max_ngram  # longest suffix n-gram looked up
        self.min_ngram = min_ngram  # shortest suffix n-gram looked up

    def propose(self, queries: Sequence[DraftQuery]) -> list[tuple[int, ...]]:
        return [propose_ngram(q.request.token_ids, q.max_tokens, self.max_ngram, self.min_ngram) for q in queries]

    def release(self, request_id: str) -> None:
        return None


def can_speculate(params: SamplingParams) -> bool:
    """Requests whose output speculation cannot change."""
    return params.greedy and params.logprobs is None and not params.adjusts_logits and params.grammar is None


def propose_ngram(token_ids: Sequence[int], num_tokens: int, max_ngram: int = 3, min_ngram: int = 1) -> tuple[int, ...]:
    """Up to `num_tokens` draft tokens following the latest earlier match of the longest suffix n-gram."""
    if num_tokens <= 0:
        return ()
    n_total = len(token_ids)
    for n in range(min(max_ngram, n_total - 1), min_ngram - 1, -1):
        suffix = list(token_ids[n_total - n :])
        for start in range(n_total - n - 1, -1, -1):
            if list(token_ids[start : start + n]) == suffix:
                draft = tuple(token_ids[start + n : start + n + num_tokens])
                if draft:
                    return draft
    return ()


def verify_greedy(logits: np.ndarray, draft: Sequence[int]) -> tuple[list[int], int]:
    """Rows are the logits after the last real token and after each draft token ([1 + len(draft), V]).

    Returns (tokens to append, number of draft tokens accepted): the accepted drafts, then the model's own
    token at the first disagreement (or the bonus token after all drafts)."""
    best = logits.argmax(-1).tolist()
    out: list[int] = []
    for i, d in enumerate(draft):
        if best[i] != d:
            out.append(int(best[i]))
            return out, i
        out.append(int(d))
    out.append(int(best[len(draft)]))
    return out, len(draft)
