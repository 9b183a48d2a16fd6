"""The prefix cache's block hashes: stable across processes, so a router can compute them from a request.

A full block of `block_size_tokens` token ids hashes to ``blake2b-64(parent || ids)``, chained from the
previous block's hash; the first block's parent is `root_hash(cache_key)` (the tenant / `cache_salt`
isolation key, "" for the shared cache). Python's `hash()` would not do: `hash(None)` and `hash(str)` differ
from one process to the next (PYTHONHASHSEED, addresses), and the router must reproduce the engine's hashes
from the prompt's token ids (vLLM picked sha256-based block hashes for the same reason: its KV events are
consumed by other processes). Pure stdlib, no torch: the router imports it.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence

_DIGEST_BYTES = 8


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=_DIGEST_BYTES).digest(), "little")


def prefix_cache_key(tenant: str, cache_salt: str | None) -> str:
    """The engine's prefix-cache isolation key ("" = the shared cache, when there is neither).

    Tenant names cannot contain a newline, so no (tenant, salt) pair can spell another's key."""
    return f"{tenant}\n{cache_salt or ''}" if tenant or cache_salt else ""


def root_hash(cache_key: str) -> int:
    """The parent hash of a sequence's first block under isolation key `cache_key`."""
    return _digest(b"headroom-kv-root\x00" + cache_key.encode("utf-8", "surrogatepass"))


def chain_hash(parent: int, token_ids: Sequence[int]) -> int:
    """The content hash of a full block given its parent's hash (token ids as little-endian int64)."""
    ids = array("q", token_ids)
    if sys.byteorder == "big":  # pragma: no cover - the hashes are the same on every host
        ids.byteswap()
    return _digest(parent.to_bytes(_DIGEST_BYTES, "little") + ids.tobytes())


def prefix_block_hashes(token_ids: Sequence[int], block_size_tokens: int, cache_key: str = "") -> list[int]:
    """The chained hashes of the blocks a prompt can reuse from the cache, in order: every full block except
    that at least one token is left to compute (as the engine's `find_prefix` looks them up)."""
    if block_size_tokens < 1:
        raise ValueError(f"block_size_tokens must be >= 1, got {block_size_tokens}")
    out: list[int] = []
    parent = root_hash(cache_key)
    for i in range((len(token_ids) - 1) // block_size_tokens):
        parent = chain_hash(parent, token_ids[i * block_size_tokens : (i + 1) * block_size_tokens])
        out.append(parent)
    return out
