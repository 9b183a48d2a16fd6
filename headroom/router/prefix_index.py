"""Cache-aware routing, replica side: which KV blocks each replica holds, as the router knows it.

Two sources per replica and model:

* published: what the replica's engine reports at `GET /v2/llm/prefix_blocks` (`headroom.llm.prefix_blocks`),
  polled with the router's readiness checks (every `check_interval_s`); an answer replaces the previous one,
  so evictions show up at the next poll;
* routed: the blocks of requests the router itself sent there in the last `routed_ttl_s` (the replica caches
  them once their prefill runs, before the next poll can say so; SGLang's router and Dynamo's approximate mode
  keep the same kind of record). Bounded to `max_routed_blocks` per replica, oldest dropped first.

`key` hashes a request body into its prompt's blocks (`headroom.router.prompt_hasher`, off the event loop;
the tokenizers load on the first poll, from `tokenizers_from`, a model repository) under the tenant the replica
will run it as: the tenant the router's gateway authenticated and forwards in `x-headroom-tenant`, when the
replicas say they run requests as that tenant (`tenant_header` in their answer: `--trust-tenant-header`), else
the one tenant they run every request as. `stamp` turns one request's `PrefixKey` into each snapshot's
`prefix_match_blocks`: the leading blocks found in either source; the pure policy (`headroom.router.policies`,
``cache_aware``) does the rest. `decisions` counts each routing decision by its reason (`cache_hit`,
`cache_spill`, `cache_place`, `fallback`: by load; `unhashed`: no key, by load), `matched_tokens` and
`prompt_tokens` the hashed prompt tokens found cached on the chosen replica and in all (the router's
`/metrics`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from headroom.gateway.auth import TENANT_RE
from headroom.llm.prefix_blocks import PATH, ModelBlocks, parse
from headroom.router.prompt_hasher import PromptHasher, load_prompt_hasher
from headroom.router.request_keys import PrefixKey
from headroom.router.snapshot import ReplicaSnapshot
from headroom.router.upstream import Upstream

log = logging.getLogger("headroom.router")


@dataclass(frozen=True, slots=True)
class PrefixIndexConfig:
    """Knobs of the router's record of replicas' prefix caches."""

    tokenizers_from: str = ""  # model repository with the LLM tokenizers ("" = none; `headroom route`: its own)
    routed_ttl_s: float = 10.0  # a routed request's blocks count as cached there this long
    max_routed_blocks: int = 8192  # per replica (oldest forgotten first)

    def __post_init__(self) -> None:
        if self.routed_ttl_s < 0 or self.max_routed_blocks < 0:
            raise ValueError("routed_ttl_s and max_routed_blocks must be >= 0")


@dataclass(slots=True)
class _Replica:
    published: dict[str, ModelBlocks] = field(default_factory=dict)  # model -> what it last reported
    routed: OrderedDict[tuple[str, int], float] = field(default_factory=OrderedDict)  # (model, hash) -> until_s


class PrefixIndex:
    """Per replica: published and recently routed block hashes; and the prompt hasher."""

    def __init__(self, config: PrefixIndexConfig | None = None, hasher: PromptHasher | None = None) -> None:
        self.config = config or PrefixIndexConfig()
        self.hasher = hasher  # None until loaded from `config.tokenizers_from` (or never: routed by load)
        self._load_tried = hasher is not None or not self.config.tokenizers_from
        self._replicas: dict[str, _Replica] = {}
        self.tenant: str | None = None  # the tenant the replicas cache requests under (from their answers)
        self.tenant_header = False  # the replicas run a request as the tenant the router forwards
        self.polls_failed = 0  # answers that were missing or malformed
        self.routed = Counter[str]()  # requests sent where some of their blocks were cached ("with_match") or not
        self.decisions = Counter[str]()  # routing decisions by reason (policies.RouteDecision.reason, "unhashed")
        self.matched_tokens = 0  # prompt tokens of routed requests cached on the replica chosen (as far as known)
        self.prompt_tokens = 0  # prompt tokens (in full blocks) of routed requests that were hashed

    @classmethod
    def for_policy(cls, policy: str, config: PrefixIndexConfig, hasher: PromptHasher | None) -> PrefixIndex | None:
        """An index when `policy` is ``cache_aware`` (the only policy that reads one), else None."""
        return cls(config, hasher) if policy == "cache_aware" else None

    def cache_tenant(self, forwarded: str = "") -> str | None:
        """The tenant a replica runs a request as, whose router forwards `forwarded` in x-headroom-tenant (as
        the replica's gateway decides: a valid tenant name when it trusts the header, else its own tenant)."""
        if self.tenant_header and forwarded and TENANT_RE.match(forwarded):
            return forwarded
        return self.tenant

    async def key(self, body: bytes, forwarded_tenant: str = "") -> PrefixKey | None:
        """The request's prompt as block hashes (tokenized in a worker thread), under the tenant the replica
        runs it as (`cache_tenant`); None without a hasher or before a replica said which tenant (or with
        per-key tenants)."""
        hasher, tenant = self.hasher, self.cache_tenant(forwarded_tenant)
        return None if hasher is None or tenant is None else await asyncio.to_thread(hasher.key, body, tenant)

    def note_decision(self, reason: str, replica_id: str | None, key: PrefixKey | None, now_s: float) -> None:
        """Count one routing decision (`reason` from the policy; "unhashed" when the request had no key) and,
        when it was routed with a key, its matched and hashed prompt tokens; then `note_routed`."""
        self.decisions["unhashed" if key is None and replica_id is not None else reason] += 1
        if key is None or replica_id is None:
            return
        model = self.hasher.models.get(key.model) if self.hasher is not None else None
        block_tokens = model.block_size_tokens if model is not None else 0
        self.matched_tokens += self.match_blocks(replica_id, key, now_s) * block_tokens
        self.prompt_tokens += len(key.block_hashes) * block_tokens
        self.note_routed(replica_id, key, now_s)

    async def load_hasher(self) -> None:
        """Load the tokenizers of `config.tokenizers_from` once (a failure is logged: requests route by load)."""
        if self._load_tried:
            return
        self._load_tried = True
        try:
            self.hasher = await asyncio.to_thread(load_prompt_hasher, Path(self.config.tokenizers_from))
        except Exception as exc:  # whatever the files hold, the health-check loop that called this goes on
            log.error("cache_aware: cannot load tokenizers from %s (%s); routing by load", self.config.tokenizers_from,
                      exc)
            return
        log.info("cache_aware: hashing prompts of %s", ", ".join(self.hasher.models) or "no LLM model")

    def update(self, replica_id: str, models: dict[str, ModelBlocks]) -> None:
        """Replace what `replica_id` publishes."""
        self._replicas.setdefault(replica_id, _Replica()).published = models

    def retain(self, replica_ids: Iterable[str]) -> None:
        """Forget replicas that left the fleet."""
        keep = set(replica_ids)
        for rid in [r for r in self._replicas if r not in keep]:
            del self._replicas[rid]

    def note_routed(self, replica_id: str, key: PrefixKey, now_s: float) -> None:
        """The router sent a request with `key` to `replica_id`."""
        self.routed["with_match" if self.match_blocks(replica_id, key, now_s) else "without_match"] += 1
        cfg = self.config
        if cfg.routed_ttl_s <= 0:
            return
        routed = self._replicas.setdefault(replica_id, _Replica()).routed
        while routed and next(iter(routed.values())) < now_s:  # oldest first: drop what has expired
            routed.popitem(last=False)
        for h in key.block_hashes:
            routed[(key.model, h)] = now_s + cfg.routed_ttl_s
            routed.move_to_end((key.model, h))
        while len(routed) > cfg.max_routed_blocks:
            routed.popitem(last=False)

    def match_blocks(self, replica_id: str, key: PrefixKey, now_s: float) -> int:
        """Leading blocks of `key` the replica holds (published, or routed there within the TTL)."""
        r = self._replicas.get(replica_id)
        if r is None:
            return 0
        published = r.published.get(key.model)
        hashes = published.hashes if published is not None else frozenset()
        n = 0
        for h in key.block_hashes:
            if h not in hashes and r.routed.get((key.model, h), -1.0) < now_s:
                break
            n += 1
        return n

    def stamp(self, snapshots: Sequence[ReplicaSnapshot], key: PrefixKey | None,
              now_s: float) -> list[ReplicaSnapshot]:
        """The snapshots with `prefix_match_blocks` set for this request (0 everywhere without a key)."""
        if key is None or not key.block_hashes:
            return list(snapshots)
        return [dataclasses.replace(s, prefix_match_blocks=self.match_blocks(s.replica_id, key, now_s),
                                    cached_blocks=self.cached_blocks(s.replica_id, key.model))
                for s in snapshots]

    def published_blocks(self) -> dict[str, int]:
        """Per replica: the blocks (all models) it published at the last poll."""
        return {rid: sum(len(m.hashes) for m in r.published.values()) for rid, r in self._replicas.items()}

    def cached_blocks(self, replica_id: str, model: str) -> int:
        """About how many blocks of `model` the replica holds: published, plus recently routed (any model)."""
        r = self._replicas.get(replica_id)
        if r is None:
            return 0
        published = r.published.get(model)
        return (len(published.hashes) if published is not None else 0) + len(r.routed)

    async def poll(self, client: httpx.AsyncClient, replicas: Sequence[Upstream], timeout_s: float) -> None:
        """Fetch every replica's published blocks concurrently (a failed fetch keeps the last answer) and forget
        replicas no longer in `replicas`."""
        await self.load_hasher()
        self.retain(u.replica_id for u in replicas)

        async def one(rid: str, url: str) -> None:
            try:
                r = await client.get(url + PATH, timeout=timeout_s)
                r.raise_for_status()
                published = parse(r.content)
                self.update(rid, dict(published.models))
                self.tenant, self.tenant_header = published.tenant, published.tenant_header
            except (httpx.HTTPError, ValueError) as exc:
                self.polls_failed += 1
                log.debug("prefix blocks of %s: %s", rid, exc)

        await asyncio.gather(*(one(u.replica_id, u.base_url) for u in replicas))
