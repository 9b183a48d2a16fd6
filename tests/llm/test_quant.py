"""Int8 weights (`weight_dtype: int8`): the FBGEMM linear approximates fp32, the engine runs and frees blocks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from headroom.llm.config import EngineConfig
from headroom.llm.engine import LLMEngine
from headroom.llm.model import Linear
from headroom.llm.offline import LLM
from headroom.llm.quant import Int8DynamicLinear, quantize_linears_int8
from headroom.llm.request import SamplingParams
from headroom.llm.runner import BatchItem, ModelBatch

MakeEngine = Callable[..., LLMEngine]
Prompts = Callable[..., list[list[int]]]


def test_int8_linear_approximates_fp32_with_bias() -> None:
    g = torch.Generator().manual_seed(0)
    w, b, x = torch.randn(48, 32, generator=g), torch.randn(48, generator=g), torch.randn(2, 5, 32, generator=g)
    out = Int8DynamicLinear(w, b)(x)
    ref = F.linear(x, w, b)
    assert out.shape == ref.shape == (2, 5, 48)
    assert (out - ref).abs().max() < 0.05 * ref.abs().max()  # int8 error, not a different function
    assert not torch.equal(out, ref)  # it really is quantised


def test_quantize_replaces_every_linear_and_refuses_bf16() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    assert quantize_linears_int8(net) == 2
    assert all(isinstance(m, Int8DynamicLinear) for m in (net[0], net[2]))
    lin = Linear(8, 4).to(torch.bfloat16)
    with pytest.raises(ValueError, match="float32 model on CPU"):
        quantize_linears_int8(torch.nn.Sequential(lin))


def test_weight_dtype_is_validated() -> None:
    with pytest.raises(ValueError, match="weight_dtype"):
        EngineConfig(weight_dtype="int4").validate()
    assert EngineConfig.from_parameters({"weight_dtype": "int8"}).weight_dtype == "int8"


def test_int8_engine_logits_close_to_fp32_and_generation_runs(
    make_tiny: MakeEngine, prompts_of_lengths: Prompts
) -> None:
    prompts = prompts_of_lengths([5, 21, 9])
    fp32, int8 = make_tiny(), make_tiny(weight_dtype="int8")
    assert not any(isinstance(m, Linear) for m in int8.runner.model.modules())  # type: ignore[attr-defined]
    # same prefill through both runners (disjoint block tables), compare next-token logits
    items, start = [], 0
    for i, p in enumerate(prompts):
        blocks = tuple(range(start, start + -(-len(p) // 16)))
        start += len(blocks)
        items.append(BatchItem(f"s{i}", tuple(p), 0, blocks, True))
    batch = ModelBatch(tuple(items), 16)
    ref, got = fp32.runner.execute(batch), int8.runner.execute(batch)
    cos = F.cosine_similarity(ref, got, dim=-1)
    assert cos.min() > 0.99, cos
    assert ((ref - got).norm(dim=-1) / ref.norm(dim=-1)).max() < 0.15  # close, though the tiny model's
    # near-tied random logits may change their argmax (SmolLM2 greedy text is compared in the docs' bench)
    outs = LLM(int8).generate(prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in outs] == [8, 8, 8]
