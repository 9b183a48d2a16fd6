"""The native runner's numpy K/V pool (`headroom.llm.kv_pool`)."""

from __future__ import annotations

import numpy as np
import pytest

from headroom.llm.config import DecoderConfig, EngineConfig
from headroom.llm.kv_pool import allocate_kv_arrays, swap_in_blocks, swap_out_blocks

CFG = DecoderConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=64)


def test_the_pool_is_zeroed_writable_and_sized_from_the_budget() -> None:
    blocks, per_block, caches = allocate_kv_arrays(CFG, EngineConfig(block_size_tokens=4, kv_cache_memory_mb=1), None)
    assert per_block == 2 * 2 * 4 * 2 * 4 * 4  # K+V, layers, tokens, kv heads, head dim, fp32
    assert blocks == 2**20 // per_block and len(caches) == 2
    for k, v in caches:
        assert k.shape == v.shape == (2, blocks * 4, 4) and k.dtype == np.float32 and k.flags.c_contiguous
        assert not k.any() and k.flags.writeable
    with pytest.raises(ValueError, match="holds no block"):
        allocate_kv_arrays(CFG, EngineConfig(block_size_tokens=4, kv_cache_memory_mb=1e-6), None)


def test_swap_out_and_in_moves_whole_blocks_in_every_layer() -> None:
    _, _, caches = allocate_kv_arrays(CFG, EngineConfig(block_size_tokens=4), 6)
    rng = np.random.default_rng(0)
    for k, v in caches:
        k[...] = rng.standard_normal(k.shape)
        v[...] = rng.standard_normal(v.shape)
    before = [(k.copy(), v.copy()) for k, v in caches]
    saved = swap_out_blocks(caches, 4, [1, 3])
    swap_in_blocks(caches, 4, saved, [4, 0])
    for (k, v), (k0, v0) in zip(caches, before, strict=True):
        np.testing.assert_array_equal(k[:, 16:20], k0[:, 4:8])  # block 1 -> block 4
        np.testing.assert_array_equal(v[:, 0:4], v0[:, 12:16])  # block 3 -> block 0
        np.testing.assert_array_equal(k[:, 8:12], k0[:, 8:12])  # others untouched
