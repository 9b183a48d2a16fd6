"""Int8 weights (`weight_dtype: int8`): the FBGEMM linear approximates fp32, the engine runs and frees blocks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from headroom.llm.config import EngineConfig
from headroom.llm.engine import LLMEngine
from headroom.llm.model import Linear, build_model
from headroom.llm.offline import LLM
from headroom.llm.quant import (
    INT8_PREFIX,
    Int8DynamicLinear,
    int8_state_dict,
    prepare_int8,
    quantize_linears_int8,
    quantize_weight_int8,
)
from headroom.llm.request import SamplingParams
from headroom.llm.runner import BatchItem, ModelBatch, TorchRunner, int8_weights
from headroom.llm.weights import INT8_FILE, LoadedCheckpoint
from tests.llm.conftest import TINY, TINY_ENGINE

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


def test_int8_linear_flat_fast_path_equals_the_batched_path() -> None:
    g = torch.Generator().manual_seed(1)
    lin = Int8DynamicLinear(torch.randn(24, 16, generator=g), None)
    x = torch.randn(3, 16, generator=g)
    flat = lin(x)  # 2-D input: the op is called directly (the decoder's flat batch)
    assert flat.shape == (3, 24)
    assert torch.equal(flat, lin(x.unsqueeze(0))[0])  # same kernel, same activation scale: identical


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
    assert EngineConfig.from_parameters({"weight_dtype": "int8_on_cpu"}).weight_dtype == "int8_on_cpu"


def test_int8_on_cpu_quantises_a_cpu_model_and_leaves_a_gpu_one_in_dtype(make_tiny: MakeEngine) -> None:
    eng = make_tiny(weight_dtype="int8_on_cpu")  # the tiny engine runs on CPU: int8 linears, as with int8
    assert any(isinstance(m, Int8DynamicLinear) for m in eng.runner.model.modules())  # type: ignore[attr-defined]
    assert not any(isinstance(m, Linear) for m in eng.runner.model.modules())  # type: ignore[attr-defined]
    cfg = EngineConfig(weight_dtype="int8_on_cpu")
    assert int8_weights(cfg, torch.device("cpu")) and not int8_weights(cfg, torch.device("cuda"))
    assert int8_weights(EngineConfig(weight_dtype="int8"), torch.device("cuda"))  # int8 asked: quant.py refuses
    assert not int8_weights(EngineConfig(), torch.device("cpu"))


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


class _FakeQuantLinear(torch.nn.Module):
    """Reference for FBGEMM's dynamic int8 linear in plain fp64 torch: the *dequantised* int8 weights times
    the input fake-quantised the way `quantized::linear_dynamic(reduce_range=True)` does (one asymmetric
    7-bit scale and zero point per call, over the range of the whole input including 0)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        q, scales = quantize_weight_int8(weight)
        self.w = q.double() * scales.double()[:, None]
        self.b = None if bias is None else bias.detach().double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
        scale = (hi - lo) / 127.0 or 1.0
        zp = min(max(round(-lo / scale), 0), 127)
        xq = (torch.clamp(torch.round(x.double() / scale) + zp, 0, 127) - zp) * scale
        return F.linear(xq, self.w, self.b).float()


def test_int8_linear_is_dequantised_weights_times_fake_quantised_input() -> None:
    g = torch.Generator().manual_seed(3)
    w, b, x = torch.randn(48, 32, generator=g), torch.randn(48, generator=g), torch.randn(7, 32, generator=g) + 0.3
    got, ref = Int8DynamicLinear(w, b)(x), _FakeQuantLinear(w, b)(x)
    assert (got - ref).abs().max() < 1e-5 * ref.abs().max()  # float rounding only
    assert (got - F.linear(x, w, b)).abs().max() > 1e-3 * ref.abs().max()  # and fp32 is really different


def _greedy(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in LLM(engine).generate(prompts, params)]


def test_int8_greedy_equals_dequantised_reference_and_reports_fp32_agreement(
    make_tiny: MakeEngine, prompts_of_lengths: Prompts
) -> None:
    """int8 greedy text = the same model with the dequantised int8 weights (and FBGEMM's activation
    rounding) computed in fp64; against plain fp32 it is only close (the agreement rate is printed)."""
    prompts = prompts_of_lengths([5, 21, 9, 14])
    # decode_backend torch: FBGEMM for every step (the C decode step quantises activations per row instead; its
    # own reference test is tests/llm/kernels/test_int8_decode.py)
    int8, ref, fp32 = make_tiny(weight_dtype="int8", decode_backend="torch"), make_tiny(), make_tiny()
    model = ref.runner.model  # type: ignore[attr-defined]
    targets = [(p, n, c) for p in model.modules() for n, c in p.named_children() if isinstance(c, Linear)]
    assert targets
    for parent, name, child in targets:
        setattr(parent, name, _FakeQuantLinear(child.weight, child.bias))
    # one prompt at a time: FBGEMM's activation scale spans the whole step, so batches must match exactly
    got = [_greedy(int8, [p], 12)[0] for p in prompts]
    assert got == [_greedy(ref, [p], 12)[0] for p in prompts]
    plain = [_greedy(fp32, [p], 12)[0] for p in prompts]
    same = sum(a == b for g, p in zip(got, plain, strict=True) for a, b in zip(g, p, strict=True))
    print(f"int8 vs fp32 greedy token agreement (tiny random model): {same}/{12 * len(prompts)}")


def test_cached_int8_weights_load_without_quantising_and_give_identical_logits(
    tiny_state: dict[str, torch.Tensor], prompts_of_lengths: Prompts
) -> None:
    fused = build_model(TINY, tiny_state, torch.device("cpu"), torch.float32)
    fused.fuse_projections()
    cache = int8_state_dict(fused)
    assert all(k.startswith(INT8_PREFIX) for k in cache)
    assert {k for k in cache if k.endswith("qkv_proj.weight")} and all(
        v.dtype == torch.int8 for k, v in cache.items() if k.endswith(".weight")
    )
    cold = build_model(TINY, tiny_state, torch.device("cpu"), torch.float32)
    warm = build_model(TINY, {**tiny_state, **cache}, torch.device("cpu"), torch.float32)
    assert prepare_int8(cold, cold.extra_tensors) == 0
    assert prepare_int8(warm, warm.extra_tensors) == 4 * TINY.num_hidden_layers + 1  # + lm_head
    assert not any(isinstance(m, Linear) for m in warm.modules())
    batch = ModelBatch(tuple(BatchItem(f"s{i}", tuple(p), 0, (2 * i, 2 * i + 1), True) for i, p in
                             enumerate(prompts_of_lengths([5, 21, 9]))), 16)  # fmt: skip
    a = TorchRunner(cold, replace(TINY_ENGINE, weight_dtype="int8")).execute(batch)
    b = TorchRunner(warm, replace(TINY_ENGINE, weight_dtype="int8")).execute(batch)
    assert torch.equal(a, b)


def test_converted_gguf_caches_the_int8_weights(smollm2: LoadedCheckpoint) -> None:
    assert smollm2.cache_dir is not None and (smollm2.cache_dir / INT8_FILE).exists()
    sd = smollm2.state_dict
    qkv = torch.cat([sd[f"model.layers.3.self_attn.{p}_proj.weight"] for p in "qkv"])
    q, scales = quantize_weight_int8(qkv)
    assert torch.equal(sd[f"{INT8_PREFIX}model.layers.3.self_attn.qkv_proj.weight"], q)
    assert torch.equal(sd[f"{INT8_PREFIX}model.layers.3.self_attn.qkv_proj.scale"], scales)
    assert f"{INT8_PREFIX}lm_head.weight" in sd
