"""The shipped default on SmolLM2: native GGUF execution through the engine, and its batch invariance.

A greedy request's tokens AND logprobs are bit-identical alone, beside 31 other streams, prefilled whole or in
chunks, and preempted (recompute) or not; the native text equals the native path run one sequence at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch

from headroom.llm.config import EngineConfig
from headroom.llm.engine import LLMEngine
from headroom.llm.kernels.build import load_library
from headroom.llm.kernels.native_gemm import resolve_isa
from headroom.llm.native_runner import NativeRunner
from headroom.llm.offline import DEFAULT_MODEL, LLM, build_engine, load_engine
from headroom.llm.request import SamplingParams
from headroom.llm.runner import BatchItem, ModelBatch
from headroom.llm.weights import LoadedCheckpoint

BASE = EngineConfig(kv_cache_memory_mb=64, max_num_seqs=32, max_num_batched_tokens=512, num_threads=1)
TARGET = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
CHATS = ["What is the capital of France?", "Write a haiku about the sea.", "2+2=", "Name three colours."]


@pytest.fixture(scope="module")
def default_engine() -> Iterator[tuple[LLMEngine, Any]]:
    """The default configuration's engine (weight_dtype auto -> native on CPU)."""
    engine, report = load_engine(DEFAULT_MODEL, BASE)
    yield engine, report
    assert not engine.has_unfinished and engine.kv.num_free_blocks == engine.kv.num_blocks


def _prompt(engine: LLMEngine, chat: str) -> list[int]:
    tok = engine.tokenizer
    assert tok is not None
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": chat}]), add_special_tokens=False)


def _target(engine: LLMEngine, others: list[tuple[list[int], SamplingParams]]) -> tuple[Any, ...]:
    """Run the target request (first) beside `others`; returns its (token ids, logprobs)."""
    ids = [engine.add_request("target", _prompt(engine, CHATS[0]), TARGET)]
    for i, (prompt, params) in enumerate(others):
        ids.append(engine.add_request(f"other-{i}", prompt, params))
    done: dict[str, Any] = {}
    while engine.has_unfinished:
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    out = done["target"]
    return out.token_ids, out.logprobs


def _others(engine: LLMEngine, count: int) -> list[tuple[list[int], SamplingParams]]:
    tok = engine.tokenizer
    assert tok is not None
    out = []
    for i in range(count):
        text = f"Story {i}: " + " ".join(["once upon a time there was a little robot"] * (1 + i % 7))
        params = SamplingParams(temperature=0.8 if i % 2 else 0.0, max_tokens=8 + i % 9, seed=i, ignore_eos=True)
        out.append((tok.encode(text), params))
    return out


def test_default_serves_the_gguf_natively_close_to_the_fp32_reference(
    default_engine: tuple[LLMEngine, Any], smollm2: LoadedCheckpoint
) -> None:
    engine, report = default_engine
    assert isinstance(engine.runner, NativeRunner)
    assert report.weight_format == "gguf:Q4_1+Q8_0"
    assert report.kernel_path == engine.runner.isa == resolve_isa(load_library())  # logged at start with the format
    assert not any(stage.startswith("convert_gguf_fp32") for stage in report.stages_s)  # no fp32 copy made
    assert report.quality.startswith("quality of gguf:Q4_1+Q8_0")  # what the server logs at start
    prompt = _prompt(engine, CHATS[0])
    item = BatchItem("p", tuple(prompt), 0, tuple(range(-(-len(prompt) // 16))), True, num_logits=len(prompt))
    native = torch.from_numpy(engine.runner.execute(ModelBatch((item,), 16)))
    reference = build_engine(smollm2.config, smollm2.state_dict, replace(BASE, kv_cache_memory_mb=16))
    fp32 = torch.from_numpy(reference.runner.execute(ModelBatch((item,), 16)))
    cosine = torch.nn.functional.cosine_similarity(native, fp32, dim=-1)
    agree = (native.argmax(-1) == fp32.argmax(-1)).float().mean()
    print(f"native vs fp32, {len(prompt)} positions: cosine mean {cosine.mean():.5f} min {cosine.min():.5f}, {agree=}")
    assert cosine.mean() > 0.99 and cosine.min() > 0.9
    assert agree >= 0.9


def test_tokens_and_logprobs_identical_alone_beside_31_others_chunked_and_preempted(
    default_engine: tuple[LLMEngine, Any],
) -> None:
    engine, _ = default_engine
    alone = _target(engine, [])
    assert len(alone[0]) == 12 and len(alone[1]) == 12
    assert _target(engine, _others(engine, 31)) == alone  # a step of 32 sequences, prefill mixed with decodes
    chunked, _ = load_engine(DEFAULT_MODEL, replace(BASE, max_num_batched_tokens=7))  # prompt in chunks of <= 7
    assert _target(chunked, _others(chunked, 3)) == alone
    tiny_pool, _ = load_engine(DEFAULT_MODEL, replace(BASE, kv_cache_memory_mb=12 * 16 * 30 * 2 * 3 * 64 * 4 / 2**20))
    assert tiny_pool.kv.num_blocks == 12  # far too few for 8 sequences of ~40-80 tokens: preemption by recompute
    assert _target(tiny_pool, _others(tiny_pool, 7)) == alone
    assert tiny_pool.scheduler.num_preemptions > 0
    for eng in (chunked, tiny_pool):
        assert eng.kv.num_free_blocks == eng.kv.num_blocks


def test_swap_preemption_of_the_numpy_pool_keeps_tokens_and_logprobs(default_engine: tuple[LLMEngine, Any]) -> None:
    """Preempted by SWAP (K/V blocks copied out of the numpy pool and back into other blocks), the target's
    tokens and logprobs are those it gets alone."""
    engine, _ = default_engine
    alone = _target(engine, [])
    swapping, _ = load_engine(DEFAULT_MODEL, replace(BASE, kv_cache_memory_mb=12 * 16 * 30 * 2 * 3 * 64 * 4 / 2**20,
                                                     swap_space_mb=64.0, enable_prefix_caching=False))
    assert swapping.kv.num_blocks == 12
    assert _target(swapping, _others(swapping, 7)) == alone
    assert swapping.scheduler.num_swaps > 0
    assert swapping.kv.num_free_blocks == swapping.kv.num_blocks


def test_native_greedy_text_on_four_prompts_equals_one_at_a_time(default_engine: tuple[LLMEngine, Any]) -> None:
    engine, _ = default_engine
    prompts = [_prompt(engine, c) for c in CHATS]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    llm = LLM(engine)
    together = [r.outputs[0].text for r in llm.generate(prompts, params)]
    alone = [llm.generate([p], params)[0].outputs[0].text for p in prompts]
    print(together)
    assert together == alone
    assert all(text.strip() for text in together)
