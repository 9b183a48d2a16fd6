"""Greedy outputs of the engine equal HF transformers' generate on the same (tiny, random) weights, and stay
identical with prefix caching on/off, chunked prefill and forced preemption."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from headroom.llm.engine import LLMEngine
from headroom.llm.kernels import paged_attention
from headroom.llm.kernels.build import KernelUnavailableError
from headroom.llm.offline import LLM, build_engine
from headroom.llm.request import SamplingParams
from headroom.llm.runner import TorchRunner
from headroom.llm.weights import load_checkpoint

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
MakeEngine = Callable[..., LLMEngine]
HfGreedy = Callable[[torch.nn.Module, list[int], int], list[int]]
Prompts = Callable[..., list[list[int]]]


def _run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    results = LLM(engine).generate(prompts, params)
    return [list(r.outputs[0].token_ids) for r in results]


def test_single_request_matches_hf(
    make_tiny: MakeEngine, tiny_hf: torch.nn.Module, prompts_of_lengths: Prompts, hf_greedy: HfGreedy
) -> None:
    prompt = prompts_of_lengths([9])[0]
    assert _run(make_tiny(), [prompt]) == [hf_greedy(tiny_hf, prompt, 12)]


def test_concurrent_requests_of_different_lengths_match_hf(
    make_tiny: MakeEngine, tiny_hf: torch.nn.Module, prompts_of_lengths: Prompts, hf_greedy: HfGreedy
) -> None:
    prompts = prompts_of_lengths([1, 5, 17, 33, 8, 40])
    expected = [hf_greedy(tiny_hf, p, 12) for p in prompts]
    assert _run(make_tiny(), prompts) == expected


def test_prefix_caching_on_off_and_chunked_prefill_identical(
    make_tiny: MakeEngine, prompts_of_lengths: Prompts
) -> None:
    shared = prompts_of_lengths([40], seed=7)[0]
    prompts = [shared + tail for tail in prompts_of_lengths([3, 9, 20, 1], seed=8)]
    base = _run(make_tiny(enable_prefix_caching=False), prompts)
    cached_engine = make_tiny(enable_prefix_caching=True)
    assert _run(cached_engine, prompts[:1]) == base[:1]  # warm the cache
    assert _run(cached_engine, prompts) == base
    stats = cached_engine.kv.stats()
    assert stats.prefix_hits_tokens >= 32 * 4  # two full shared blocks reused by each later prompt
    assert _run(make_tiny(max_num_batched_tokens=7), prompts) == base  # prefill in chunks of <= 7 tokens


def test_forced_preemption_gives_identical_output(
    make_tiny: MakeEngine, tiny_hf: torch.nn.Module, prompts_of_lengths: Prompts, hf_greedy: HfGreedy
) -> None:
    prompts = prompts_of_lengths([30, 31, 29, 28, 33, 27])
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    expected = [hf_greedy(tiny_hf, p, 20) for p in prompts]
    engine = make_tiny(kv_cache_memory_mb=10 * 8192 / 2**20)  # 10 blocks: far too few for 6 x 50 tokens
    assert engine.kv.num_blocks == 10
    assert _run(engine, prompts, params) == expected
    assert engine.scheduler.num_preemptions > 0


def test_seeded_sampling_is_reproducible_and_seed_sensitive(make_tiny: MakeEngine, prompts_of_lengths: Prompts) -> None:
    prompts = prompts_of_lengths([6, 11])
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=40, max_tokens=16, seed=123, ignore_eos=True)
    a = _run(make_tiny(), prompts, params)
    b = _run(make_tiny(max_num_batched_tokens=5, kv_cache_memory_mb=4 * 8192 / 2**20), prompts, params)
    assert a == b
    other = SamplingParams(temperature=1.0, top_p=0.9, top_k=40, max_tokens=16, seed=124, ignore_eos=True)
    assert _run(make_tiny(), prompts, other) != a


def test_n_greater_than_one_shares_prompt_blocks(make_tiny: MakeEngine, prompts_of_lengths: Prompts) -> None:
    engine = make_tiny()
    prompt = prompts_of_lengths([48])[0]
    params = SamplingParams(n=3, temperature=1.0, max_tokens=4, seed=5, ignore_eos=True)
    result = LLM(engine).generate([prompt], params)[0]
    assert [o.index for o in result.outputs] == [0, 1, 2]
    assert all(len(o.token_ids) == 4 for o in result.outputs)
    # the two later siblings reuse the leader's two full prompt blocks (47 of 48 tokens are reusable)
    assert engine.kv.stats().prefix_hits_tokens == 2 * 32


def test_prompt_lookup_speculation_matches_hf_greedy(
    make_tiny: MakeEngine, tiny_hf: torch.nn.Module, prompts_of_lengths: Prompts, hf_greedy: HfGreedy
) -> None:
    motifs = prompts_of_lengths([4, 6, 3])
    prompts = [m * 5 for m in motifs]  # repetitive prompts: n-gram drafts exist from the start
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    expected = [hf_greedy(tiny_hf, p, 16) for p in prompts]
    engine = make_tiny(speculative_ngram_tokens=4)
    assert _run(engine, prompts, params) == expected
    assert engine.spec_draft_tokens > 0 and engine.spec_accepted_tokens > 0


def test_hf_safetensors_directory_loads_and_matches(
    tiny_hf: torch.nn.Module,
    smollm2: Any,
    tmp_path: Path,
    prompts_of_lengths: Prompts,
    hf_greedy: HfGreedy,
) -> None:
    tiny_hf.save_pretrained(tmp_path)  # type: ignore[operator]
    shutil.copy(smollm2.tokenizer.tokenizer_json, tmp_path / "tokenizer.json")
    ckpt = load_checkpoint(str(tmp_path))
    assert ckpt.config.num_key_value_heads == 2 and ckpt.cache_dir is None
    engine = build_engine(ckpt.config, ckpt.state_dict)
    prompt = prompts_of_lengths([13])[0]
    assert _run(engine, [prompt]) == [hf_greedy(tiny_hf, prompt, 12)]


def test_bfloat16_dtype_path_runs_and_agrees_at_first(make_tiny: MakeEngine, prompts_of_lengths: Prompts) -> None:
    """The reduced-precision path used on CUDA (bf16 weights, K/V cache and activations), exercised on CPU."""
    prompts = prompts_of_lengths([5, 21])
    fp32 = _run(make_tiny(), prompts)
    engine = make_tiny(dtype="bfloat16")
    assert engine.runner.kv_caches[0][0].dtype == torch.bfloat16  # type: ignore[attr-defined]
    bf16 = _run(engine, prompts)
    assert [len(o) for o in bf16] == [12, 12]
    assert [o[0] for o in bf16] == [o[0] for o in fp32]


def test_swap_preemption_matches_hf(
    make_tiny: MakeEngine, tiny_hf: torch.nn.Module, prompts_of_lengths: Prompts, hf_greedy: HfGreedy
) -> None:
    prompts = prompts_of_lengths([30, 31, 29, 28])
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    expected = [hf_greedy(tiny_hf, p, 20) for p in prompts]
    engine = make_tiny(kv_cache_memory_mb=8 * 8192 / 2**20, swap_space_mb=1.0, enable_prefix_caching=False)
    assert _run(engine, prompts, params) == expected
    assert engine.scheduler.num_swaps > 0


def test_default_backend_is_the_kernel_and_the_torch_fallback_also_matches_hf(
    make_tiny: MakeEngine, tiny_hf: torch.nn.Module, prompts_of_lengths: Prompts, hf_greedy: HfGreedy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prompts = prompts_of_lengths([1, 5, 17, 33])
    expected = [hf_greedy(tiny_hf, p, 12) for p in prompts]
    default = make_tiny()

    def no_kernel() -> None:
        raise KernelUnavailableError("no C compiler (simulated)")

    monkeypatch.setattr(paged_attention, "load_kernel", no_kernel)  # a machine where the kernel cannot build
    fallback = make_tiny()
    if shutil.which("cc") or shutil.which("gcc"):  # the HF tests above ran on the C kernel
        assert isinstance(default.runner, TorchRunner) and default.runner.attention_kernel is not None
    assert isinstance(fallback.runner, TorchRunner) and fallback.runner.attention_kernel is None
    assert _run(fallback, prompts) == expected
    assert _run(default, prompts) == expected
