"""The C paged-attention kernel equals the torch attention path (fp32 tolerance) on random paged caches, its
RoPE + cache write is bit-identical to torch's, the portable (non-AVX2) build agrees too, and the backend
switch falls back to torch where the kernel cannot serve."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from headroom.llm.config import DecoderConfig
from headroom.llm.kernels.build import KernelUnavailableError, build_library, load_library, open_library
from headroom.llm.kernels.paged_attention import PagedAttentionKernel, load_kernel, select_attention_kernel
from headroom.llm.model import Attention, Rotary
from headroom.llm.runner import BatchItem, ModelBatch, build_metadata
from tests.llm.conftest import TINY

needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")


def _attention(cfg: DecoderConfig, seed: int) -> Attention:
    """An Attention layer with seeded random weights, q/k/v fused (as the runner prepares it)."""
    attn = Attention(cfg)
    g = torch.Generator().manual_seed(seed)
    for p in attn.parameters():
        p.data = torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5  # outputs of order 1
    attn.fuse_projections()
    return attn


def _random_step(
    cfg: DecoderConfig, block_size: int, context_lens: list[int], num_new: list[int], seed: int
) -> tuple[ModelBatch, torch.Tensor, torch.Tensor]:
    """A step over sequences with `context_lens[i]` tokens already cached (random K/V) in shuffled,
    non-contiguous blocks; returns the batch and a K/V cache pair ([Hkv, slots, D])."""
    g = torch.Generator().manual_seed(seed)
    needed = [-(-(c + n) // block_size) for c, n in zip(context_lens, num_new, strict=True)]
    num_blocks = sum(needed) + 3
    order = torch.randperm(num_blocks, generator=g).tolist()
    items, used = [], 0
    for i, (c, n) in enumerate(zip(context_lens, num_new, strict=True)):
        table = tuple(order[used : used + needed[i]])
        used += needed[i]
        tokens = tuple(int(t) for t in torch.randint(1, cfg.vocab_size, (n,), generator=g))
        items.append(BatchItem(f"s{i}", tokens, c, table, True, num_logits=n))
    shape = (cfg.num_key_value_heads, num_blocks * block_size, cfg.head_dim_resolved)
    return ModelBatch(tuple(items), block_size), torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def _run_layer(
    attn: Attention, batch: ModelBatch, k: torch.Tensor, v: torch.Tensor, kernel: PagedAttentionKernel | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One attention layer's output for the step's tokens, and the caches after it."""
    cfg = replace(TINY, num_attention_heads=attn.num_heads, num_key_value_heads=attn.num_kv_heads)
    _, pos, meta, _ = build_metadata(batch, torch.device("cpu"), kernel)
    rotary = Rotary(attn.head_dim, cfg.max_position_embeddings, cfg.rope_theta)
    cos, sin = rotary.tables(pos, torch.float32)
    x = torch.randn((pos.shape[0], attn.o_proj.weight.shape[0]), generator=torch.Generator().manual_seed(9))
    k, v = k.clone(), v.clone()
    with torch.inference_mode():
        out = attn.forward(x, cos, sin, k, v, meta)
    return out, k, v


SHAPES = [  # (query heads, kv heads, head_dim, block size)
    (4, 2, 16, 16),  # TINY's grouping
    (9, 3, 64, 16),  # SmolLM2-135M's
    (4, 4, 8, 4),  # no GQA, tiny blocks
    (6, 2, 12, 5),  # head_dim not a multiple of 8 (scalar path), odd block size
]


@needs_cc
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("context_lens", [[37], [0, 1, 15, 16, 17, 50, 3, 64]])
def test_decode_kernel_matches_torch_path_on_random_paged_caches(
    shape: tuple[int, int, int, int], context_lens: list[int]
) -> None:
    nh, nkv, hd, bs = shape
    cfg = replace(TINY, hidden_size=nh * hd, num_attention_heads=nh, num_key_value_heads=nkv)
    attn = _attention(cfg, seed=nh * hd)
    batch, k, v = _random_step(cfg, bs, context_lens, [1] * len(context_lens), seed=len(context_lens))
    want, k_want, v_want = _run_layer(attn, batch, k, v, None)
    got, k_got, v_got = _run_layer(attn, batch, k, v, load_kernel())
    assert torch.equal(k_got, k_want) and torch.equal(v_got, v_want)  # RoPE + cache write: bit-identical
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_cc
def test_mixed_step_uses_kernel_for_decodes_and_torch_for_chunks_with_the_same_result() -> None:
    cfg = replace(TINY, hidden_size=9 * 64, num_attention_heads=9, num_key_value_heads=3)
    attn = _attention(cfg, seed=3)
    batch, k, v = _random_step(cfg, 16, [20, 0, 33, 7], [1, 12, 1, 5], seed=5)
    want, k_want, v_want = _run_layer(attn, batch, k, v, None)
    got, k_got, v_got = _run_layer(attn, batch, k, v, load_kernel())
    assert torch.equal(k_got, k_want) and torch.equal(v_got, v_want)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: list[int], n: int, bs: int) -> torch.Tensor:
    """Plain softmax attention of one query [H, D] over the first n slots of its block table."""
    slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(n)])
    group = q.shape[0] // k.shape[0]
    keys, values = k[:, slots].repeat_interleave(group, 0), v[:, slots].repeat_interleave(group, 0)
    probs = torch.softmax((q.unsqueeze(1) @ keys.transpose(1, 2)).squeeze(1).double() * q.shape[1] ** -0.5, -1)
    return (probs.float().unsqueeze(1) @ values).reshape(-1)


@needs_cc
@pytest.mark.parametrize("min_parallel_keys", [0, 1 << 40])  # OpenMP across (sequence, kv head) / one thread
def test_portable_and_native_builds_match_a_plain_softmax_reference(tmp_path: Path, min_parallel_keys: int) -> None:
    native = PagedAttentionKernel(load_library(), min_parallel_keys=min_parallel_keys)
    portable = PagedAttentionKernel(open_library(build_library(("-march=x86-64",), tmp_path)), min_parallel_keys)
    assert not portable.has_avx2
    cfg = replace(TINY, hidden_size=8 * 32, num_attention_heads=8, num_key_value_heads=2)
    lens = [1, 31, 32, 33, 200, 7]
    batch, k, v = _random_step(cfg, 16, [n - 1 for n in lens], [1] * len(lens), seed=11)
    q = torch.randn((len(lens), 8, 32), generator=torch.Generator().manual_seed(2))
    _, _, meta, _ = build_metadata(batch, torch.device("cpu"))
    want = torch.stack([_reference(q[i], k, v, list(it.block_table), lens[i], 16) for i, it in enumerate(batch.items)])
    old = torch.get_num_threads()
    torch.set_num_threads(2)  # the kernel shares torch's OpenMP runtime and its thread count
    try:
        for kernel in (native, portable):
            got = kernel.decode_attention(q, k, v, meta.groups[0], 16)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(old)


@needs_cc
def test_kernel_shares_torchs_openmp_runtime() -> None:
    """Loading the kernel maps no OpenMP runtime besides torch's (checked in a fresh interpreter: other libraries
    in the test process, e.g. scikit-learn's bundled libgomp, are not the kernel's doing)."""
    script = textwrap.dedent("""
        from pathlib import Path
        import torch
        def runtimes():
            maps = Path("/proc/self/maps").read_text().splitlines()
            return {line.split()[-1] for line in maps if "libgomp" in line or "libiomp" in line}
        torch.zeros(1).add_(1)
        before = runtimes()
        from headroom.llm.kernels.paged_attention import load_kernel
        load_kernel()
        after = runtimes()
        assert len(before) == 1 and after == before, (before, after)
        print("one runtime:", sorted(after))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "one runtime" in proc.stdout


def test_the_kernel_falls_back_to_torch_where_it_cannot_serve(caplog: pytest.LogCaptureFixture) -> None:
    cpu, smol = torch.device("cpu"), (9, 3, 64, 16)
    with caplog.at_level(logging.WARNING, logger="headroom.llm"):
        assert select_attention_kernel(cpu, torch.bfloat16, smol) is None
        assert select_attention_kernel(cpu, torch.float32, (9, 3, 64, 512)) is None
        assert select_attention_kernel(torch.device("cuda"), torch.bfloat16, smol) is None  # the plan: no log
    assert len(caplog.records) == 2 and "torch attention path" in caplog.records[0].getMessage()
    assert "CPU float32 only" in caplog.records[0].getMessage()


def test_build_without_a_compiler_raises_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(KernelUnavailableError, match="does not run"):
        build_library(cache_dir=tmp_path)

