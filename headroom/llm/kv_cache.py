"""Paged KV-cache bookkeeping: a fixed pool of blocks, per-sequence block tables, ref counts, prefix caching.

Only ids and counts live here; the tensors are the runner's. A block holds `block_size_tokens` tokens.
Automatic prefix caching: a *full* block gets a chained hash `hash((parent_hash, token_ids))`; a new
sequence reuses the longest run of cached blocks matching its prompt (tokens verified on every hit).
A freed block with a hash stays cached in the free pool; allocation takes blocks from the free pool's
least-recently-used end, evicting their hash. Freed blocks without a hash go to that end first.

Block hashes are `headroom.llm.block_hash`'s (stable across processes): `cached_blocks` publishes them so a
router can send a request where its prompt's blocks already are.

Isolation: every lookup and registration carries a `cache_key` (the tenant and the request's `cache_salt`,
"" when neither applies). It is mixed into the first block's hash, so the whole chain differs per key, and it
is stored with each cached block and checked on every hit, so a hash collision cannot cross keys either:
a sequence only ever reuses blocks computed for its own key.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from headroom.llm.block_hash import chain_hash, root_hash

__all__ = ["Block", "CachedBlocks", "KVCacheManager", "KVCacheStats", "PrefixHit", "chain_hash", "root_hash"]


@dataclass(slots=True)
class Block:
    """One cache block's bookkeeping."""

    block_id: int  # index into the runner's cache tensors
    ref_count: int = 0  # sequences whose block table holds it
    block_hash: int | None = None  # chained content hash when cached
    token_ids: tuple[int, ...] = ()  # the tokens it holds when cached (verified on a hit)
    cache_key: str = ""  # the isolation key it was cached under (verified on a hit)


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """Cached blocks a new sequence can reuse."""

    block_ids: tuple[int, ...]  # cached blocks, in order, covering the prompt's first tokens
    num_tokens: int  # tokens they cover (a multiple of the block size)


@dataclass(frozen=True, slots=True)
class KVCacheStats:
    """Counters since creation."""

    num_blocks: int  # blocks in the pool
    num_free_blocks: int  # blocks not referenced by any sequence (cached or not)
    prefix_queries_tokens: int  # prompt tokens looked up in the prefix cache
    prefix_hits_tokens: int  # of those, tokens found cached

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by running sequences (vLLM's kv_cache_usage_perc)."""
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0


@dataclass(frozen=True, slots=True)
class CachedBlocks:
    """What the prefix cache holds, for routers (`headroom.llm.prefix_blocks`): hashes, not block ids."""

    version: int  # changes whenever a block is cached or evicted
    hashes: tuple[int, ...]  # block hashes, blocks in use first, then the free pool most recently used first
    truncated: bool  # more blocks were cached than `limit` allowed


class KVCacheManager:
    """Allocates blocks to sequences from a preallocated pool."""

    def __init__(self, num_blocks: int, block_size_tokens: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(
                f"the KV cache has {num_blocks} blocks; raise kv_cache_memory_mb or lower block_size_tokens"
            )
        self.block_size = block_size_tokens
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self._blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[int, int] = {}  # hash -> block id
        self._tables: dict[str, list[int]] = {}
        self._hashes: dict[str, list[int]] = {}  # hashes of a sequence's registered full blocks
        self._queries = 0
        self._hits = 0
        self._version = 0  # bumped on every cached or evicted block

    # --- queries ----------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def stats(self) -> KVCacheStats:
        return KVCacheStats(self.num_blocks, len(self._free), self._queries, self._hits)

    def block_table(self, seq_id: str) -> list[int]:
        """The sequence's blocks in token order (empty when it holds none)."""
        return self._tables.get(seq_id, [])

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_count

    @property
    def version(self) -> int:
        """Changes whenever a block is cached or evicted (publish `cached_blocks` again only then)."""
        return self._version

    def cached_blocks(self, limit: int) -> CachedBlocks:
        """At most `limit` hashes of cached blocks: those in use first (hot), then free ones, most recent first."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        used = [b.block_hash for b in self._blocks if b.ref_count > 0 and b.block_hash is not None]
        free = (self._blocks[bid].block_hash for bid in reversed(self._free))
        hashes = [*used, *(h for h in free if h is not None)]
        return CachedBlocks(self._version, tuple(hashes[:limit]), len(hashes) > limit)

    # --- prefix cache -----------------------------------------------------------------------------------
    def find_prefix(self, token_ids: Sequence[int], cache_key: str = "") -> PrefixHit:
        """Longest run of full blocks cached under `cache_key` matching `token_ids`; at least one token is
        left to compute."""
        if not self.enable_prefix_caching:
            return PrefixHit((), 0)
        bs = self.block_size
        ids: list[int] = []
        parent = root_hash(cache_key)
        for i in range((len(token_ids) - 1) // bs):
            chunk = tuple(token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(parent, chunk)
            bid = self._cached.get(h)
            if bid is None or self._blocks[bid].token_ids != chunk or self._blocks[bid].cache_key != cache_key:
                break
            ids.append(bid)
            parent = h
        return PrefixHit(tuple(ids), len(ids) * bs)

    def record_prefix_lookup(self, num_query_tokens: int, hit: PrefixHit) -> None:
        """Count a lookup that led to admission (a sequence that keeps waiting is counted once, when admitted)."""
        if self.enable_prefix_caching:
            self._queries += num_query_tokens
            self._hits += hit.num_tokens

    def cache_full_blocks(self, seq_id: str, token_ids: Sequence[int], num_computed_tokens: int,
                          cache_key: str = "") -> None:
        """Register the sequence's newly full, computed blocks in the prefix cache under `cache_key`."""
        if not self.enable_prefix_caching or seq_id not in self._tables:
            return
        table = self._tables[seq_id]
        hashes = self._hashes.setdefault(seq_id, [])
        bs = self.block_size
        for i in range(len(hashes), min(num_computed_tokens // bs, len(table))):
            chunk = tuple(token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(hashes[-1] if hashes else root_hash(cache_key), chunk)
            hashes.append(h)
            block = self._blocks[table[i]]
            if block.block_hash is None and h not in self._cached:
                block.block_hash, block.token_ids, block.cache_key = h, chunk, cache_key
                self._cached[h] = block.block_id
                self._version += 1

    # --- allocation -------------------------------------------------------------------------------------
    def can_allocate(self, seq_id: str, num_tokens: int, hit: PrefixHit | None = None) -> bool:
        """Whether `allocate` would succeed."""
        table = self._tables.get(seq_id, [])
        reused = hit.block_ids if hit and not table else ()
        need = self.blocks_needed(num_tokens) - len(table) - len(reused)
        from_free = sum(1 for b in reused if self._blocks[b].ref_count == 0)
        return need + from_free <= len(self._free)

    def allocate(self, seq_id: str, num_tokens: int, hit: PrefixHit | None = None) -> bool:
        """Make the sequence hold blocks for `num_tokens` tokens (reusing `hit` for a new sequence)."""
        if not self.can_allocate(seq_id, num_tokens, hit):
            return False
        table = self._tables.setdefault(seq_id, [])
        if hit and not table:
            for bid in hit.block_ids:
                block = self._blocks[bid]
                if block.ref_count == 0:
                    del self._free[bid]
                block.ref_count += 1
                table.append(bid)
            self._hashes[seq_id] = [self._blocks[b].block_hash or 0 for b in hit.block_ids]
        while len(table) < self.blocks_needed(num_tokens):
            bid, _ = self._free.popitem(last=False)
            block = self._blocks[bid]
            if block.block_hash is not None:
                self._cached.pop(block.block_hash, None)
                block.block_hash, block.token_ids, block.cache_key = None, (), ""
                self._version += 1
            block.ref_count = 1
            table.append(bid)
        return True

    def free(self, seq_id: str) -> None:
        """Drop the sequence's references; unreferenced blocks return to the free pool at once."""
        table = self._tables.pop(seq_id, [])
        self._hashes.pop(seq_id, None)
        for bid in reversed(table):
            block = self._blocks[bid]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[bid] = None
                if block.block_hash is None:
                    self._free.move_to_end(bid, last=False)

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash of unreferenced blocks."""
        for bid in self._free:
            block = self._blocks[bid]
            if block.block_hash is not None:
                self._cached.pop(block.block_hash, None)
                block.block_hash, block.token_ids, block.cache_key = None, (), ""
                self._version += 1
