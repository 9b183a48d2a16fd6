"""Many models, one memory budget: load on demand, evict the least recently used, never the pinned.

`plan_eviction` is the pure policy: from the resident models (size, last use), the pinned set, the requested
model and its size, and the budget, it returns which models to evict (least recently used first) or says the
request cannot fit. `ModelCache` is the mechanism around it: it loads through an injected loader, unloads
through an injected unloader, stamps uses with an injected clock, and measures each swap-in (eviction +
load) so the server can export it.

    cache = ModelCache(load=load_version, unload=unload_version, size_bytes=size_on_disk,
                       budget_bytes=2 << 30, clock=MonotonicClock(), pinned={"digits"})
    model = cache.get("minilm")                   # evicts LRU models if needed, then loads
    cache.stats().swap_ins[-1].duration_s         # measured swap-in time
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from headroom.core.clock import Clock
from headroom.core.errors import Overloaded

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ResidentModel:
    """A model currently in memory, as the policy sees it."""

    name: str  # model name
    size_bytes: int  # memory it holds
    last_used_s: float  # clock time of its latest use


@dataclass(frozen=True, slots=True)
class EvictionDecision:
    """What to do before serving a request."""

    evict: tuple[str, ...]  # models to unload, least recently used first (empty when nothing must go)
    fits: bool  # True when, after the evictions, the requested model fits in the budget
    reason: str  # why it cannot fit (empty when it fits)


def plan_eviction(
    resident: Sequence[ResidentModel],
    pinned: Collection[str],
    request: str,
    request_size_bytes: int,
    budget_bytes: int,
) -> EvictionDecision:
    """The LRU policy (pure): evict unpinned models, oldest use first (ties by name), until `request` fits."""
    if request_size_bytes < 0 or budget_bytes < 0:
        raise ValueError("sizes and the budget must be >= 0 bytes")
    if any(m.name == request for m in resident):
        return EvictionDecision((), True, "")
    if request_size_bytes > budget_bytes:
        return EvictionDecision(
            (), False, f"{request!r} needs {request_size_bytes} bytes, more than the whole budget {budget_bytes}"
        )
    excess = sum(m.size_bytes for m in resident) + request_size_bytes - budget_bytes
    if excess <= 0:
        return EvictionDecision((), True, "")
    evict: list[str] = []
    for model in sorted((m for m in resident if m.name not in pinned), key=lambda m: (m.last_used_s, m.name)):
        if excess <= 0:
            break
        evict.append(model.name)
        excess -= model.size_bytes
    if excess > 0:
        held = sum(m.size_bytes for m in resident if m.name in pinned)
        return EvictionDecision(
            (),
            False,
            f"{request!r} ({request_size_bytes} bytes) does not fit next to the pinned models "
            f"({held} bytes) in a budget of {budget_bytes} bytes; raise the budget or pin fewer models",
        )
    return EvictionDecision(tuple(evict), True, "")


def model_size_bytes(version_dir: Path) -> int:
    """Bytes of a version directory's files: the estimate used before a model is loaded."""
    return sum(p.stat().st_size for p in version_dir.rglob("*") if p.is_file())


@dataclass(frozen=True, slots=True)
class SwapIn:
    """One on-demand load."""

    model: str  # the model brought in
    evicted: tuple[str, ...]  # what was unloaded to make room
    duration_s: float  # clock time from the start of the evictions to the end of the load


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A snapshot of the cache."""

    resident: tuple[ResidentModel, ...]  # models in memory, least recently used first
    resident_bytes: int  # their total size
    hits: int  # get() calls served by a resident model
    swap_ins: tuple[SwapIn, ...]  # every swap-in so far, oldest first


def budget_metrics(registry: CollectorRegistry) -> tuple[Histogram, Counter, Gauge]:
    """The memory-budget families: swap-in seconds{model}, evictions_total{model}, resident bytes."""
    return (
        Histogram("headroom_model_swap_in_seconds", "Evict + load time of an on-demand model load", ["model"],
                  buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
                  registry=registry),
        Counter("headroom_model_evictions", "Models unloaded to fit the memory budget", ["model"], registry=registry),
        Gauge("headroom_model_resident_bytes", "Bytes of models resident under the budget", registry=registry),
    )


class ModelCache(Generic[T]):
    """On-demand loading under a memory budget with LRU eviction; one load at a time (thread-safe)."""

    def __init__(
        self,
        load: Callable[[str], T],
        unload: Callable[[str, T], None],
        size_bytes: Callable[[str], int],
        budget_bytes: int,
        clock: Clock,
        pinned: Collection[str] = (),
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._load, self._unload, self._size = load, unload, size_bytes
        self.budget_bytes, self.clock, self.pinned = budget_bytes, clock, frozenset(pinned)
        self._models: dict[str, T] = {}
        self._resident: dict[str, ResidentModel] = {}
        self._hits = 0
        self._swap_ins: list[SwapIn] = []
        self._lock = threading.Lock()
        self._metrics = budget_metrics(registry) if registry is not None else None

    def get(self, name: str) -> T:
        """The loaded model `name`, loading it (and evicting LRU models) when it is not resident."""
        with self._lock:
            now = self.clock.now_s()
            if name in self._models:
                self._resident[name] = ResidentModel(name, self._resident[name].size_bytes, now)
                self._hits += 1
                return self._models[name]
            size = self._size(name)
            decision = plan_eviction(list(self._resident.values()), self.pinned, name, size, self.budget_bytes)
            if not decision.fits:
                raise Overloaded(f"cannot load model {decision.reason}")
            for victim in decision.evict:
                self._unload(victim, self._models.pop(victim))
                del self._resident[victim]
                if self._metrics is not None:
                    self._metrics[1].labels(victim).inc()
            model = self._load(name)
            done = self.clock.now_s()
            self._models[name] = model
            self._resident[name] = ResidentModel(name, size, done)
            swap = SwapIn(name, decision.evict, done - now)
            self._swap_ins.append(swap)
            if self._metrics is not None:
                self._metrics[0].labels(name).observe(swap.duration_s)
                self._metrics[2].set(sum(m.size_bytes for m in self._resident.values()))
            return model

    def stats(self) -> CacheStats:
        with self._lock:
            resident = tuple(sorted(self._resident.values(), key=lambda m: (m.last_used_s, m.name)))
            return CacheStats(resident, sum(m.size_bytes for m in resident), self._hits, tuple(self._swap_ins))

    def close(self) -> None:
        """Unload everything (shutdown)."""
        with self._lock:
            for name, model in self._models.items():
                self._unload(name, model)
            self._models.clear()
            self._resident.clear()
