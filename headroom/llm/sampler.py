"""Token selection from logits: penalties, temperature, top-k, top-p, min-p, seeded sampling, logprobs.

numpy only (no torch: the native serving path never imports it). Each request samples with its own
`numpy.random.Generator`, seeded from the request's `seed` (or the engine's RNG), so a seed reproduces its output.

Sampling is robust per row: a row whose logits or probabilities are not finite gets an error in its place
(400 InvalidRequest or 500 SamplingError; the engine finishes that sequence with it), never an exception
that would fail the whole batch. The check costs O(1) per row on the greedy path (argmax returns the first NaN
or +inf when there is one, and the row's max is then not finite) and one sum over the row's probabilities when
sampling.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from headroom.core.errors import HeadroomError, InvalidRequest
from headroom.llm.request import Request, SamplingParams, TokenLogprob

Pick = tuple[int, TokenLogprob | None]  # (token id, its logprob when asked)
_NEG_INF = np.float32(-np.inf)


class SamplingError(HeadroomError):
    """A row that could not be sampled because its model output was not finite (500, this request only)."""


def apply_penalties(
    logits: np.ndarray, params: SamplingParams, token_ids: Sequence[int], num_prompt: int
) -> np.ndarray:
    """Repetition (HF, over prompt+output), presence and frequency (OpenAI, over output) penalties, then
    OpenAI's logit bias (added to the named tokens' logits); in place on the fp32 row [V], which is returned."""
    if params.repetition_penalty != 1.0 and token_ids:
        idx = np.fromiter(sorted(set(token_ids)), dtype=np.int64)
        vals = logits[idx]
        logits[idx] = np.where(vals > 0, vals / np.float32(params.repetition_penalty),
                               vals * np.float32(params.repetition_penalty))
    if (params.presence_penalty or params.frequency_penalty) and len(token_ids) > num_prompt:
        counts = Counter(token_ids[num_prompt:])
        idx = np.fromiter(counts, dtype=np.int64)
        cnt = np.fromiter((counts[t] for t in counts), dtype=np.float32)
        logits[idx] -= np.float32(params.frequency_penalty) * cnt + np.float32(params.presence_penalty)
    if params.logit_bias:
        ids, biases = zip(*params.logit_bias, strict=True)
        logits[np.asarray(ids, dtype=np.int64)] += np.asarray(biases, dtype=np.float32)
    return logits


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities of a row [V] (NaN everywhere when its max is not finite, as torch's softmax)."""
    e = np.exp(logits - logits.max())
    out: np.ndarray = e / e.sum()
    return out


def filter_logits(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Temperature, then top-k, top-p and min-p masking (masked entries become -inf); a new row."""
    logits = logits / np.float32(params.temperature)
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = np.partition(logits, vocab - params.top_k)[vocab - params.top_k]
        logits = np.where(logits < kth, _NEG_INF, logits)
    if params.top_p < 1.0:
        order = np.argsort(-logits, kind="stable")
        sorted_logits = logits[order]
        probs = softmax(sorted_logits)
        drop = (np.cumsum(probs) - probs) >= params.top_p  # keep the smallest prefix reaching top_p mass
        logits = np.empty_like(logits)
        logits[order] = np.where(drop, _NEG_INF, sorted_logits)
    if params.min_p > 0.0:
        probs = softmax(logits)
        logits = np.where(probs < np.float32(params.min_p) * probs.max(), _NEG_INF, logits)
    return logits


def log_softmax(raw: np.ndarray) -> np.ndarray:
    """Log-probabilities of a row [V] (fp32; the normaliser summed in fp64, in one fixed order)."""
    shifted = raw - raw.max()
    lse = np.log(np.exp(shifted).sum(dtype=np.float64))
    out: np.ndarray = shifted - np.float32(lse)
    return out


def _logprob(raw: np.ndarray, token: int, k: int) -> TokenLogprob:
    lp = log_softmax(raw)
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        k = min(k, lp.shape[-1])
        cand = np.argpartition(-lp, k - 1)[:k]
        cand = cand[np.lexsort((cand, -lp[cand]))]  # best first; ties by token id
        top = tuple((int(i), float(lp[i])) for i in cand)
    return TokenLogprob(token_id=token, logprob=float(lp[token]), top=top)


def sample(logits: np.ndarray, reqs: Sequence[Request]) -> list[Pick | HeadroomError]:
    """One token per row of fp32 logits [len(reqs), V]; row i belongs to `reqs[i]`. Each request's own
    generator makes seeds reproducible.

    A row that cannot be sampled yields an error instead of a pick: InvalidRequest (400) when the model's
    logits were finite and the request's sampling parameters made them not (e.g. repetition_penalty
    1e-300), SamplingError (500) when the model's own logits were not finite.
    """
    out: list[Pick | HeadroomError] = []
    plain_greedy = all(r.params.greedy and not r.params.adjusts_logits for r in reqs)
    argmax: list[int] = []
    picked_ok: list[bool] = []
    if plain_greedy and len(reqs):
        best = logits.argmax(-1)  # the first NaN / +inf when there is one: its value is then not finite
        argmax = best.tolist()
        picked_ok = np.isfinite(logits[np.arange(len(reqs)), best]).tolist()
    with np.errstate(all="ignore"):  # a non-finite row is reported as an error below, not as a warning
        for i, req in enumerate(reqs):
            p = req.params
            raw = logits[i]
            if plain_greedy:
                if not picked_ok[i]:
                    out.append(_row_error(raw, req))
                    continue
                token = int(argmax[i])
            else:
                picked = _pick(raw, req)
                if picked is None:
                    out.append(_row_error(raw, req))
                    continue
                token = picked
            lp = _logprob(raw, token, p.logprobs) if p.logprobs is not None else None
            out.append((token, lp))
    return out


def _pick(raw: np.ndarray, req: Request) -> int | None:
    """Penalties, then argmax or filtered sampling; None when the row's distribution is not finite."""
    p = req.params
    row = apply_penalties(raw.copy(), p, req.token_ids, req.num_prompt_tokens)
    if p.greedy:
        token = int(row.argmax())
        return token if bool(np.isfinite(row[token])) else None
    probs = softmax(filter_logits(row, p))
    cdf = np.cumsum(probs, dtype=np.float64)
    total = float(cdf[-1])
    if not np.isfinite(total) or total <= 0.0:  # NaN or inf anywhere propagates into the sum
        return None
    rng = req.generator if req.generator is not None else np.random.default_rng()
    token = int(np.searchsorted(cdf, rng.random() * total, side="right"))  # inverse CDF: never a zero-mass token
    return min(token, int(np.flatnonzero(probs)[-1]))  # u * total rounded up to total: the last possible token


def _row_error(raw: np.ndarray, req: Request) -> HeadroomError:
    """Whose fault a non-finite row is: the model's (500) or the request's sampling parameters (400)."""
    if not bool(np.isfinite(raw.max())):  # NaN or +inf in the model's output, or every logit -inf
        return SamplingError("the model produced non-finite logits for this sequence; it was stopped")
    p = req.params
    return InvalidRequest(
        "the sampling parameters made the token distribution non-finite (repetition_penalty="
        f"{p.repetition_penalty}, presence_penalty={p.presence_penalty}, frequency_penalty={p.frequency_penalty}, "
        f"temperature={p.temperature}, top_p={p.top_p}, top_k={p.top_k}, min_p={p.min_p}); use values in the "
        "documented ranges"
    )
