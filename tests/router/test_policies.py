"""Routing policies on hand-built snapshots and a small fake-clock queueing simulation."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from headroom.router.bench import simulate_fleet, simulate_prefix_cache
from headroom.router.policies import POLICIES, RoutingConfig, choose, hrw_rank, prefix_key
from headroom.router.snapshot import ReplicaSnapshot, RouterState, peak_ewma_update

SERVICE_S = (0.010, 0.010, 0.010, 0.050)


def _snaps(*loads: int, latency_s: float = 0.01) -> tuple[ReplicaSnapshot, ...]:
    return tuple(ReplicaSnapshot(f"r{i}", outstanding=n, ewma_latency_s=latency_s) for i, n in enumerate(loads))


def test_round_robin_cycles_in_id_order_and_skips_unready() -> None:
    snaps = (*_snaps(0, 0, 0), ReplicaSnapshot("r3", ready=False))
    state, rng, picks = RouterState(), random.Random(0), []
    for _ in range(6):
        d, state = choose("round_robin", snaps, None, state, 0.0, rng)
        picks.append(d.replica_id)
    assert picks == ["r0", "r1", "r2", "r0", "r1", "r2"]


def test_round_robin_stays_fair_when_retries_exclude_a_failing_replica() -> None:
    """r1 answers every attempt with an error; each failed attempt is retried once on the others (the proxy passes
    them without r1). The rotation must not be skewed: every replica gets the same number of attempts, and the two
    healthy ones share the successes evenly (the old index into the filtered list gave 1/16/43 of 60)."""
    snaps = _snaps(0, 0, 0)
    state, rng = RouterState(), random.Random(0)
    attempts, served = Counter[str](), Counter[str]()
    for _ in range(60):
        d, state = choose("round_robin", snaps, None, state, 0.0, rng)
        attempts[d.replica_id or ""] += 1
        if d.replica_id == "r1":  # fails: retry without it
            d, state = choose("round_robin", [s for s in snaps if s.replica_id != "r1"], None, state, 0.0, rng)
            attempts[d.replica_id or ""] += 1
        served[d.replica_id or ""] += 1
    assert attempts == {"r0": 30, "r1": 30, "r2": 30}
    assert served == {"r0": 30, "r2": 30}


def test_round_robin_follows_replicas_joining_and_leaving() -> None:
    state, rng = RouterState(), random.Random(0)
    d, state = choose("round_robin", _snaps(0, 0), None, state, 0.0, rng)
    d, state = choose("round_robin", _snaps(0, 0), None, state, 0.0, rng)
    assert d.replica_id == "r1"
    d, state = choose("round_robin", _snaps(0, 0, 0), None, state, 0.0, rng)  # r2 joined: it is next after r1
    assert d.replica_id == "r2"
    d, state = choose("round_robin", _snaps(0, 0), None, state, 0.0, rng)  # r2 left: wrap around to r0
    assert d.replica_id == "r0"


def test_least_outstanding_picks_the_emptiest_and_breaks_ties_on_latency() -> None:
    snaps = (ReplicaSnapshot("a", outstanding=3), ReplicaSnapshot("b", outstanding=1, ewma_latency_s=0.5),
             ReplicaSnapshot("c", outstanding=1, ewma_latency_s=0.1))
    d, _ = choose("least_outstanding", snaps, None, RouterState(), 0.0, random.Random(1))
    assert d.replica_id == "c"


@pytest.mark.parametrize("policy", ["p2c", "peak_ewma"])
def test_two_choices_never_pick_the_most_loaded_of_three(policy: str) -> None:
    snaps = _snaps(0, 1, 9)
    rng = random.Random(7)
    picks = Counter(choose(policy, snaps, None, RouterState(), 0.0, rng)[0].replica_id for _ in range(300))
    assert picks["r2"] == 0
    assert picks["r0"] > picks["r1"] > 0


def test_peak_ewma_prefers_lower_latency_times_load() -> None:
    # b has more requests in flight but is 10x faster: cost a = 0.1 x 1, b = 0.01 x 3.
    snaps = (ReplicaSnapshot("a", outstanding=0, ewma_latency_s=0.1),
             ReplicaSnapshot("b", outstanding=2, ewma_latency_s=0.01))
    d, _ = choose("peak_ewma", snaps, None, RouterState(), 0.0, random.Random(0))
    assert d.replica_id == "b"
    d, _ = choose("p2c", snaps, None, RouterState(), 0.0, random.Random(0))
    assert d.replica_id == "a"


def test_no_routable_replica_returns_none() -> None:
    snaps = (ReplicaSnapshot("a", ready=False),)
    for policy in POLICIES:
        d, _ = choose(policy, snaps, "k", RouterState(), 0.0, random.Random(0))
        assert d.replica_id is None and d.reason == "none"


def test_ejected_replicas_are_skipped_unless_all_are_ejected() -> None:
    snaps = (ReplicaSnapshot("a", ejected_until_s=10.0), ReplicaSnapshot("b"))
    rng = random.Random(0)
    assert {choose("p2c", snaps, None, RouterState(), 5.0, rng)[0].replica_id for _ in range(20)} == {"b"}
    assert choose("p2c", snaps[:1], None, RouterState(), 5.0, rng)[0].replica_id == "a"  # panic routing
    both = {choose("p2c", snaps, None, RouterState(), 10.0, rng)[0].replica_id for _ in range(50)}
    assert both == {"a", "b"}  # the ejection expired


def test_unknown_policy_is_rejected_with_the_valid_names() -> None:
    with pytest.raises(ValueError, match="round_robin"):
        choose("random", _snaps(0), None, RouterState(), 0.0, random.Random(0))


def test_affinity_is_sticky_then_spills_when_the_preferred_replica_is_overloaded() -> None:
    snaps = _snaps(0, 0, 0, 0)
    rng = random.Random(0)
    first, _ = choose("affinity", snaps, "user-42", RouterState(), 0.0, rng)
    assert first.reason == "affinity"
    for _ in range(10):
        assert choose("affinity", snaps, "user-42", RouterState(), 0.0, rng)[0].replica_id == first.replica_id
    loaded = tuple(s if s.replica_id != first.replica_id else ReplicaSnapshot(s.replica_id, outstanding=8)
                   for s in snaps)
    spill, _ = choose("affinity", loaded, "user-42", RouterState(), 0.0, rng)
    assert spill.replica_id != first.replica_id and spill.reason == "affinity_spill"
    # the spill target is the key's second choice, so it too is stable
    assert spill.replica_id == hrw_rank("user-42", snaps)[1].replica_id


def test_affinity_spreads_keys_and_falls_back_without_a_key() -> None:
    snaps = _snaps(0, 0, 0, 0)
    owners = Counter(choose("affinity", snaps, f"user-{i}", RouterState(), 0.0, random.Random(0))[0].replica_id
                     for i in range(400))
    assert len(owners) == 4 and min(owners.values()) > 60
    d, _ = choose("affinity", snaps, None, RouterState(), 0.0, random.Random(0))
    assert d.reason == "fallback"


def test_removing_a_replica_only_moves_its_own_keys() -> None:
    snaps = _snaps(0, 0, 0, 0)
    before = {k: hrw_rank(k, snaps)[0].replica_id for k in (f"k{i}" for i in range(200))}
    after = {k: hrw_rank(k, snaps[:3])[0].replica_id for k in before}
    moved = [k for k in before if before[k] != after[k]]
    assert moved and all(before[k] == "r3" for k in moved)


def test_prefix_routing_groups_prompts_by_their_first_characters() -> None:
    snaps = _snaps(0, 0, 0)
    cfg = RoutingConfig(prefix_len_chars=16)
    system = "You are a helpful assistant. "
    picks = {choose("prefix", snaps, system + f"question {i}", RouterState(), 0.0, random.Random(i), cfg)[0]
             .replica_id for i in range(30)}
    assert len(picks) == 1
    assert prefix_key([1, 2, 3, 4], 2) == "1,2" and prefix_key("abcdef", 3) == "abc"


def test_peak_ewma_jumps_to_peaks_and_decays_slowly() -> None:
    assert peak_ewma_update(0.0, 0.05, 1.0) == 0.05
    assert peak_ewma_update(0.01, 0.5, 0.0) == 0.5  # peak-sensitive
    decayed = peak_ewma_update(0.5, 0.01, 10.0)  # one decay time: weight e^-1 on the old value
    assert 0.01 < decayed < 0.5 and decayed == pytest.approx(0.5 * 0.3679 + 0.01 * 0.6321, rel=1e-3)


@pytest.mark.parametrize("policy", ["p2c", "peak_ewma", "least_outstanding"])
def test_a_five_times_slower_replica_gets_under_ten_percent(policy: str) -> None:
    """4 single-server FIFO replicas, one 5x slower; Poisson arrivals at ~55% of the fleet's capacity."""
    assert simulate_fleet(policy, SERVICE_S, 175.0, 4000, seed=3).slow_share < 0.10


def test_round_robin_gives_the_slow_replica_its_full_quarter_and_a_runaway_queue() -> None:
    rr = simulate_fleet("round_robin", SERVICE_S, 175.0, 4000, seed=3)
    ewma = simulate_fleet("peak_ewma", SERVICE_S, 175.0, 4000, seed=3)
    assert rr.slow_share == pytest.approx(0.25, abs=0.01)
    assert rr.p99_ms > 10 * ewma.p99_ms  # 25% of 175/s is above the slow replica's 20/s


def test_prefix_routing_raises_the_prefix_cache_hit_rate() -> None:
    prefix = simulate_prefix_cache("prefix", 4, 8, 64, 3000, seed=1)
    assert prefix > simulate_prefix_cache("p2c", 4, 8, 64, 3000, seed=1) + 0.2
