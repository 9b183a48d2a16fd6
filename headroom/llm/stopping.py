"""Stop conditions and output text: EOS / stop token ids / max_tokens / context, stop strings, detokenising.

A possible beginning of a stop string at the end of the text is held back from what is emitted (streamed)
until the next tokens show whether the stop string completes; a matched stop string is cut off (unless
`include_stop_str_in_output`).
"""

from __future__ import annotations

from collections.abc import Sequence

from headroom.llm.request import FinishReason, Request
from headroom.llm.tokenizer import IncrementalDetokenizer


def check_stop(req: Request, token: int, eos_token_id: int | None, max_model_len: int) -> str:
    """Set finish_reason when a stop condition holds; return the new text."""
    p = req.params
    if (token == eos_token_id and not p.ignore_eos) or token in p.stop_token_ids:
        req.finish_reason = FinishReason.STOP
    elif req.num_output_tokens >= p.max_tokens or len(req.token_ids) >= max_model_len:
        req.finish_reason = FinishReason.LENGTH
    detok = req.extra.get("detok")
    if not isinstance(detok, IncrementalDetokenizer):
        return ""
    ids = req.output_token_ids
    if req.finish_reason is FinishReason.STOP and not p.include_stop_str_in_output:
        ids = ids[:-1]
    delta = detok.update(ids)
    old_len = len(req.text)
    text = req.text + delta
    emitted = int(req.extra.get("emitted", 0))
    emit_to = len(text)
    if p.stop:
        window = max(0, old_len - max(len(s) for s in p.stop) + 1)
        hits = [(text.find(s, window), s) for s in p.stop]
        found = [(at, s) for at, s in hits if at >= 0]
        if found:
            at, stop = min(found)
            text = text[: at + len(stop)] if p.include_stop_str_in_output else text[:at]
            req.finish_reason = FinishReason.STOP
            emit_to = len(text)
        elif not req.finished:
            emit_to = len(text) - _stop_prefix_len(text, p.stop)  # hold back a possible stop string start
    req.text = text
    req.extra["emitted"] = max(emitted, emit_to)
    return text[emitted:emit_to]


def _stop_prefix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that begins some stop string (it may still complete)."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best
