"""Token selection from logits: penalties, temperature, top-k, top-p, min-p, seeded sampling, logprobs.

Sampling is robust per row: a row whose logits or probabilities are not finite gets an error in its place
(400 InvalidRequest or 500 SamplingError; the engine finishes that sequence with it), never an exception
that would fail the whole batch. The check costs O(1) per row on the greedy path (the row's max is NaN or
+inf when there is one, and `max` returns it with the index, in the pass argmax makes anyway) and one sum
over the row's probabilities when sampling.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from headroom.core.errors import HeadroomError, InvalidRequest
from headroom.llm.request import Request, SamplingParams, TokenLogprob

Pick = tuple[int, TokenLogprob | None]  # (token id, its logprob when asked)


class SamplingError(HeadroomError):
    """A row that could not be sampled because its model output was not finite (500, this request only)."""


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


def sample(logits: torch.Tensor, reqs: Sequence[Request]) -> list[Pick | HeadroomError]:
    """One token per row; row i belongs to `reqs[i]`. Each request's own generator makes seeds reproducible.

    A row that cannot be sampled yields an error instead of a pick: InvalidRequest (400) when the model's
    logits were finite and the request's sampling parameters made them not (e.g. repetition_penalty
    1e-300), SamplingError (500) when the model's own logits were not finite.
    """
    out: list[Pick | HeadroomError] = []
    plain_greedy = all(r.params.greedy and not r.params.adjusts_logits for r in reqs)
    argmax: list[int] = []
    picked_ok: list[bool] = []
    if plain_greedy:
        best_values, best = logits.max(-1)  # one pass, as argmax; NaN propagates into the value
        argmax = best.tolist()
        picked_ok = torch.isfinite(best_values).tolist()
    for i, req in enumerate(reqs):
        p = req.params
        raw = logits[i]
        if plain_greedy:
            if not picked_ok[i]:
                out.append(_row_error(raw, req))
                continue
            token = int(argmax[i])
        else:
            try:
                picked = _pick(raw, req)
            except RuntimeError:  # torch refused the distribution (multinomial on an invalid one)
                picked = None
            if picked is None:
                out.append(_row_error(raw, req))
                continue
            token = picked
        lp = _logprob(raw, token, p.logprobs) if p.logprobs is not None else None
        out.append((token, lp))
    return out


def _pick(raw: torch.Tensor, req: Request) -> int | None:
    """Penalties, then argmax or filtered sampling; None when the row's distribution is not finite."""
    p = req.params
    row = apply_penalties(raw.clone(), p, req.token_ids, req.num_prompt_tokens)
    if p.greedy:
        token = int(row.argmax())
        return token if bool(torch.isfinite(row[token])) else None
    probs = filter_logits(row, p).softmax(-1)
    if not bool(torch.isfinite(probs.sum())):  # NaN or inf anywhere propagates into the sum
        return None
    return int(torch.multinomial(probs, 1, generator=req.generator).item())


def _row_error(raw: torch.Tensor, req: Request) -> HeadroomError:
    """Whose fault a non-finite row is: the model's (500) or the request's sampling parameters (400)."""
    if not bool(torch.isfinite(raw.max())):  # NaN or +inf in the model's output, or every logit -inf
        return SamplingError("the model produced non-finite logits for this sequence; it was stopped")
    p = req.params
    return InvalidRequest(
        "the sampling parameters made the token distribution non-finite (repetition_penalty="
        f"{p.repetition_penalty}, presence_penalty={p.presence_penalty}, frequency_penalty={p.frequency_penalty}, "
        f"temperature={p.temperature}, top_p={p.top_p}, top_k={p.top_k}, min_p={p.min_p}); use values in the "
        "documented ranges"
    )
