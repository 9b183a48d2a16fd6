"""The native runner's K/V pool as numpy arrays: per layer (K, V) fp32 `[Hkv, slots, D]`, head-major, zeroed.

The C step takes the arrays' pointers. The pool is views of ONE private anonymous mapping (`zero_mapping`): the
kernel hands out zero pages on first touch, so reserving a 512 MiB pool costs microseconds instead of the ~0.3 s
of writing zeros, and blocks are paid for as they are first written. Zeros, not garbage: attention over a partly
filled block must never read NaN. Swapping copies whole blocks to host arrays and back (`swap_out_blocks`).
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from typing import cast

import numpy as np

from headroom.llm.config import DecoderConfig, EngineConfig

KVCaches = list[tuple[np.ndarray, np.ndarray]]  # per layer (K, V), each [Hkv, slots, D]


def zero_mapping(nbytes: int) -> mmap.mmap:
    """`nbytes` of zeros, paid for page by page as they are first written (a private anonymous mapping)."""
    return mmap.mmap(-1, max(1, nbytes), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def kv_block_bytes(cfg: DecoderConfig, block_size_tokens: int, itemsize: int) -> int:
    """Bytes one block takes across all layers (K and V) at `itemsize` bytes per value."""
    return 2 * cfg.num_hidden_layers * block_size_tokens * cfg.num_key_value_heads * cfg.head_dim_resolved * itemsize


def pool_blocks(cfg: DecoderConfig, engine: EngineConfig, itemsize: int, num_blocks: int | None) -> tuple[int, int]:
    """(blocks, bytes per block): `num_blocks`, or by default as many as `engine.kv_cache_memory_mb` holds."""
    per_block = kv_block_bytes(cfg, engine.block_size_tokens, itemsize)
    blocks = num_blocks if num_blocks is not None else int(engine.kv_cache_memory_mb * 2**20 // per_block)
    if blocks < 1:
        raise ValueError(
            f"kv_cache_memory_mb={engine.kv_cache_memory_mb} holds no block of {per_block} bytes; raise it"
        )
    return blocks, per_block


def allocate_kv_arrays(cfg: DecoderConfig, engine: EngineConfig, num_blocks: int | None) -> tuple[int, int, KVCaches]:
    """(blocks, bytes per block, per-layer (K, V) fp32 arrays) for the native runner (see the module doc)."""
    blocks, per_block = pool_blocks(cfg, engine, 4, num_blocks)
    shape = (cfg.num_key_value_heads, blocks * engine.block_size_tokens, cfg.head_dim_resolved)
    numel = int(np.prod(shape))
    flat = np.frombuffer(zero_mapping(numel * 4 * 2 * cfg.num_hidden_layers), dtype=np.float32)  # keeps the map
    views = [flat[i * numel : (i + 1) * numel].reshape(shape) for i in range(2 * cfg.num_hidden_layers)]
    return blocks, per_block, [(views[2 * i], views[2 * i + 1]) for i in range(cfg.num_hidden_layers)]


def _paged(cache: np.ndarray, block_size: int) -> np.ndarray:
    """[Hkv, slots, D] viewed as [Hkv, blocks, block size, D]."""
    return cache.reshape(cache.shape[0], -1, block_size, cache.shape[2])


def swap_out_blocks(kv_caches: KVCaches, block_size: int, block_ids: Sequence[int]) -> object:
    """Host copies of these blocks' K/V in every layer (what `Runner.swap_out` returns)."""
    idx = np.asarray(list(block_ids), dtype=np.int64)
    return [(_paged(k, block_size)[:, idx].copy(), _paged(v, block_size)[:, idx].copy()) for k, v in kv_caches]


def swap_in_blocks(kv_caches: KVCaches, block_size: int, host_copy: object, block_ids: Sequence[int]) -> None:
    """Copy `swap_out_blocks`' host copies back into these (new) blocks."""
    saved = cast(KVCaches, host_copy)
    idx = np.asarray(list(block_ids), dtype=np.int64)
    for (k, v), (hk, hv) in zip(kv_caches, saved, strict=True):
        _paged(k, block_size)[:, idx] = hk
        _paged(v, block_size)[:, idx] = hv
