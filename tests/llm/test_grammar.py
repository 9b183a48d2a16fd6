"""Constrained decoding mechanism (headroom.llm.grammar): the compile cache, masks, and the engine integration on
a tiny random decoder over SmolLM2's real vocabulary (its output is noise, so only the grammar can make it JSON)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs installed
import numpy as np
import pytest

from headroom.llm.config import EngineConfig
from headroom.llm.engine import LLMEngine
from headroom.llm.grammar import MATCHER_KEY, GrammarCompiler, apply_bitmask, compiler_for, compute_masks
from headroom.llm.offline import build_engine
from headroom.llm.request import FinishReason, SamplingParams
from headroom.llm.structured_output import schema_grammar
from headroom.protocol.openai_errors import FieldError

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"k": {"enum": ["red", "blue"]}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["k", "n"],
    "additionalProperties": False,
}
CONFIG = EngineConfig(kv_cache_memory_mb=16, max_num_seqs=8, max_num_batched_tokens=256, num_threads=1)


@pytest.fixture
def engine(tiny_chat_parts: Any) -> Any:
    cfg, state, tok = tiny_chat_parts
    eng = build_engine(cfg, state, CONFIG, tokenizer=tok)
    yield eng
    eng.close()


def _run(engine: LLMEngine) -> dict[str, Any]:
    done: dict[str, Any] = {}
    for _ in range(500):
        if not engine.has_unfinished:
            break
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    assert not engine.has_unfinished
    return done


def test_bitmask_bans_exactly_the_unset_bits() -> None:
    row = np.zeros(70, dtype=np.float32)
    mask = np.zeros(3, dtype=np.int32)
    mask[0] = 1 << 5
    mask[2] = 1 << 3  # token 67
    apply_bitmask(row, mask)
    assert np.flatnonzero(np.isfinite(row)).tolist() == [5, 67]


def test_compile_is_cached_per_grammar_with_lru_eviction(tiny_chat_parts: Any) -> None:
    _, _, tok = tiny_chat_parts
    comp = GrammarCompiler(tok.files.tokenizer_json, tok.eos_token_id, tok.vocab_size, cache_size=1)
    a, b = schema_grammar(SCHEMA, "s"), schema_grammar({"type": "array"}, "s")
    first, second = comp.matcher(a), comp.matcher(a)
    assert comp.compiled == 1 and first is not second  # one compile, a fresh matcher per sequence
    comp.matcher(b)
    comp.matcher(a)  # evicted by b (cache_size 1): compiled again
    assert comp.compiled == 3
    with pytest.raises(FieldError, match="cannot be used") as err:
        comp.compile(schema_grammar({"type": "object", "properties": {"x": {"$ref": "#/nowhere"}}}, "p"))
    assert err.value.param == "response_format.json_schema.schema"


def test_masks_follow_the_matcher_state(tiny_chat_parts: Any) -> None:
    _, _, tok = tiny_chat_parts
    comp = compiler_for(tok, tok.vocab_size)
    assert comp is not None
    m = comp.matcher(schema_grammar(SCHEMA, "s"))
    masks, errors = compute_masks([m], tok.vocab_size)
    row = np.zeros(tok.vocab_size, dtype=np.float32)
    apply_bitmask(row, masks[0])
    allowed = [tok.decode([int(t)]) for t in np.flatnonzero(np.isfinite(row))]
    assert not errors and allowed and all("{".startswith(a) or a.startswith("{") for a in allowed)


@pytest.mark.parametrize("threaded", [True, False], ids=["masks-in-thread", "masks-inline"])
def test_constrained_sequences_beside_free_ones_in_one_batch(engine: LLMEngine, threaded: bool) -> None:
    """Sampled noise from a random model is valid JSON of the schema once constrained; the free sequence in the
    same batch is not masked (it runs its full length, ignoring EOS, with no grammar to stop it)."""
    engine.mask_worker.threaded = threaded
    tok = engine.tokenizer
    assert tok is not None
    prompt = tok.encode("Give me JSON:")
    grammar = schema_grammar(SCHEMA, "s")
    engine.add_request("json", prompt, SamplingParams(n=4, temperature=1.0, seed=1, max_tokens=64, grammar=grammar))
    engine.add_request("free", prompt, SamplingParams(temperature=1.0, seed=1, max_tokens=24, ignore_eos=True))
    done = _run(engine)
    for i in range(4):
        out = done[f"json#{i}"]
        assert out.finish_reason is FinishReason.STOP, out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)
    assert done["free"].finish_reason is FinishReason.LENGTH and len(done["free"].token_ids) == 24
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


def test_a_failed_matcher_fails_only_its_request(engine: LLMEngine) -> None:
    tok = engine.tokenizer
    assert tok is not None
    prompt = tok.encode("Hello")
    grammar = schema_grammar(SCHEMA, "s")
    engine.add_request("bad", prompt, SamplingParams(max_tokens=8, temperature=0.0, grammar=grammar))
    engine.add_request("ok", prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    matcher = engine.scheduler.requests["bad"].extra[MATCHER_KEY]
    matcher.consume_token(tok.encode("]")[0])  # a token the grammar refuses: the matcher is now in error
    done = _run(engine)
    assert done["bad"].finish_reason is FinishReason.ERROR and "grammar" in str(done["bad"].error)
    assert done["ok"].finish_reason is FinishReason.LENGTH and len(done["ok"].token_ids) == 8


def test_a_grammar_without_a_tokenizer_or_that_does_not_compile_is_refused_at_admission(
    engine: LLMEngine, tiny_chat_parts: Any
) -> None:
    with pytest.raises(FieldError):
        engine.add_request("x", [1, 2], SamplingParams(grammar='{"grammars": [{"lark_grammar": "start: ("}]}'))
    assert not engine.has_unfinished
    cfg, state, _ = tiny_chat_parts
    bare = build_engine(cfg, state, CONFIG)
    with pytest.raises(Exception, match="tokenizer"):
        bare.add_request("x", [1, 2], SamplingParams(grammar=schema_grammar(SCHEMA, "s")))
