"""Block hashes: the same in every process, equal to what the KV manager caches, and what it publishes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from headroom.llm.block_hash import chain_hash, prefix_block_hashes, prefix_cache_key, root_hash
from headroom.llm.kv_cache import KVCacheManager

_PRINT = ("from headroom.llm.block_hash import prefix_block_hashes as p; "
          "print(p(list(range(100, 141)), 8, '\\nsalt'))")


def test_hashes_are_the_same_in_processes_with_different_hash_seeds() -> None:
    """Python's hash() of None and of str changes per process; the router's hashes must equal the replica's."""
    outs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outs.add(subprocess.run([sys.executable, "-c", _PRINT], env=env, capture_output=True, text=True,
                                check=True, timeout=120).stdout)
    assert outs == {f"{prefix_block_hashes(list(range(100, 141)), 8, prefix_cache_key('', 'salt'))}\n"}


def test_chain_and_keys_separate_what_they_should() -> None:
    a = prefix_block_hashes(list(range(33)), 8)
    assert len(a) == 4  # 33 tokens: 4 full blocks, the last token always left to compute
    assert len(prefix_block_hashes(list(range(32)), 8)) == 3  # 32: the 4th block would leave nothing to compute
    assert prefix_block_hashes([*range(16), 99, *range(17, 33)], 8)[:2] == a[:2]  # a change only moves later blocks
    assert prefix_block_hashes(list(range(33)), 8, "k") != a  # an isolation key changes the whole chain
    assert chain_hash(root_hash(""), [1, 2]) != chain_hash(root_hash(""), [2, 1])
    assert root_hash("") != root_hash("\n") and prefix_cache_key("", None) == ""
    with pytest.raises(ValueError, match="block_size_tokens"):
        prefix_block_hashes([1, 2], 0)


def test_the_kv_manager_caches_and_publishes_exactly_these_hashes() -> None:
    kv = KVCacheManager(num_blocks=8, block_size_tokens=4)
    tokens = list(range(1, 15))  # 3 full blocks + 2
    v0 = kv.version
    assert kv.allocate("a", len(tokens), kv.find_prefix(tokens, "t\ns"))
    kv.cache_full_blocks("a", tokens, len(tokens), "t\ns")
    published = kv.cached_blocks(limit=100)
    assert published.version > v0 and not published.truncated
    assert set(published.hashes) == set(prefix_block_hashes([*tokens, 0], 4, "t\ns"))  # the 3 full blocks
    assert kv.cached_blocks(limit=2).truncated and len(kv.cached_blocks(limit=2).hashes) == 2


def test_published_blocks_follow_eviction_and_recency() -> None:
    kv = KVCacheManager(num_blocks=4, block_size_tokens=2)
    first, second = [1, 2, 3], [7, 8, 9]
    for seq, toks in (("a", first), ("b", second)):
        assert kv.allocate(seq, len(toks))
        kv.cache_full_blocks(seq, toks, len(toks))
    kv.free("a")  # a's block is free but still cached; b's is in use: published first
    assert kv.cached_blocks(10).hashes == (*prefix_block_hashes(second, 2), *prefix_block_hashes(first, 2))
    before = kv.version
    kv.free("b")
    assert kv.version == before  # freeing keeps the blocks cached
    assert kv.allocate("c", 8)  # takes the whole pool: every cached block is evicted
    assert kv.cached_blocks(10).hashes == () and kv.version > before
    with pytest.raises(ValueError, match="limit"):
        kv.cached_blocks(-1)
