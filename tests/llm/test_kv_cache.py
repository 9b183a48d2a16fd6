"""Block pool bookkeeping: allocation, ref counts, prefix hits verified by content, LRU eviction."""

from __future__ import annotations

import pytest

from headroom.llm.kv_cache import KVCacheManager, chain_hash, root_hash


def test_allocate_and_free_returns_every_block() -> None:
    kv = KVCacheManager(num_blocks=8, block_size_tokens=4, enable_prefix_caching=False)
    assert kv.allocate("a", 9)  # 3 blocks
    assert len(kv.block_table("a")) == 3 and kv.num_free_blocks == 5
    assert kv.allocate("a", 12)  # still 3 blocks
    assert kv.allocate("a", 13)  # a 4th
    assert not kv.allocate("b", 17)  # 5 blocks needed, 4 free: refused without side effects
    assert kv.block_table("b") == [] and kv.num_free_blocks == 4
    kv.free("a")
    assert kv.num_free_blocks == 8 and kv.stats().usage == 0.0


def test_prefix_hit_reuses_blocks_and_counts_refs() -> None:
    kv = KVCacheManager(num_blocks=8, block_size_tokens=4)
    tokens = list(range(1, 11))  # 2 full blocks + 2 tokens
    assert kv.allocate("a", len(tokens), kv.find_prefix(tokens))
    kv.cache_full_blocks("a", tokens, len(tokens))
    hit = kv.find_prefix([*tokens, 99])
    assert hit.num_tokens == 8 and hit.block_ids == tuple(kv.block_table("a")[:2])
    assert kv.allocate("b", 11, hit)
    assert [kv.ref_count(b) for b in hit.block_ids] == [2, 2]
    assert kv.block_table("b")[2] != kv.block_table("a")[2]  # partial blocks are never shared
    kv.free("a")
    kv.free("b")
    assert kv.num_free_blocks == 8
    # freed cached blocks still hit until evicted
    assert kv.find_prefix(tokens).num_tokens == 8


def test_whole_prompt_cached_still_leaves_one_token_to_compute() -> None:
    kv = KVCacheManager(num_blocks=4, block_size_tokens=4)
    tokens = list(range(8))
    kv.allocate("a", 8)
    kv.cache_full_blocks("a", tokens, 8)
    assert kv.find_prefix(tokens).num_tokens == 4


def test_chained_hash_depends_on_parent_and_tokens_are_verified() -> None:
    kv = KVCacheManager(num_blocks=8, block_size_tokens=2)
    kv.allocate("a", 5)
    kv.cache_full_blocks("a", [1, 2, 3, 4, 5], 5)
    assert kv.find_prefix([9, 9, 3, 4, 5]).num_tokens == 0  # same second block, different parent
    assert kv.find_prefix([1, 2, 3, 9, 5]).num_tokens == 2


def test_lru_eviction_of_unreferenced_cached_blocks() -> None:
    kv = KVCacheManager(num_blocks=4, block_size_tokens=2)
    old, new = [1, 2, 3], [7, 8, 9]
    for sid, toks in (("old", old), ("new", new)):
        kv.allocate(sid, 3)
        kv.cache_full_blocks(sid, toks, 3)
        kv.free(sid)
    assert kv.find_prefix(old).num_tokens == 2 and kv.find_prefix(new).num_tokens == 2
    kv.allocate("x", 6)  # takes the two uncached blocks first, then evicts the least recently freed
    assert kv.find_prefix(old).num_tokens == 0
    assert kv.find_prefix(new).num_tokens == 2
    kv.free("x")


def test_disabled_prefix_cache_never_hits() -> None:
    kv = KVCacheManager(num_blocks=4, block_size_tokens=2, enable_prefix_caching=False)
    kv.allocate("a", 4)
    kv.cache_full_blocks("a", [1, 2, 3, 4], 4)
    assert kv.find_prefix([1, 2, 3, 4, 5]).num_tokens == 0


def test_empty_pool_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="kv_cache_memory_mb"):
        KVCacheManager(num_blocks=0, block_size_tokens=16)


def test_blocks_are_reused_only_under_the_key_they_were_cached_with() -> None:
    kv = KVCacheManager(num_blocks=8, block_size_tokens=2)
    tokens = [1, 2, 3, 4, 5]
    assert kv.allocate("a", len(tokens), kv.find_prefix(tokens, "tenant-a\n"))
    kv.cache_full_blocks("a", tokens, len(tokens), "tenant-a\n")
    assert kv.find_prefix(tokens, "tenant-a\n").num_tokens == 4
    assert kv.find_prefix(tokens, "tenant-b\n").num_tokens == 0
    assert kv.find_prefix(tokens).num_tokens == 0  # the shared cache ("") is another key too
    assert kv.find_prefix(tokens, "tenant-a\nsalt").num_tokens == 0


def test_a_hash_collision_cannot_cross_keys() -> None:
    """Even if another key's chain produced the same hash, the stored key is checked on every hit."""
    kv = KVCacheManager(num_blocks=8, block_size_tokens=2)
    tokens = [1, 2, 3]
    assert kv.allocate("a", len(tokens))
    kv.cache_full_blocks("a", tokens, len(tokens), "k1")
    (bid,) = kv.block_table("a")[:1]
    kv._cached[root_hash_of("k2", tokens[:2])] = bid  # forge a colliding entry for key k2
    assert kv.find_prefix(tokens, "k2").num_tokens == 0
    assert kv.find_prefix(tokens, "k1").num_tokens == 2


def root_hash_of(cache_key: str, first_block: list[int]) -> int:
    return chain_hash(root_hash(cache_key), first_block)
