"""The cache_aware policy on hand-built snapshots: longest cached prefix, load as tie-breaker and guard."""

from __future__ import annotations

import random
from collections import Counter

from headroom.router.bench import simulate_prefix_cache
from headroom.router.policies import choose
from headroom.router.snapshot import ReplicaSnapshot, RouterState


def _snap(rid: str, match: int, load: int = 0, latency_s: float = 0.01, **kw: object) -> ReplicaSnapshot:
    return ReplicaSnapshot(rid, outstanding=load, ewma_latency_s=latency_s, prefix_match_blocks=match, **kw)  # type: ignore[arg-type]


def _pick(*snaps: ReplicaSnapshot, seed: int = 0, key: str | None = None) -> tuple[str | None, str]:
    d, _ = choose("cache_aware", snaps, key, RouterState(), 0.0, random.Random(seed))
    return d.replica_id, d.reason


def test_the_longest_cached_prefix_wins() -> None:
    for seed in range(20):
        assert _pick(_snap("r0", 2), _snap("r1", 7), _snap("r2", 0), seed=seed) == ("r1", "cache_hit")


def test_equal_matches_go_to_the_lower_load_then_the_lower_latency() -> None:
    assert _pick(_snap("r0", 5, load=2), _snap("r1", 5, load=1)) == ("r1", "cache_hit")
    assert _pick(_snap("r0", 5, latency_s=0.2), _snap("r1", 5, latency_s=0.1)) == ("r1", "cache_hit")


def test_with_a_key_equal_matches_go_to_the_prefix_home_whatever_the_load() -> None:
    """Two replicas hold the prefix (one got it in a spill): its rendezvous home keeps it, unless overloaded;
    choosing by load would split the traffic and keep two copies of every hot prefix."""
    home = _pick(_snap("r0", 0), _snap("r1", 0), key="m:beef")[0]
    other = "r1" if home == "r0" else "r0"
    both = (_snap(home, 4, load=2), _snap(other, 4, load=0))
    assert _pick(*both, key="m:beef") == (home, "cache_hit")
    assert _pick(_snap(home, 4, load=9), _snap(other, 4, load=0), key="m:beef") == (other, "cache_spill")
    assert _pick(_snap(home, 3), _snap(other, 4, load=1), key="m:beef") == (other, "cache_hit")  # longer wins


def test_exact_ties_are_broken_at_random() -> None:
    picks = Counter(_pick(_snap("r0", 3), _snap("r1", 3), seed=seed)[0] for seed in range(200))
    assert picks["r0"] > 50 and picks["r1"] > 50


def test_an_overloaded_holder_is_passed_over_for_the_next_longest_match() -> None:
    # r0 holds the most but has far more than 1.25 x the mean load in flight: r1's shorter match wins
    assert _pick(_snap("r0", 9, load=12), _snap("r1", 4, load=1), _snap("r2", 0, load=1)) == ("r1", "cache_spill")
    # at low load the guard does not fire (min slack 2): the holder keeps its requests
    assert _pick(_snap("r0", 9, load=2), _snap("r1", 0, load=0)) == ("r0", "cache_hit")
    # a replica at its capacity is overloaded whatever the mean
    assert _pick(_snap("r0", 9, load=3, capacity=3), _snap("r1", 1, load=3, capacity=8)) == ("r1", "cache_spill")


def test_a_prefix_nobody_holds_goes_to_the_emptiest_cache_then_its_key_home() -> None:
    idle = (_snap("r0", 0), _snap("r1", 0), _snap("r2", 0))
    placed = {_pick(*idle, seed=seed, key="m:00ab")[0] for seed in range(10)}
    assert len(placed) == 1 and _pick(*idle, key="m:00ab")[1] == "cache_place"  # the same key: the same replica
    spread = Counter(_pick(*idle, key=f"m:{k:04x}")[0] for k in range(300))
    assert min(spread.values()) > 60  # equal caches: distinct prefixes spread (rendezvous hashing)
    sizes = (_snap("r0", 0, cached_blocks=40), _snap("r1", 0, cached_blocks=10), _snap("r2", 0, cached_blocks=20))
    assert _pick(*sizes, key="m:00ab") == ("r1", "cache_place")  # SGLang's smallest tree
    busy = (_snap("r0", 0, cached_blocks=40), _snap("r1", 0, load=20, cached_blocks=10),
            _snap("r2", 0, cached_blocks=20))
    assert _pick(*busy, key="m:00ab") == ("r2", "cache_place")  # bounded load still applies
    # a holder that is overloaded: the prefix is placed among the others
    held = (_snap("r0", 5, load=20, cached_blocks=5), _snap("r1", 0, cached_blocks=30), _snap("r2", 0))
    assert _pick(*held, key="m:00ab") == ("r2", "cache_place")


def test_no_match_or_every_holder_overloaded_falls_back_to_load() -> None:
    rid, reason = _pick(_snap("r0", 0, load=5), _snap("r1", 0, load=0))
    assert reason == "fallback"
    rid, reason = _pick(_snap("r0", 9, load=20), _snap("r1", 0, load=0), _snap("r2", 0, load=0))
    assert reason == "fallback" and rid in ("r1", "r2")  # P2C between the idle ones and the busy one


def test_unready_and_ejected_replicas_are_never_chosen_for_their_cache() -> None:
    assert _pick(_snap("r0", 9, ready=False), _snap("r1", 1)) == ("r1", "cache_hit")
    assert _pick(_snap("r0", 9, ejected_until_s=5.0), _snap("r1", 1)) == ("r1", "cache_hit")
    assert _pick(_snap("r0", 9, ready=False)) == (None, "none")


def test_on_the_fake_clock_cache_aware_keeps_prefixes_where_they_are_cached() -> None:
    """4 replicas x an LRU of 8 prompt prefixes, 64 Zipf prefixes, light load: routing on what each replica holds
    hits as often as rendezvous hashing of the prefix and far more than P2C."""
    cache_aware = simulate_prefix_cache("cache_aware", 4, 8, 64, 3000, seed=1)
    assert cache_aware > simulate_prefix_cache("p2c", 4, 8, 64, 3000, seed=1) + 0.2
    assert cache_aware > simulate_prefix_cache("prefix", 4, 8, 64, 3000, seed=1) - 0.03
