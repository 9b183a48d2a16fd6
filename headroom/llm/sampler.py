"""Token selection from logits: penalties, temperature, top-k, top-p, min-p, seeded sampling, logprobs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from headroom.llm.request import Request, SamplingParams, TokenLogprob


def apply_penalties(
    logits: torch.Tensor, params: SamplingParams, token_ids: Sequence[int], num_prompt: int
) -> torch.Tensor:
    """Repetition (HF, over prompt+output), presence and frequency (OpenAI, over output) penalties, then
    OpenAI's logit bias (added to the named tokens' logits)."""
    if params.repetition_penalty != 1.0 and token_ids:
        idx = torch.tensor(sorted(set(token_ids)), dtype=torch.long)
        vals = logits[idx]
        logits[idx] = torch.where(vals > 0, vals / params.repetition_penalty, vals * params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and len(token_ids) > num_prompt:
        counts = Counter(token_ids[num_prompt:])
        idx = torch.tensor(list(counts), dtype=torch.long)
        cnt = torch.tensor([counts[t] for t in counts], dtype=logits.dtype)
        logits[idx] -= params.frequency_penalty * cnt + params.presence_penalty
    if params.logit_bias:
        ids, biases = zip(*params.logit_bias, strict=True)
        logits[torch.tensor(ids, dtype=torch.long)] += torch.tensor(biases, dtype=logits.dtype)
    return logits


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p masking (masked entries become -inf)."""
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        cum = probs.cumsum(-1)
        drop = (cum - probs) >= params.top_p  # keep the smallest prefix reaching top_p mass
        logits = logits.scatter(0, order, sorted_logits.masked_fill(drop, float("-inf")))
    if params.min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    return logits


def _logprob(raw: torch.Tensor, token: int, k: int) -> TokenLogprob:
    lp = raw.log_softmax(-1)
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        vals, ids = torch.topk(lp, k)
        top = tuple((int(i), float(v)) for i, v in zip(ids.tolist(), vals.tolist(), strict=True))
    return TokenLogprob(token_id=token, logprob=float(lp[token]), top=top)


def sample(logits: torch.Tensor, reqs: Sequence[Request]) -> list[tuple[int, TokenLogprob | None]]:
    """One token per row; row i belongs to `reqs[i]`. Each request's own generator makes seeds reproducible."""
    out: list[tuple[int, TokenLogprob | None]] = []
    plain_greedy = all(r.params.greedy and not r.params.adjusts_logits for r in reqs)
    argmax = logits.argmax(-1).tolist() if plain_greedy else []
    for i, req in enumerate(reqs):
        p = req.params
        raw = logits[i]
        if plain_greedy:
            token = int(argmax[i])
        else:
            row = apply_penalties(raw.clone(), p, req.token_ids, req.num_prompt_tokens)
            if p.greedy:
                token = int(row.argmax())
            else:
                probs = filter_logits(row, p).softmax(-1)
                token = int(torch.multinomial(probs, 1, generator=req.generator).item())
        lp = _logprob(raw, token, p.logprobs) if p.logprobs is not None else None
        out.append((token, lp))
    return out
