"""On-demand model residency for the running server: many models, one memory budget (time multiplexing).

The asyncio mechanism around the pure LRU policy (`memory_budget.plan_eviction`):

* `use(name)` is what the data plane wraps a request in. A resident model is stamped (LRU) and counted as
  busy until the request finishes. A known but unloaded model is loaded first: the request waits, and
  concurrent requests for it share the one load.
* Swap-ins run one at a time. A model with requests in flight (or waiting for it) is never evicted: when only
  busy models stand in the way, the swap-in waits for one to go idle (bounded by `wait_timeout_s`, then 503).
  Pinned models are never evicted; a model that cannot fit next to them is refused (503) at once.
* Each swap-in is timed (evictions + load) and exported with the evictions and the resident bytes.

    residency = Residency(sizes, pinned={"digits"}, budget_bytes=64 << 20, load=..., unload=..., clock=clock)
    await residency.start()                      # loads the pinned models, then others while they fit
    async with residency.use("minilm"):          # loads minilm (evicting LRU idle models) if needed
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge

from headroom.core.clock import Clock
from headroom.core.errors import NotReady, Overloaded
from headroom.lifecycle.memory_budget import ResidentModel, SwapIn, budget_metrics, plan_eviction
from headroom.models.base import Arrays, Model
from headroom.models.config import ModelConfig

log = logging.getLogger("headroom.lifecycle.residency")


@dataclass(frozen=True, slots=True)
class ResidencyConfig:
    """How the server multiplexes models in memory."""

    budget_bytes: int  # total size of resident models (sum of their artifact bytes on disk)
    wait_timeout_s: float = 30.0  # how long a swap-in waits for busy models to go idle before 503

    def __post_init__(self) -> None:
        if self.budget_bytes <= 0 or self.wait_timeout_s <= 0:
            raise ValueError("the memory budget and the wait timeout must be > 0")


def initial_residents(sizes: Mapping[str, int], pinned: Collection[str], budget_bytes: int) -> tuple[str, ...]:
    """Models to load at start (pure): every pinned one, then the others in the given order while they fit.

    Raises ValueError when the pinned models alone exceed the budget.
    """
    unknown = set(pinned) - set(sizes)
    if unknown:
        raise ValueError(f"pinned models {sorted(unknown)} are not in the repository")
    chosen = [n for n in sizes if n in pinned]
    used = sum(sizes[n] for n in chosen)
    if used > budget_bytes:
        raise ValueError(
            f"the pinned models {chosen} need {used / 2**20:.2f} MiB, more than the memory budget "
            f"{budget_bytes / 2**20:.2f} MiB; raise --model-memory-budget-mb or unpin some (config.yaml `pinned`)"
        )
    for name, size in sizes.items():
        if name not in pinned and used + size <= budget_bytes:
            chosen.append(name)
            used += size
    return tuple(chosen)


class Residency:
    """Keeps the models the traffic needs in memory under a byte budget (one event loop; not thread-safe)."""

    def __init__(
        self,
        sizes: Mapping[str, int],
        pinned: Collection[str],
        cfg: ResidencyConfig,
        load: Callable[[str], Awaitable[None]],
        unload: Callable[[str], Awaitable[None]],
        clock: Clock,
        registry: CollectorRegistry | None = None,
        configs: Mapping[str, ModelConfig] | None = None,
    ) -> None:
        self.sizes, self.pinned, self.cfg = dict(sizes), frozenset(pinned), cfg
        self.configs = dict(configs or {})  # the managed models' configs (metadata while not resident)
        self._load, self._unload, self._clock = load, unload, clock
        self._resident: dict[str, ResidentModel] = {}
        self._users: dict[str, int] = {}  # requests inside use(name): waiting for the model or running on it
        self._loading: dict[str, asyncio.Future[None]] = {}
        self._swap_lock = asyncio.Lock()
        self._idle = asyncio.Event()  # set whenever a model's last user leaves
        self._swap_ins: list[SwapIn] = []
        self._started = False  # the initial set is loaded
        self._metrics = budget_metrics(registry) if registry is not None else None
        self._budget_gauge: Gauge | None = None
        if registry is not None:
            self._budget_gauge = Gauge("headroom_model_memory_budget_bytes", "The --model-memory-budget-mb budget",
                                       registry=registry)
            self._budget_gauge.set(cfg.budget_bytes)
        initial_residents(self.sizes, self.pinned, cfg.budget_bytes)  # validates the pinned set

    # -- queries -----------------------------------------------------------------------------------------
    def manages(self, name: str) -> bool:
        return name in self.sizes

    def is_resident(self, name: str) -> bool:
        return name in self._resident

    def not_resident_config(self, name: str) -> ModelConfig | None:
        """The config of a managed model that is not in memory now (None when resident or unknown)."""
        return None if name in self._resident else self.configs.get(name)

    def resident(self) -> tuple[ResidentModel, ...]:
        """Resident models, least recently used first."""
        return tuple(sorted(self._resident.values(), key=lambda m: (m.last_used_s, m.name)))

    def resident_bytes(self) -> int:
        return sum(m.size_bytes for m in self._resident.values())

    def swap_ins(self) -> tuple[SwapIn, ...]:
        """Every on-demand load so far, oldest first."""
        return tuple(self._swap_ins)

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> tuple[str, ...]:
        """Load the initial set (pinned first); returns the names loaded."""
        names = initial_residents(self.sizes, self.pinned, self.cfg.budget_bytes)
        for name in names:
            await self._load(name)
            self._admit(name)
        self._started = True
        return names

    def ready(self) -> bool:
        """True once the initial set is loaded (evictions later do not make the server unready)."""
        return self._started

    def forget(self, name: str) -> None:
        """The model was unloaded from outside (repository API): it is no longer resident."""
        self._resident.pop(name, None)
        self._export()

    def adopt(self, name: str) -> None:
        """The model was loaded from outside (repository API): count it as resident."""
        self._admit(name)

    async def close(self) -> None:
        """Wait for a swap-in in progress to end (shutdown); the data plane stops the models themselves."""
        async with self._swap_lock:
            pass

    # -- the request path ----------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def use(self, name: str) -> AsyncIterator[None]:
        """Hold `name` resident for the duration of the block, loading it first when needed."""
        self._users[name] = self._users.get(name, 0) + 1
        try:
            while name not in self._resident:
                pending = self._loading.get(name)
                if pending is None:
                    pending = asyncio.ensure_future(self._swap_in(name))
                    self._loading[name] = pending
                    pending.add_done_callback(self._loaded_callback(name))
                await asyncio.shield(pending)
            self._resident[name] = ResidentModel(name, self.sizes[name], self._clock.now_s())
            yield
        finally:
            self._users[name] -= 1
            if self._users[name] == 0:
                del self._users[name]
                self._idle.set()

    def _loaded_callback(self, name: str) -> Callable[[asyncio.Future[None]], None]:
        def done(future: asyncio.Future[None]) -> None:
            self._loading.pop(name, None)
            if not future.cancelled():
                future.exception()  # retrieved: waiters re-raise it; nobody waiting must not log a warning

        return done

    async def _swap_in(self, name: str) -> None:
        async with self._swap_lock:
            if name in self._resident:
                return
            start = self._clock.now_s()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.cfg.wait_timeout_s  # the wait is the loop's business, not the clock's
            while True:
                busy = {n for n in self._resident if self._users.get(n, 0) > 0}
                decision = plan_eviction(list(self._resident.values()), self.pinned | busy, name, self.sizes[name],
                                         self.cfg.budget_bytes)
                if decision.fits:
                    break
                alone = plan_eviction(list(self._resident.values()), self.pinned, name, self.sizes[name],
                                      self.cfg.budget_bytes)
                if not alone.fits:
                    raise Overloaded(f"cannot load model {alone.reason}", retry_after_s=1.0)
                left_s = deadline - loop.time()
                if left_s <= 0:
                    raise Overloaded(f"cannot load model {name!r}: the models holding the memory budget "
                                     f"({sorted(busy)}) stayed busy for {self.cfg.wait_timeout_s:.0f}s; retry later "
                                     "or raise --model-memory-budget-mb", retry_after_s=1.0)
                self._idle.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._idle.wait(), timeout=left_s)
            for victim in decision.evict:
                del self._resident[victim]  # before awaiting: new requests for it now queue for a reload
                await self._unload(victim)
                if self._metrics is not None:
                    self._metrics[1].labels(victim).inc()
                log.info("evicted %s to make room for %s", victim, name)
            await self._load(name)
            self._admit(name)
            swap = SwapIn(name, decision.evict, self._clock.now_s() - start)
            self._swap_ins.append(swap)
            if self._metrics is not None:
                self._metrics[0].labels(name).observe(swap.duration_s)
            log.info("swapped in %s in %.3fs (evicted %s)", name, swap.duration_s, list(decision.evict) or "none")

    def _admit(self, name: str) -> None:
        self._resident[name] = ResidentModel(name, self.sizes[name], self._clock.now_s())
        self._export()

    def _export(self) -> None:
        if self._metrics is not None:
            self._metrics[2].set(self.resident_bytes())


class NotResidentModel(Model):
    """Stands for a managed model that is not in memory: its config answers metadata; it never predicts."""

    def predict(self, batch: Arrays) -> Arrays:
        raise NotReady(f"model '{self.config.name}' is not resident; an inference request loads it",
                       retry_after_s=1.0)
