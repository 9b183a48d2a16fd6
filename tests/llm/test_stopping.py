"""Stop strings: a possible stop-string start is held back from emitted text; a match is cut off."""

from __future__ import annotations

from typing import Any

from headroom.llm.request import Request, SamplingParams
from headroom.llm.stopping import check_stop
from headroom.llm.tokenizer import IncrementalDetokenizer, Tokenizer


def _feed(tok: Tokenizer, text: str, params: SamplingParams) -> tuple[list[str], Request]:
    req = Request("r", [1], params, arrival_s=0.0, seq_no=0)
    req.extra["detok"] = IncrementalDetokenizer(tok)
    deltas = []
    for token in tok.encode(text, add_special_tokens=False):
        req.token_ids.append(token)
        deltas.append(check_stop(req, token, tok.eos_token_id, 1000))
        if req.finished:
            break
    return deltas, req


def test_stop_string_is_cut_and_never_partially_emitted(smollm2: Any) -> None:
    tok = Tokenizer(smollm2.tokenizer)
    deltas, req = _feed(tok, "Hello there, my old friend. Bye", SamplingParams(max_tokens=50, stop=("my old",)))
    assert "".join(deltas) == "Hello there, " and req.finish_reason is not None
    assert req.finish_reason.value == "stop"
    assert all("my" not in d for d in deltas)


def test_held_back_prefix_is_released_when_the_stop_string_does_not_complete(smollm2: Any) -> None:
    tok = Tokenizer(smollm2.tokenizer)
    deltas, req = _feed(tok, "Hello my friend", SamplingParams(max_tokens=3, stop=(" my old",)))
    assert req.finish_reason is not None and req.finish_reason.value == "length"
    assert "".join(deltas) == "Hello my friend"


def test_include_stop_str_in_output(smollm2: Any) -> None:
    tok = Tokenizer(smollm2.tokenizer)
    params = SamplingParams(max_tokens=50, stop=("old",), include_stop_str_in_output=True)
    deltas, _ = _feed(tok, "my old friend", params)
    assert "".join(deltas) == "my old"
