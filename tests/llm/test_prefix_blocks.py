"""The /v2/llm/prefix_blocks document: what a replica renders, the router parses back; malformed is refused."""

from __future__ import annotations

import orjson
import pytest

from headroom.llm.kv_cache import CachedBlocks
from headroom.llm.prefix_blocks import MAX_HASHES_PER_MODEL, parse, render


def test_render_and_parse_round_trip_full_64_bit_hashes() -> None:
    hashes = (0, 1, 2**63 + 5, 2**64 - 1)
    body = render({"smollm2": (16, CachedBlocks(7, hashes, truncated=True))}, "anonymous")
    assert b'"ffffffffffffffff"' in body  # hex strings: JSON numbers above 2**53 lose precision in many clients
    published = parse(body)
    m = published.models["smollm2"]
    assert (m.block_size_tokens, m.version, m.hashes, m.truncated) == (16, 7, frozenset(hashes), True)
    assert published.tenant == "anonymous"
    assert parse(render({}, None)).models == {} and parse(render({}, None)).tenant is None
    assert not published.tenant_header and parse(render({}, "anonymous", tenant_header=True)).tenant_header
    assert not parse(b'{"tenant": "anonymous", "models": {}}').tenant_header  # an older replica: no header


@pytest.mark.parametrize("doc", [
    b"not json", b"[]", b'{"models": []}', b'{"models": {"m": 1}}', b'{"tenant": 5, "models": {}}',
    b'{"tenant": "t", "tenant_header": "yes", "models": {}}',
    b'{"models": {"m": {"block_size_tokens": 0, "version": 1, "hashes": []}}}',
    b'{"models": {"m": {"block_size_tokens": 16, "hashes": []}}}',
    b'{"models": {"m": {"block_size_tokens": 16, "version": 1, "hashes": ["xyz"]}}}',
    b'{"models": {"m": {"block_size_tokens": 16, "version": 1, "hashes": [12]}}}',
    b'{"models": {"m": {"block_size_tokens": 16, "version": 1, "hashes": ["-000000000000001"]}}}',
])
def test_malformed_documents_are_refused_with_a_reason(doc: bytes) -> None:
    with pytest.raises(ValueError, match="prefix blocks"):
        parse(doc)


def test_an_oversized_list_is_refused() -> None:
    doc = {"models": {"m": {"block_size_tokens": 16, "version": 1, "hashes": ["0" * 16] * (MAX_HASHES_PER_MODEL + 1)}}}
    with pytest.raises(ValueError, match="hashes"):
        parse(orjson.dumps(doc))
