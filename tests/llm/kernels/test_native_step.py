"""The native whole-model step (native_step.c via NativeStepKernel) on a tiny random GGUF-quantised decoder:
close to the fp32 torch model on the same (dequantised) weights, batch-invariant bit for bit (alone vs beside
others, whole vs chunked prefill, 1 vs 2 threads), every path, and refusing bad ids before writing anything."""

from __future__ import annotations

import ctypes
from dataclasses import replace

import numpy as np
import pytest
import torch

from headroom.llm import quant_blocks as qb
from headroom.llm.config import DecoderConfig, EngineConfig
from headroom.llm.kernels import native
from headroom.llm.kernels.native import NativeDecoderWeights, NativeLayerWeights, NativeStepKernel, permute_rows
from headroom.llm.kernels.native_gemm import supported_isas
from headroom.llm.model import build_model
from headroom.llm.runner import BatchItem, ModelBatch, TorchRunner
from headroom.llm.step_cancel import StepCancelled

CFG = DecoderConfig(
    vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
)  # fmt: skip
BS = 4  # tokens per block
NUM_BLOCKS = 64


def _q(fmt: str, w: np.ndarray) -> qb.QTensor:
    return qb.QTensor(fmt, w.shape[0], w.shape[1], qb.quantize_weights(fmt, w))


@pytest.fixture(scope="module")
def weights() -> NativeDecoderWeights:
    rng = np.random.default_rng(0)
    h, i, hd, kvd = 64, 128, 64, 32

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.2).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(h)).astype(np.float32)

    def layer() -> NativeLayerWeights:  # every weight format appears
        return NativeLayerWeights(
            input_norm=norm(), post_norm=norm(), q=_q("Q4_1", mat(hd, h)), k=_q("Q4_0", mat(kvd, h)),
            v=_q("Q8_0", mat(kvd, h)), o=_q("Q4_1", mat(h, hd)), gate=_q("Q4_1", mat(i, h)), up=_q("F16", mat(i, h)),
            down=_q("Q4_1", mat(h, i)),
        )  # fmt: skip

    layers = tuple(layer() for _ in range(CFG.num_hidden_layers))
    embed = _q("Q8_0", (rng.standard_normal((CFG.vocab_size, h)) * 0.5).astype(np.float32))
    return NativeDecoderWeights(CFG, embed, layers, norm(), embed)


def _torch_runner(w: NativeDecoderWeights) -> TorchRunner:
    sd = {"model.embed_tokens.weight": w.embed.dequantize(), "model.norm.weight": w.final_norm}
    names = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
             "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}  # fmt: skip
    for li, ly in enumerate(w.layers):
        sd[f"model.layers.{li}.input_layernorm.weight"] = ly.input_norm
        sd[f"model.layers.{li}.post_attention_layernorm.weight"] = ly.post_norm
        for attr, hf in names.items():
            sd[f"model.layers.{li}.{hf}.weight"] = getattr(ly, attr).dequantize()
    model = build_model(CFG, {k: torch.from_numpy(np.array(v)) for k, v in sd.items()}, torch.device("cpu"),
                        torch.float32)  # fmt: skip
    runner = TorchRunner(model, EngineConfig(block_size_tokens=BS, num_threads=1), num_blocks=NUM_BLOCKS)
    runner.attention_kernel = None  # the reference: torch ops only
    return runner


def _caches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    shape = (CFG.num_key_value_heads, NUM_BLOCKS * BS, CFG.head_dim_resolved)
    return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(CFG.num_hidden_layers)]


def _item(rid: str, toks: list[int], start: int, table: tuple[int, ...], n_logits: int = 1) -> BatchItem:
    return BatchItem(rid, tuple(toks), start, table, True, n_logits)


PROMPT = [int(t) for t in np.random.default_rng(3).integers(0, CFG.vocab_size, 23)]
TABLE_A = tuple(range(10, 20))  # sequence A's blocks (not starting at 0: tables are honoured)


def _run_a(kernel: NativeStepKernel, chunks: list[int], others: bool, threads: int) -> list[np.ndarray]:
    """Prefill PROMPT in `chunks`, then 3 greedy decodes; optionally beside two other sequences every step."""
    out: list[np.ndarray] = []
    pos, toks = 0, list(PROMPT)
    rng = np.random.default_rng(9)
    other_pos = [0, 0]
    steps = [*chunks, 1, 1, 1]
    for n in steps:
        new = toks[pos : pos + n]
        items = []
        if others:  # sequences B, C: prefill-sized chunks of random tokens, before and after A in the batch
            for j in range(2):
                k = int(rng.integers(1, 6))
                items.append(_item(f"o{j}", [int(t) for t in rng.integers(0, 97, k)], other_pos[j],
                                   tuple(range(30 + 10 * j, 40 + 10 * j))))  # fmt: skip
                other_pos[j] += k
        items.insert(1 if others else 0, _item("a", new, pos, TABLE_A))
        logits = kernel.step(ModelBatch(tuple(items), BS), threads)
        row = logits[1] if others else logits[0]
        out.append(row.copy())
        pos += n
        if pos >= len(toks):
            toks.append(int(np.argmax(row)))
    return out


def test_batch_invariance_bitwise(lib: ctypes.CDLL, weights: NativeDecoderWeights, isa: str) -> None:
    base = _run_a(NativeStepKernel(lib, weights, _caches(), BS, isa), [23], others=False, threads=1)
    for chunks, others, threads in (([23], True, 2), ([5, 11, 7], False, 2), ([4, 1, 18], True, 1)):
        got = _run_a(NativeStepKernel(lib, weights, _caches(), BS, isa), chunks, others, threads)
        # the final prompt chunk's logits and every decode's are the same bits
        for a, b in zip(base[-4:], got[-4:], strict=True):
            assert np.array_equal(a, b), f"{isa} chunks={chunks} others={others} threads={threads}"


def test_packed_layouts_give_the_gguf_layouts_bits(lib: ctypes.CDLL, weights: NativeDecoderWeights,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The packed kernels (transposed groups, 16-bit planes, AVX2's transposed 16-bit values) only reorder exact integer
    sums: a whole step's logits (chunked prefill, then decodes beside other sequences) equal those of the same path
    reading the GGUF layout, bit for bit."""
    simd = [isa for isa in supported_isas(lib) if isa != "scalar"]  # every path this CPU runs that has packed layouts
    got = {isa: _run_a(NativeStepKernel(lib, weights, _caches(), BS, isa), [9, 14], True, 2) for isa in simd}
    monkeypatch.setattr(native, "pack_tensor", lambda *_: None)
    for isa in simd:
        want = _run_a(NativeStepKernel(lib, weights, _caches(), BS, isa), [9, 14], others=True, threads=2)
        for a, b in zip(want, got[isa], strict=True):
            assert np.array_equal(a, b), isa


def test_close_to_fp32_torch_model(lib: ctypes.CDLL, weights: NativeDecoderWeights) -> None:
    kernel = NativeStepKernel(lib, weights, _caches(), BS)
    runner = _torch_runner(weights)
    batch = ModelBatch((_item("a", PROMPT, 0, TABLE_A, n_logits=3), _item("b", PROMPT[:9], 0, (1, 2, 3))), BS)
    got, want = kernel.step(batch, 2), runner.execute(batch)
    assert got.shape == want.shape == (4, CFG.vocab_size)
    err = float(np.abs(got - want).max()) / float(np.abs(want).max())
    print(f"native vs fp32 torch: max |diff| / max |logit| = {err:.4f}")
    assert err < 0.03, err
    assert np.array_equal(got.argmax(-1), want.argmax(-1))
    # the K/V cache has TorchRunner's layout: a decode in torch over the native prefill's cache agrees too
    runner_k = _torch_runner(weights)
    for (ck, cv), (rk, rv) in zip(kernel.kv_caches, runner_k.kv_caches, strict=True):
        rk.copy_(torch.from_numpy(ck)), rv.copy_(torch.from_numpy(cv))
    dec = ModelBatch((_item("a", [5], len(PROMPT), TABLE_A),), BS)
    assert float(np.abs(kernel.step(dec, 1) - runner_k.execute(dec)).max()) / float(np.abs(want).max()) < 0.03


def test_f32_weights_match_torch_closely(lib: ctypes.CDLL, weights: NativeDecoderWeights) -> None:
    """With F32 weights nothing is quantised: the step's structure (norms, RoPE, paged attention, SwiGLU, residuals,
    lm_head) matches the torch model to float rounding."""

    def f32(t: qb.QTensor) -> qb.QTensor:
        return _q("F32", t.dequantize())

    layers = tuple(
        replace(ly, q=f32(ly.q), k=f32(ly.k), v=f32(ly.v), o=f32(ly.o), gate=f32(ly.gate), up=f32(ly.up))
        for ly in weights.layers
    )
    layers = tuple(replace(ly, down=f32(ly.down)) for ly in layers)
    w32 = replace(weights, layers=layers, lm_head=f32(weights.lm_head))  # same values as the tied embedding
    batch = ModelBatch((_item("a", PROMPT, 0, TABLE_A, n_logits=2), _item("b", PROMPT[:5], 0, (7, 8))), BS)
    got, want = NativeStepKernel(lib, w32, _caches(), BS).step(batch, 2), _torch_runner(w32).execute(batch)
    assert float(np.abs(got - want).max()) < 1e-4 * float(np.abs(want).max())


def test_refuses_bad_ids_before_writing(lib: ctypes.CDLL, weights: NativeDecoderWeights) -> None:
    caches = _caches()
    kernel = NativeStepKernel(lib, weights, caches, BS)
    good = _item("a", [1, 2, 3], 0, (1,))
    for bad in (
        _item("b", [97], 0, (2,)),  # token id == vocab
        _item("b", [-1], 0, (2,)),
        _item("b", [1, 2], 3, (2,)),  # position 4 is past the one-block table
        _item("b", [1], 0, (NUM_BLOCKS,)),  # block id out of range
        _item("b", [1], 256, tuple(range(NUM_BLOCKS))),  # position past max_position_embeddings
    ):
        with pytest.raises(ValueError, match="out of range"):
            kernel.step(ModelBatch((good, bad), BS), 1)
    assert all(not k.any() and not v.any() for k, v in caches)  # nothing was written


def test_validation_and_permute_rows(lib: ctypes.CDLL, weights: NativeDecoderWeights) -> None:
    with pytest.raises(ValueError, match="final_norm has shape"):
        replace(weights, final_norm=weights.final_norm[:10]).validate()
    with pytest.raises(ValueError, match="lm_head is 128x64, expected 97x64"):
        replace(weights, lm_head=weights.layers[0].gate).validate()
    t = weights.layers[0].q
    order = np.arange(t.rows)[::-1]
    np.testing.assert_array_equal(permute_rows(t, order).dequantize(), t.dequantize()[order])
    with pytest.raises(ValueError, match="expected one of"):
        NativeStepKernel(lib, weights, _caches(), BS, isa="sse9")


@pytest.mark.parametrize("threads", [1, 2])
def test_a_set_cancel_flag_stops_the_step_after_its_first_layer(lib: ctypes.CDLL, weights: NativeDecoderWeights,
                                                                isa: str, threads: int) -> None:
    """The flag is read at every layer's end: set before the call, layer 0's K/V is written and nothing after it
    (every thread left at the same layer: the call returns). Clear, the logits are those of a call without one."""
    flag = ctypes.c_int(1)
    for prompt in (PROMPT[:5], PROMPT):  # per-thread rows (<= 8 tokens) and rows split over the team
        batch = ModelBatch((_item("a", prompt, 0, TABLE_A), _item("b", prompt[:3], 0, (1,))), BS)
        caches = _caches()
        kernel = NativeStepKernel(lib, weights, caches, BS, isa)
        with pytest.raises(StepCancelled):
            kernel.step(batch, threads, ctypes.addressof(flag))
        assert caches[0][0].any() and caches[0][1].any()  # layer 0 ran
        assert all(not k.any() and not v.any() for k, v in caches[1:])  # later layers did not
    clear = ctypes.c_int(0)
    want = NativeStepKernel(lib, weights, _caches(), BS, isa).step(batch, threads)
    got = NativeStepKernel(lib, weights, _caches(), BS, isa).step(batch, threads, ctypes.addressof(clear))
    assert np.array_equal(got, want)
