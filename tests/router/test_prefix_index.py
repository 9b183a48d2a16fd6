"""The router's record of replicas' prefix caches: published blocks, recently routed blocks, leading matches."""

from __future__ import annotations

from pathlib import Path

from headroom.llm.prefix_blocks import ModelBlocks
from headroom.router.prefix_index import PrefixIndex, PrefixIndexConfig
from headroom.router.prompt_hasher import ModelTokenizer, PromptHasher
from headroom.router.request_keys import PrefixKey
from headroom.router.snapshot import ReplicaSnapshot

KEY = PrefixKey("m", (11, 12, 13, 14))


def _published(*hashes: int, model: str = "m") -> dict[str, ModelBlocks]:
    return {model: ModelBlocks(16, 1, frozenset(hashes))}


def test_matches_count_leading_published_blocks_only() -> None:
    index = PrefixIndex(PrefixIndexConfig(routed_ttl_s=0.0))
    index.update("a", _published(11, 12, 14))  # 13 evicted: 14 no longer usable as a prefix
    index.update("b", _published(11, 12, 13, 14, model="other"))  # another model's blocks never count
    assert index.match_blocks("a", KEY, 0.0) == 2
    assert index.match_blocks("b", KEY, 0.0) == 0 and index.match_blocks("c", KEY, 0.0) == 0
    index.update("a", _published(11))  # the next poll replaces the last: evictions show
    assert index.match_blocks("a", KEY, 0.0) == 1
    assert index.published_blocks() == {"a": 1, "b": 4}


def test_routed_blocks_count_until_their_ttl_and_stay_bounded() -> None:
    index = PrefixIndex(PrefixIndexConfig(routed_ttl_s=5.0, max_routed_blocks=6))
    index.note_routed("a", KEY, now_s=100.0)
    index.note_routed("a", KEY, now_s=100.0)
    assert index.routed == {"without_match": 1, "with_match": 1}
    assert index.match_blocks("a", KEY, 104.9) == 4
    assert index.match_blocks("a", KEY, 105.1) == 0
    index.note_routed("a", KEY, now_s=200.0)
    index.note_routed("a", PrefixKey("m", (1, 2, 3, 4)), now_s=201.0)  # 8 live blocks noted, 6 kept: oldest go
    assert index.match_blocks("a", KEY, 201.0) == 0  # 11, 12 dropped
    assert index.match_blocks("a", PrefixKey("m", (1, 2, 3, 4)), 201.0) == 4
    assert index.cached_blocks("a", "m") == 6
    index.note_routed("a", PrefixKey("m", (5,)), now_s=300.0)  # the others expired at 206: dropped
    assert index.cached_blocks("a", "m") == 1


def test_a_zero_ttl_records_nothing() -> None:
    index = PrefixIndex(PrefixIndexConfig(routed_ttl_s=0.0))
    index.note_routed("a", KEY, now_s=100.0)
    assert index.match_blocks("a", KEY, 50.0) == 0 and index.routed == {"without_match": 1}


def test_stamp_sets_each_snapshot_and_retain_forgets_departed_replicas() -> None:
    index = PrefixIndex(PrefixIndexConfig(routed_ttl_s=0.0))
    index.update("a", _published(11, 12))
    index.update("b", _published(11))
    snaps = [ReplicaSnapshot("a"), ReplicaSnapshot("b"), ReplicaSnapshot("c")]
    assert [s.prefix_match_blocks for s in index.stamp(snaps, KEY, 0.0)] == [2, 1, 0]
    assert [s.prefix_match_blocks for s in index.stamp(snaps, None, 0.0)] == [0, 0, 0]
    assert [s.cached_blocks for s in index.stamp(snaps, KEY, 0.0)] == [2, 1, 0]  # what each publishes
    index.retain(["b"])
    assert [s.prefix_match_blocks for s in index.stamp(snaps, KEY, 0.0)] == [0, 1, 0]


def test_the_placement_key_covers_the_first_blocks() -> None:
    assert KEY.placement_key(blocks=2) == f"m:{12:016x}"  # the chained hash of block 2 covers blocks 1 and 2
    assert KEY.placement_key(blocks=9) == f"m:{14:016x}"  # a shorter prompt: its last block
    assert PrefixKey("m", ()).placement_key() is None


def test_only_the_cache_aware_policy_gets_an_index() -> None:
    assert PrefixIndex.for_policy("p2c", PrefixIndexConfig(), None) is None
    assert PrefixIndex.for_policy("cache_aware", PrefixIndexConfig(), None) is not None


async def test_unreadable_tokenizers_leave_requests_routed_by_load(tmp_path: Path) -> None:
    (tmp_path / "llm").mkdir()
    (tmp_path / "llm" / "config.yaml").write_text("backend: llm\nparameters: {gguf: /nonexistent/x.gguf}\n")
    index = PrefixIndex(PrefixIndexConfig(tokenizers_from=str(tmp_path)))
    await index.load_hasher()  # logged, not raised: the health-check loop calling it must go on
    index.tenant = "anonymous"
    assert index.hasher is None and await index.key(b'{"prompt": "hello"}') is None


class _WordTokenizer:
    """Policy-test stand-in for a tokenizer: one token id per word."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [len(w) for w in text.split()]


def test_requests_hash_under_the_forwarded_tenant_only_when_replicas_run_them_as_it() -> None:
    index = PrefixIndex(PrefixIndexConfig())
    assert index.cache_tenant("tenant-a") is None  # no replica answered yet: no key, routed by load
    index.tenant = "anonymous"  # replicas without keys, not trusting the router's header
    assert index.cache_tenant("tenant-a") == "anonymous" and index.cache_tenant("") == "anonymous"
    index.tenant_header = True  # --trust-tenant-header: each request runs as the tenant the router forwards
    assert index.cache_tenant("tenant-a") == "tenant-a"
    assert index.cache_tenant("") == "anonymous"  # nothing forwarded: the replica's own tenant
    assert index.cache_tenant("not a tenant!") == "anonymous"  # the replica's gateway ignores an invalid name


async def test_keys_of_two_tenants_differ_and_decisions_are_counted() -> None:
    hasher = PromptHasher({"m": ModelTokenizer(_WordTokenizer(), 2)})  # type: ignore[arg-type]
    index = PrefixIndex(PrefixIndexConfig(routed_ttl_s=5.0), hasher)
    index.tenant, index.tenant_header = "anonymous", True
    body = b'{"model": "m", "prompt": "a bb ccc dddd eeeee"}'
    key_a, key_b = await index.key(body, "tenant-a"), await index.key(body, "tenant-b")
    assert key_a is not None and key_b is not None and len(key_a.block_hashes) == 2
    assert set(key_a.block_hashes).isdisjoint(key_b.block_hashes)  # tenant isolation: never the same blocks
    index.note_decision("cache_place", "r1", key_a, 10.0)  # nothing cached yet: 0 of 4 tokens matched
    index.note_decision("cache_hit", "r1", key_a, 11.0)  # routed there a second ago: all 4 matched
    index.note_decision("fallback", "r2", None, 11.0)  # no key: routed by load
    index.note_decision("none", None, None, 11.0)  # no replica at all
    assert index.decisions == {"cache_place": 1, "cache_hit": 1, "unhashed": 1, "none": 1}
    assert (index.matched_tokens, index.prompt_tokens) == (4, 8)
    assert index.match_blocks("r1", key_b, 11.0) == 0  # tenant B's key does not match A's blocks
