"""`GET /v2/llm/prefix_blocks`: the prefix-cache blocks a replica holds, per LLM model, for cache-aware routers.

The answer is the engine's own block hashes (`headroom.llm.block_hash`), bounded per model by the engine's
`published_blocks_limit` (blocks in use first, then the free pool most recently used first)::

    {"tenant": "anonymous", "tenant_header": false,
     "models": {"smollm2": {"block_size_tokens": 16, "version": 41, "truncated": false,
                            "hashes": ["9f2c0a...", ...]}}}

`tenant` is the tenant every request on this replica runs as, when there is one: the replica's gateway scopes
the prefix cache by tenant (`headroom.llm.block_hash.prefix_cache_key`), so a router must hash under the same
one. With API keys on the replica, each key has its own tenant, which the router cannot know: `tenant` is
null and cache-aware routing falls back to load. `tenant_header` is true when the replica runs each request as
the tenant a router names in `x-headroom-tenant` (`--trust-tenant-header`, no keys of its own,
`headroom.gateway.forwarded_tenant`): a router that authenticates clients then hashes each request under the
tenant it forwards, and `tenant` is the one requests without the header run as.

Hashes are 16 hex digits: JSON numbers above 2**53 lose precision in many clients. `version` changes whenever a
block is cached or evicted. A full list rather than a Bloom filter: the list is bounded by the KV pool (~700
blocks for smollm2's default 512 MB, ~13 KB of JSON), exact (no false positive sends a request to a replica
that lacks the prefix), and the router polls it with its health checks (`headroom.router.prefix_index`).
The same module parses the document on the router's side, so both ends share one contract.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from headroom.llm.kv_cache import CachedBlocks

PATH = "/v2/llm/prefix_blocks"
#: a document with more hashes than this, per model, is refused (a broken or hostile replica)
MAX_HASHES_PER_MODEL = 1 << 16


@dataclass(frozen=True, slots=True)
class ModelBlocks:
    """One model's published prefix-cache blocks."""

    block_size_tokens: int  # tokens per block (the router hashes requests with the same size)
    version: int  # changes whenever a block is cached or evicted
    hashes: frozenset[int]  # the block hashes it holds
    truncated: bool = False  # it held more than it published


@dataclass(frozen=True, slots=True)
class PublishedBlocks:
    """One replica's answer."""

    tenant: str | None  # the tenant all its requests run as (None: per API key, unknown to a router)
    models: Mapping[str, ModelBlocks]  # served model name -> its blocks
    tenant_header: bool = False  # requests run as the tenant a router forwards in x-headroom-tenant


def render(models: Mapping[str, tuple[int, CachedBlocks]], tenant: str | None, tenant_header: bool = False) -> bytes:
    """The JSON document for {model: (block_size_tokens, cached blocks)}."""
    doc = {name: {"block_size_tokens": size, "version": cb.version, "truncated": cb.truncated,
                  "hashes": [f"{h:016x}" for h in cb.hashes]} for name, (size, cb) in models.items()}
    return orjson.dumps({"tenant": tenant, "tenant_header": tenant_header, "models": doc})


def parse(body: bytes) -> PublishedBlocks:
    """A `PATH` answer; ValueError says what is malformed."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"prefix blocks: not JSON ({exc})") from None
    models = doc.get("models") if isinstance(doc, dict) else None
    tenant = doc.get("tenant") if isinstance(doc, dict) else None
    tenant_header = doc.get("tenant_header", False) if isinstance(doc, dict) else False
    if not isinstance(models, dict) or not (tenant is None or isinstance(tenant, str)) or not isinstance(
            tenant_header, bool):
        raise ValueError("prefix blocks: expected an object with a 'models' object, a 'tenant' string or null and "
                         "an optional boolean 'tenant_header'")
    out: dict[str, ModelBlocks] = {}
    for name, m in models.items():
        if not isinstance(m, dict):
            raise ValueError(f"prefix blocks: model {name!r} is not an object")
        size, version, hashes = m.get("block_size_tokens"), m.get("version"), m.get("hashes")
        if not isinstance(size, int) or size < 1 or not isinstance(version, int) or not isinstance(hashes, list):
            raise ValueError(f"prefix blocks: model {name!r} needs block_size_tokens >= 1, version and hashes")
        if len(hashes) > MAX_HASHES_PER_MODEL:
            raise ValueError(f"prefix blocks: model {name!r} lists {len(hashes)} hashes (> {MAX_HASHES_PER_MODEL})")
        parsed = frozenset(_hash(str(name), h) for h in hashes)
        out[str(name)] = ModelBlocks(size, version, parsed, bool(m.get("truncated", False)))
    return PublishedBlocks(tenant, out, tenant_header)


def _hash(model: str, text: object) -> int:
    raw = b""
    if isinstance(text, str) and len(text) == 16:
        with contextlib.suppress(ValueError):
            raw = bytes.fromhex(text)
    if len(raw) != 8:
        raise ValueError(f"prefix blocks: model {model!r} has a hash that is not 16 hex digits: {text!r:.40}")
    return int.from_bytes(raw, "big")


def prefix_blocks_route(source: Callable[[], Mapping[str, tuple[int, CachedBlocks]]], tenant: str | None,
                        tenant_header: bool = False) -> Route:
    """`GET PATH`, answering `render(source(), tenant, tenant_header)` (models still loading are left out)."""

    async def endpoint(request: Request) -> Response:
        return Response(render(source(), tenant, tenant_header), media_type="application/json")

    return Route(PATH, endpoint, methods=["GET"])
