"""The CPU paged-attention kernel: load (ctypes, built by `headroom.llm.kernels.build`) and call.

`paged_attention.c` holds two functions the fp32 CPU forward uses instead of ~15 torch ops per layer:
`hr_rope_write_kv` rotates the step's q/k (RoPE) and writes k/v straight into their cache slots, and
`hr_paged_decode_attention` attends each decode (one query per sequence) over its blocks *in place*, through
its block table (no gather copy of the context), with an online softmax, all query heads of a kv head
together (GQA), OpenMP across (sequence, kv head).

Built on first use with the system C compiler into one cached library with the other kernels (see `build`);
its OpenMP runtime is torch's, and the kernel uses torch's thread count.
No compiler, a failed build, or a CPU/dtype it does not serve: `select_attention_kernel` returns None (torch
path) with one log line saying why.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import TYPE_CHECKING

import torch

from headroom.llm.kernels.build import KernelUnavailableError, load_library

if TYPE_CHECKING:
    from headroom.llm.model import AttentionGroup

log = logging.getLogger("headroom.llm")
MAX_BLOCK_SIZE_TOKENS = 256  # stack buffers in the kernel are sized by block size x query heads per kv head
MAX_GROUP_X_HEAD_DIM = 16384  # (query heads per kv head) x head_dim floats of accumulators on the stack


_P = ctypes.c_void_p
_I = ctypes.c_int64


class PagedAttentionKernel:
    """The loaded library's attention functions; methods take torch tensors (CPU, fp32) and pass their pointers."""

    def __init__(self, lib: ctypes.CDLL, min_parallel_keys: int = 4096) -> None:
        """`lib`: the kernels library (`build.load_library`, or `open_library(build_library(...))` for another
        build). `min_parallel_keys`: a decode step attending fewer keys (summed over sequences and kv heads) runs
        on the calling thread only (an OpenMP fork costs more than attending a few hundred keys)."""
        self.has_avx2 = bool(lib.hr_has_avx2())
        self.min_parallel_keys = min_parallel_keys
        self._rope = lib.hr_rope_write_kv
        self._rope.argtypes = [_P, _I, _I, _I, _I, _P, _P, _P, _P, _P, _I, _P]
        self._rope.restype = None
        self._decode = lib.hr_paged_decode_attention
        self._decode.argtypes = [_P, _I, _P, _I, _I, _I, _I, _P, _P, _I, _P, _I, _P, _I, ctypes.c_float, _P, _I]
        self._decode.restype = None

    def rope_write_kv(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin_signed: torch.Tensor,
        slot_mapping: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        num_heads: int,
    ) -> torch.Tensor:
        """qkv: [T, (H + 2 Hkv) * D] (the fused projection's output); cos/sin_signed: [T, 1, D] (`Rotary.tables`);
        caches [Hkv, slots, D]. Writes rotated k and v into their slots; returns rotated q, [T, H, D]."""
        nkv, slots, hd = k_cache.shape
        t = qkv.shape[0]
        qkv, cos, sin_signed = qkv.contiguous(), cos.contiguous(), sin_signed.contiguous()
        q = torch.empty((t, num_heads, hd), dtype=torch.float32)
        self._rope(
            qkv.data_ptr(), t, num_heads, nkv, hd, cos.data_ptr(), sin_signed.data_ptr(), slot_mapping.data_ptr(),
            k_cache.data_ptr(), v_cache.data_ptr(), slots, q.data_ptr(),
        )  # fmt: skip
        return q

    def decode_attention(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, g: AttentionGroup, block_size: int
    ) -> torch.Tensor:
        """One-query-per-sequence group `g` (query_index [B, 1]); q: [T, H, D] (any row stride).
        Returns [B, H * D], like `Attention._attend`."""
        nkv, slots, hd = k_cache.shape
        nh = q.shape[1]
        if q.stride(2) != 1 or q.stride(1) != hd:
            q = q.contiguous()
        b = g.query_index.shape[0]
        out = torch.empty((b, nh * hd), dtype=torch.float32)
        self._decode(
            q.data_ptr(), q.stride(0), g.query_index.data_ptr(), b, nh, nkv, hd, k_cache.data_ptr(),
            v_cache.data_ptr(), slots, g.flat_blocks.data_ptr(), g.flat_blocks.shape[0] // b, g.seq_lens.data_ptr(),
            block_size, hd**-0.5, out.data_ptr(), self.min_parallel_keys,
        )  # fmt: skip
        return out


@functools.cache
def load_kernel(arch_flags: tuple[str, ...] = ("-march=native",)) -> PagedAttentionKernel:
    """Build (or reuse) and load the kernel once per process; raises KernelUnavailableError."""
    return PagedAttentionKernel(load_library(arch_flags))


def kernel_supports(num_heads: int, num_kv_heads: int, head_dim: int, block_size_tokens: int) -> str:
    """Why the kernel cannot serve this shape ("" = it can)."""
    if block_size_tokens > MAX_BLOCK_SIZE_TOKENS:
        return f"block_size_tokens {block_size_tokens} > {MAX_BLOCK_SIZE_TOKENS}"
    if head_dim % 2 or (num_heads // num_kv_heads) * head_dim > MAX_GROUP_X_HEAD_DIM:
        return f"head_dim {head_dim} x {num_heads // num_kv_heads} query heads per kv head is not supported"
    return ""


def select_attention_kernel(
    device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int, int]
) -> PagedAttentionKernel | None:
    """The kernel when it builds and serves this device/dtype/shape, else None (the torch path; on CPU with one
    log line saying why). `shape`: (query heads, kv heads, head_dim, block_size_tokens)."""
    why = ""
    if device.type != "cpu" or dtype != torch.float32:
        why = f"the kernel serves CPU float32 only (this model runs on {device.type} in {dtype})"
    else:
        why = kernel_supports(*shape)
    kernel = None
    if not why:
        try:
            kernel = load_kernel()
        except KernelUnavailableError as exc:
            why = str(exc)
    if kernel is not None:
        return kernel
    if device.type == "cpu":  # on a GPU the torch path is the plan, not a fallback worth a log line
        log.warning("paged-attention kernel unavailable (%s): using the torch attention path", why)
    return None
