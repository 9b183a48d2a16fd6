"""Routing policies: pure functions of (replica snapshots, request key, state, now, rng) -> (decision, state).

One entry point, `choose(policy, snapshots, request_key, state, now_s, rng, config)`:

* ``round_robin``         the next routable replica in id order after the one used last (a cursor over replica
                          ids, not an index into the candidate list: a retry that excludes the failed replica
                          takes the next one after it and the rotation goes on from there, as Envoy's round
                          robin skips excluded hosts; indexing the filtered list skewed the split 1/16/43).
* ``least_outstanding``   fewest requests in flight (ties: lower peak-EWMA latency, then random).
* ``p2c``                 power of two choices (Envoy `LEAST_REQUEST`, `choice_count` 2): sample two distinct
                          replicas, keep the one with fewer outstanding requests (ties: lower latency EWMA).
* ``peak_ewma``           P2C on Finagle's cost = peak-EWMA latency x (outstanding + 1); a replica with no
                          latency sample yet but requests in flight costs a large penalty.
* ``affinity``            soft session affinity: rendezvous (highest-random-weight) hashing of the key (the
                          OpenAI `user` field or a session header) ranks replicas; the first one that is not
                          overloaded wins; no key, or every replica overloaded, falls back to P2C.
* ``prefix``              like ``affinity`` on the first `prefix_len_chars` of the prompt, so requests that
                          share a prompt prefix reach the replica whose prefix cache already holds it.
* ``cache_aware``         the replica holding the longest run of this prompt's leading KV blocks (each
                          snapshot's `prefix_match_blocks`, from the blocks replicas publish, see
                          `headroom.router.prefix_index`); among equal matches the request key's rendezvous
                          home first (without a key: lower load, then latency, then at random), so a copy made
                          by a spill does not split the prefix's traffic and double its cache footprint; an
                          overloaded replica is passed over for the next-longest match; no match
                          anywhere (or every matching replica overloaded): placed on the replica holding the
                          fewest blocks (`cached_blocks`), ties to the request key's rendezvous home (the key
                          is the hash of the prompt's first blocks, `PrefixKey.placement_key`), so new prefixes
                          fill the emptiest cache; every replica overloaded, or no key: peak-EWMA P2C.

"Overloaded" (bounded-load consistent hashing, Mirrokni et al. 2018, c = 1.25): the replica holds at least
its `capacity`, or more than max(`affinity_min_slack`, c x the mean load of routable replicas).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

from headroom.router.snapshot import ReplicaSnapshot, RouterState, routable

POLICIES = ("round_robin", "least_outstanding", "p2c", "peak_ewma", "affinity", "prefix", "cache_aware")

#: Finagle PeakEwma `Penalty` analogue: cost of a replica with requests in flight but no latency sample yet.
_NO_SAMPLE_PENALTY_S = 1e3


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    """Knobs shared by the policies."""

    affinity_load_factor: float = 1.25  # bounded loads: overloaded above c x mean load (Mirrokni, c=1.25)
    affinity_min_slack: int = 2  # never overloaded below this many requests (low-load stickiness)
    prefix_len_chars: int = 256  # prefix routing hashes this many leading prompt characters

    def __post_init__(self) -> None:
        if self.affinity_load_factor < 1.0:
            raise ValueError(f"affinity_load_factor must be >= 1.0, got {self.affinity_load_factor}")
        if self.affinity_min_slack < 1 or self.prefix_len_chars < 1:
            raise ValueError("affinity_min_slack and prefix_len_chars must be >= 1")


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Where to send a request, and why."""

    replica_id: str | None  # chosen replica; None when no replica is routable (answer 503 not_ready)
    reason: str  # "policy", "affinity", "affinity_spill", "cache_hit", "cache_spill", "cache_place", "fallback", "none"


def prefix_key(prompt: str | Sequence[int], prefix_len: int) -> str:
    """The routing key for prefix-aware routing: the first `prefix_len` characters (or token ids)."""
    if isinstance(prompt, str):
        return prompt[:prefix_len]
    return ",".join(str(t) for t in prompt[:prefix_len])


def _hrw_score(key: str, replica_id: str) -> int:
    digest = hashlib.blake2b(f"{key}\x00{replica_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def hrw_rank(key: str, snapshots: Sequence[ReplicaSnapshot]) -> list[ReplicaSnapshot]:
    """Rendezvous-hash ranking: stable per key, and removing a replica only moves the keys it held."""
    return sorted(snapshots, key=lambda s: _hrw_score(key, s.replica_id), reverse=True)


def _latency_key(s: ReplicaSnapshot) -> float:
    return s.ewma_latency_s


def _peak_ewma_cost(s: ReplicaSnapshot) -> float:
    if s.ewma_latency_s <= 0.0:
        return _NO_SAMPLE_PENALTY_S + s.load() if s.load() > 0 else 0.0
    return s.ewma_latency_s * (s.load() + 1)


def _p2c(cands: tuple[ReplicaSnapshot, ...], rng: random.Random, ewma_cost: bool) -> ReplicaSnapshot:
    if len(cands) == 1:
        return cands[0]
    a, b = rng.sample(cands, 2)
    if ewma_cost:
        ka: tuple[float, ...] = (_peak_ewma_cost(a), float(a.load()))
        kb: tuple[float, ...] = (_peak_ewma_cost(b), float(b.load()))
    else:
        ka, kb = (float(a.load()), a.ewma_latency_s), (float(b.load()), b.ewma_latency_s)
    return a if ka <= kb else b


def _overloaded(s: ReplicaSnapshot, mean_load: float, cfg: RoutingConfig) -> bool:
    return s.overloaded() or s.load() > max(cfg.affinity_min_slack, cfg.affinity_load_factor * mean_load)


def _cache_aware(cands: tuple[ReplicaSnapshot, ...], key: str | None, rng: random.Random,
                 cfg: RoutingConfig) -> RouteDecision | None:
    mean_load = sum(s.load() for s in cands) / len(cands)
    shuffled = list(cands)
    rng.shuffle(shuffled)  # the random last tie-break (sorted() is stable)
    if key:  # equal matches: the prefix's rendezvous home first, so a spilled copy does not become a second owner
        home = {s.replica_id: i for i, s in enumerate(hrw_rank(key, cands))}
        ranked = sorted(shuffled, key=lambda s: (-s.prefix_match_blocks, home[s.replica_id]))
    else:
        ranked = sorted(shuffled, key=lambda s: (-s.prefix_match_blocks, s.load(), s.ewma_latency_s))
    for rank, s in enumerate(ranked):
        if s.prefix_match_blocks == 0:
            break
        if not _overloaded(s, mean_load, cfg):
            return RouteDecision(s.replica_id, "cache_hit" if rank == 0 else "cache_spill")
    return None  # nobody (not overloaded) holds it: `_place` it


def _place(cands: tuple[ReplicaSnapshot, ...], key: str, cfg: RoutingConfig) -> RouteDecision | None:
    """A prefix nobody holds goes to the replica holding the fewest blocks (SGLang's router: the smallest tree),
    ties to the key's rendezvous home; overloaded replicas are skipped."""
    mean_load = sum(s.load() for s in cands) / len(cands)
    home = {s.replica_id: i for i, s in enumerate(hrw_rank(key, cands))}
    for s in sorted(cands, key=lambda s: (s.cached_blocks, home[s.replica_id])):
        if not _overloaded(s, mean_load, cfg):
            return RouteDecision(s.replica_id, "cache_place")
    return None


def choose(policy: str, snapshots: Sequence[ReplicaSnapshot], request_key: str | None, state: RouterState,
           now_s: float, rng: random.Random,
           config: RoutingConfig | None = None) -> tuple[RouteDecision, RouterState]:
    """Pick a replica for one request. `request_key` is the session key (affinity), the prompt (prefix) or the
    placement key of a prompt's blocks (cache_aware, which reads each snapshot's `prefix_match_blocks` first)."""
    cfg = config or RoutingConfig()
    if policy not in POLICIES:
        raise ValueError(f"unknown routing policy {policy!r}; choose one of {', '.join(POLICIES)}")
    cands = routable(tuple(snapshots), now_s)
    if not cands:
        return RouteDecision(None, "none"), state
    if policy == "round_robin":
        after = [s for s in cands if s.replica_id > state.rr_last_id]  # `cands` is sorted by id
        pick_id = (after or cands)[0].replica_id
        return RouteDecision(pick_id, "policy"), RouterState(rr_last_id=pick_id)
    if policy == "least_outstanding":
        best = min(s.load() for s in cands)
        tied = [s for s in cands if s.load() == best]
        low = min(_latency_key(s) for s in tied)
        pick = rng.choice([s for s in tied if _latency_key(s) == low])
        return RouteDecision(pick.replica_id, "policy"), state
    if policy in ("p2c", "peak_ewma"):
        return RouteDecision(_p2c(cands, rng, policy == "peak_ewma").replica_id, "policy"), state
    if policy == "cache_aware":
        hit = _cache_aware(cands, request_key, rng, cfg) or (_place(cands, request_key, cfg) if request_key else None)
        if hit is not None:
            return hit, state
    # affinity / prefix / a cache_aware miss
    if not request_key:
        return RouteDecision(_p2c(cands, rng, ewma_cost=True).replica_id, "fallback"), state
    key = request_key[: cfg.prefix_len_chars] if policy == "prefix" else request_key
    mean_load = sum(s.load() for s in cands) / len(cands)
    ranked = hrw_rank(key, cands)
    for rank, s in enumerate(ranked):
        if not _overloaded(s, mean_load, cfg):
            return RouteDecision(s.replica_id, "affinity" if rank == 0 else "affinity_spill"), state
    return RouteDecision(_p2c(cands, rng, ewma_cost=True).replica_id, "fallback"), state
