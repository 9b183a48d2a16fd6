"""Prompt-lookup (n-gram) speculative decoding: draft tokens by copying what followed the latest earlier
occurrence of the sequence's last n-gram, verify them all in one forward, keep the greedy-agreeing prefix.

Only greedy requests without penalties or logprobs speculate, so the output is token-for-token identical
to plain decoding: every kept token is the argmax the model would have produced one step at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from headroom.llm.request import SamplingParams


def can_speculate(params: SamplingParams) -> bool:
    """Requests whose output speculation cannot change."""
    return (
        params.greedy
        and params.logprobs is None
        and params.repetition_penalty == 1.0
        and not params.presence_penalty
        and not params.frequency_penalty
    )


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


def verify_greedy(logits: torch.Tensor, draft: Sequence[int]) -> tuple[list[int], int]:
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
