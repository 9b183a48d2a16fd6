"""The C int8 decode step (`decode_backend`): its int8 linear is bit-exact against a torch reference of the same
arithmetic (native and portable builds), a whole decode step equals the module path run with that reference
linear, thread count does not change a bit, and steps it does not serve go through the modules unchanged."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from headroom.llm.kernels.build import build_library, load_library, open_library
from headroom.llm.kernels.int8_decode import linear_forward, select_decode_kernel
from headroom.llm.model import Linear, build_model
from headroom.llm.quant import Int8DynamicLinear, quantize_weight_int8
from headroom.llm.runner import BatchItem, ModelBatch, TorchRunner
from tests.llm.conftest import TINY, TINY_ENGINE
from tests.llm.test_quant import _FakeQuantLinear

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")


def _row_quantised(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's activation quantisation in torch: per row, symmetric, round(x * 127 / amax), ties to even."""
    amax = x.abs().amax(dim=1, keepdim=True)
    xq = torch.where(amax > 0, (x * (127.0 / amax)).round().clamp(-127, 127), torch.zeros_like(x))
    return xq, amax / 127.0


class RowQuantReference(torch.nn.Module):
    """What `hr_q8_linear_forward` computes, in torch: exact integer dot products (fp64 holds them exactly),
    then (float)sum * x_scale * w_scale (+ bias) in fp32, in that order."""

    def __init__(self, lin: Int8DynamicLinear) -> None:
        super().__init__()
        self.q, self.scales, self.b = lin.qweight, lin.scales, lin.bias_fp32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).float()
        xq, xs = _row_quantised(flat)
        out = (xq.double() @ self.q.double().T).float() * xs * self.scales[None, :]
        if self.b is not None:
            out = out + self.b
        return out.view(*x.shape[:-1], -1)


@pytest.mark.parametrize(("n", "k", "rows", "bias"), [(48, 64, 3, True), (576, 1536, 1, False), (50, 40, 2, True)])
def test_int8_linear_is_bit_exact_against_the_torch_reference(n: int, k: int, rows: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(n + k)
    w, x = torch.randn(n, k, generator=g), torch.randn(rows, k, generator=g)
    x[-1] = 0.0 if rows > 2 else x[-1]  # an all-zero row: scale 0, output = bias
    lin = Int8DynamicLinear(w, torch.randn(n, generator=g) if bias else None)
    got = linear_forward(load_library(), lin, x, num_threads=2)
    assert torch.equal(got, RowQuantReference(lin)(x))
    assert (got - F.linear(x, w, lin.bias_fp32)).abs().max() > 1e-4  # and it really is int8, not fp32


def test_portable_build_computes_the_same_bits(tmp_path: Path) -> None:
    """The scalar build (no AVX2) sums the same integers: identical outputs."""
    portable = open_library(build_library(("-march=x86-64",), cache_dir=tmp_path))
    g = torch.Generator().manual_seed(5)
    lin = Int8DynamicLinear(torch.randn(70, 96, generator=g), torch.randn(70, generator=g))
    x = torch.randn(3, 96, generator=g)
    assert torch.equal(linear_forward(portable, lin, x), linear_forward(load_library(), lin, x))


def _runner(tiny_state: dict[str, torch.Tensor], **overrides: object) -> TorchRunner:
    engine = replace(TINY_ENGINE, weight_dtype="int8", **overrides)  # type: ignore[arg-type]
    return TorchRunner(build_model(TINY, tiny_state, torch.device("cpu"), torch.float32), engine)


def _prefill_then_decode(prompts: list[list[int]]) -> tuple[ModelBatch, ModelBatch]:
    """A prefill of `prompts` (4 blocks of 16 slots each, shuffled) and the decode step after it."""
    tables = [(7 * i + 3, 7 * i + 1, 7 * i + 5, 7 * i + 2) for i in range(len(prompts))]
    prefill = ModelBatch(tuple(BatchItem(f"s{i}", tuple(p), 0, tables[i], True) for i, p in enumerate(prompts)), 16)
    decode = ModelBatch(tuple(BatchItem(f"s{i}", (3 + i,), len(p), tables[i], True) for i, p in enumerate(prompts)), 16)
    return prefill, decode


def test_decode_step_equals_the_module_path_with_the_reference_linear(
    tiny_state: dict[str, torch.Tensor], prompts_of_lengths: object
) -> None:
    """Same cache contents in, a 3-sequence decode step through the C kernel vs the torch modules with every
    int8 linear replaced by `RowQuantReference`: the logits agree to fp32 rounding (RMSNorm and attention sum
    in another order), far closer than to the FBGEMM module path (a different activation quantisation)."""
    prompts = prompts_of_lengths([5, 21, 17])  # type: ignore[operator]
    prefill, decode = _prefill_then_decode(prompts)
    fused, modules = _runner(tiny_state), _runner(tiny_state, decode_backend="torch")
    assert fused.decode_kernel is not None and modules.decode_kernel is None
    model = modules.model
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Int8DynamicLinear):
                setattr(parent, name, RowQuantReference(child))
    fused.execute(prefill)
    for (fk, fv), (mk, mv) in zip(fused.kv_caches, modules.kv_caches, strict=True):
        mk.copy_(fk), mv.copy_(fv)
    got, ref = fused.execute(decode), modules.execute(decode)
    other = _runner(tiny_state, decode_backend="torch")
    other.execute(prefill)
    fb = other.execute(decode)
    scale = ref.abs().max()
    assert (got - ref).abs().max() < 1e-5 * scale  # measured: 1e-6 (vs 0.4 from FBGEMM's rounding, scale 4)
    assert (got - ref).abs().max() < 1e-3 * (fb - ref).abs().max()
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    for (fk, fv), (mk, mv) in zip(fused.kv_caches, modules.kv_caches, strict=True):  # the new K/V were written
        assert torch.allclose(fk, mk, atol=1e-4) and torch.allclose(fv, mv, atol=1e-4)


def test_thread_count_does_not_change_a_bit(tiny_state: dict[str, torch.Tensor], prompts_of_lengths: object) -> None:
    prefill, decode = _prefill_then_decode(prompts_of_lengths([9, 30]))  # type: ignore[operator]
    outs = []
    for threads in (1, 2):
        runner = _runner(tiny_state)
        runner.execute(prefill)
        assert runner.decode_kernel is not None
        outs.append(runner.decode_kernel.decode(decode, threads))
    assert torch.equal(outs[0], outs[1])


def test_steps_it_does_not_serve_take_the_module_path(
    tiny_state: dict[str, torch.Tensor], prompts_of_lengths: object
) -> None:
    """Prefill, more sequences than kernel_decode_max_seqs, or a row without logits: the FBGEMM modules, bit for
    bit what decode_backend: torch gives."""
    prompts = prompts_of_lengths([4, 6, 8])  # type: ignore[operator]
    prefill, decode = _prefill_then_decode(prompts)
    no_logits = ModelBatch((replace(decode.items[0], needs_logits=False), *decode.items[1:]), 16)
    for batch in (decode, no_logits):
        kernel, modules = _runner(tiny_state, kernel_decode_max_seqs=2), _runner(tiny_state, decode_backend="torch")
        assert kernel.decode_kernel is not None and not kernel.decode_kernel.serves(batch)
        assert not kernel.decode_kernel.serves(prefill)
        assert torch.equal(kernel.execute(prefill), modules.execute(prefill))
        assert torch.equal(kernel.execute(batch), modules.execute(batch))


def test_out_of_range_token_or_block_is_refused_without_writing(tiny_state: dict[str, torch.Tensor]) -> None:
    runner = _runner(tiny_state)
    assert runner.decode_kernel is not None
    before = [k.clone() for k, _ in runner.kv_caches]
    bad_token = ModelBatch((BatchItem("s", (TINY.vocab_size,), 0, (1,), True),), 16)
    bad_block = ModelBatch((BatchItem("s", (5,), 20, (1, runner.num_blocks), True),), 16)  # 2nd block: no such
    for bad in (bad_token, bad_block):
        with pytest.raises(ValueError, match="out of range"):
            runner.execute(bad)
    assert all(torch.equal(a, k) for a, (k, _) in zip(before, runner.kv_caches, strict=True))


def test_backend_switch(tiny_state: dict[str, torch.Tensor]) -> None:
    """auto: the kernel for int8, nothing (silently) for fp32; torch: never; kernel on fp32: a clear error."""
    assert _runner(tiny_state).decode_kernel is not None
    assert _runner(tiny_state, decode_backend="torch").decode_kernel is None
    assert _runner(tiny_state, kernel_decode_max_seqs=0).decode_kernel is None
    fp32 = TorchRunner(build_model(TINY, tiny_state, torch.device("cpu"), torch.float32), TINY_ENGINE)
    assert fp32.decode_kernel is None
    with pytest.raises(ValueError, match="needs int8 weights"):
        select_decode_kernel("kernel", fp32.model, fp32.kv_caches, 16, 4, True)
    with pytest.raises(ValueError, match="decode_backend"):
        replace(TINY_ENGINE, decode_backend="fast").validate()


def test_engine_generates_with_the_kernel_and_frees_its_blocks(make_tiny: object, prompts_of_lengths: object) -> None:
    from headroom.llm.offline import LLM
    from headroom.llm.request import SamplingParams

    eng = make_tiny(weight_dtype="int8")  # type: ignore[operator]
    assert eng.runner.decode_kernel is not None
    prompts = prompts_of_lengths([5, 12, 3])  # type: ignore[operator]
    outs = LLM(eng).generate(prompts, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in outs] == [10, 10, 10]


class _StepReference(torch.nn.Module):
    """One prompt at a time, a one-row input is a decode step (the kernel's per-row quantisation), a longer one a
    prefill (FBGEMM's, `_FakeQuantLinear`)."""

    def __init__(self, lin: Int8DynamicLinear, fp32_weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.decode, self.prefill = RowQuantReference(lin), _FakeQuantLinear(fp32_weight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.decode(x) if x.reshape(-1, x.shape[-1]).shape[0] == 1 else self.prefill(x)
        return out


def test_int8_greedy_with_the_kernel_equals_the_reference(make_tiny: object, prompts_of_lengths: object) -> None:
    """The engine end to end: prefill through FBGEMM, every decode step through the C kernel, greedy tokens equal
    to the fp64/exact-integer reference of both (one prompt at a time, as FBGEMM's scale spans a step)."""
    from headroom.llm.offline import LLM
    from headroom.llm.request import SamplingParams

    eng, ref = make_tiny(weight_dtype="int8"), make_tiny()  # type: ignore[operator]
    assert eng.runner.decode_kernel is not None
    model = ref.runner.model
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Linear):
                lin = Int8DynamicLinear(child.weight, child.bias)
                setattr(parent, name, _StepReference(lin, child.weight, child.bias))
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    for prompt in prompts_of_lengths([5, 21, 9, 14]):  # type: ignore[operator]
        got = LLM(eng).generate([prompt], params)[0].outputs[0].token_ids
        assert got == LLM(ref).generate([prompt], params)[0].outputs[0].token_ids


def test_quantised_weights_are_kept_for_the_kernel() -> None:
    w = torch.randn(8, 32)
    lin = Int8DynamicLinear(w, None)
    q, s = quantize_weight_int8(w)
    assert torch.equal(lin.qweight, q) and torch.equal(lin.scales, s) and lin.bias_fp32 is None
