"""Model lifecycle behind the V2 repository extension: index, load (or reload), unload; on-demand residency.

A reload loads the new versions completely (read, build, warmup) before swapping them in; if that fails the
old versions keep serving and the error is returned. Unload stops routing at once, lets admitted requests
finish, then releases the model.

With a memory budget (`serve --model-memory-budget-mb`), `enable_budget` hands a `Residency` the loader and
unloader below: models load on demand and the least recently used idle ones are evicted (see
headroom/lifecycle/residency.py). The repository API keeps working: an explicit load of a model that is not
resident goes through the budget; an unload frees its share (the next request brings it back).
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry

from headroom.core.clock import Clock
from headroom.core.errors import HeadroomError, InvalidRequest, ModelNotFound
from headroom.lifecycle.memory_budget import model_size_bytes
from headroom.lifecycle.residency import Residency, ResidencyConfig
from headroom.models.repository import LoadedModel, ModelEntry, ModelRepository, RepositoryIndex
from headroom.server.dataplane import DataPlane
from headroom.server.served import ServedVersion

log = logging.getLogger("headroom.models")


def served_version(loaded: LoadedModel) -> ServedVersion:
    """What the data plane serves for a loaded version."""
    return ServedVersion(name=loaded.name, version=loaded.version, config=loaded.config, model=loaded.model,
                         cold_start=loaded.cold_start, version_dir=loaded.version_dir,
                         warmup_batches=loaded.warmup_batches)


def entry_size_bytes(entry: ModelEntry) -> int:
    """The memory-budget estimate of a model: bytes on disk of the versions it serves."""
    return sum(model_size_bytes(entry.version_dir(v)) for v in entry.versions)


class ModelManager:
    """Loads and unloads tensor models from one repository into one data plane (one operation at a time)."""

    def __init__(self, repository: ModelRepository, dataplane: DataPlane) -> None:
        self._repo = repository
        self._dp = dataplane
        self._lock = asyncio.Lock()
        self._failed: dict[str, str] = {}
        self._entries: dict[str, ModelEntry] = {}
        self.residency: Residency | None = None

    def enable_budget(self, index: RepositoryIndex, cfg: ResidencyConfig, clock: Clock,
                      registry: CollectorRegistry | None = None) -> Residency:
        """Serve `index`'s tensor models under a memory budget (call before the server starts loading)."""
        self._entries = {e.name: e for e in index.models}
        sizes = {e.name: entry_size_bytes(e) for e in index.models}
        pinned = {e.name for e in index.models if e.config.pinned}
        self.residency = Residency(sizes, pinned, cfg, self._load_entry, self._unload_entry, clock, registry,
                                   configs={e.name: e.config for e in index.models})
        return self.residency

    async def _load_entry(self, name: str) -> None:
        try:
            loaded = await self._repo.load_async(RepositoryIndex((self._entries[name],), ()))
        except ValueError as exc:
            self._failed[name] = str(exc)
            raise HeadroomError(f"loading model '{name}' on demand failed: {exc}") from None
        self._failed.pop(name, None)
        for item in loaded:
            self._dp.add(served_version(item))

    async def _unload_entry(self, name: str) -> None:
        for served in await self._dp.remove(name):
            await asyncio.to_thread(served.model.unload)

    def index(self) -> list[dict[str, str]]:
        """Every model directory with its state: READY (with version), UNAVAILABLE (with the reason)."""
        rows: list[dict[str, str]] = []
        try:
            entries = self._repo.scan()
        except ValueError as exc:
            raise HeadroomError(f"the model repository cannot be scanned: {exc}") from None
        for entry in (*entries.models, *entries.llm_models):
            loaded = self._dp.loaded_versions(entry.name)
            if loaded:
                rows.extend({"name": entry.name, "version": v, "state": "READY", "reason": ""} for v in loaded)
            elif entry.config.backend == "llm":
                rows.append({"name": entry.name, "version": "", "state": "READY", "reason": "LLM engine"})
            elif self.residency is not None and self.residency.manages(entry.name) and entry.name not in self._failed:
                rows.append({"name": entry.name, "version": "", "state": "UNAVAILABLE",
                             "reason": "not resident (memory budget): the next request loads it"})
            else:
                rows.append({"name": entry.name, "version": "", "state": "UNAVAILABLE",
                             "reason": self._failed.get(entry.name, "unloaded")})
        return rows

    async def load(self, name: str) -> list[str]:
        """Load (or reload) `name`'s selected versions; returns the versions now serving."""
        residency = self.residency
        if residency is not None and residency.manages(name) and not residency.is_resident(name):
            async with residency.use(name):  # through the budget: may evict idle models
                return self._dp.loaded_versions(name)
        async with self._lock:
            try:
                index = self._repo.scan([name])
            except ValueError as exc:
                raise (ModelNotFound if "no model directory" in str(exc) else InvalidRequest)(str(exc)) from None
            if not index.models:
                raise InvalidRequest(f"model '{name}' is served by the LLM engine and cannot be reloaded here")
            try:
                loaded = await self._repo.load_async(index)
            except ValueError as exc:
                self._failed[name] = str(exc)
                raise InvalidRequest(f"loading '{name}' failed; the previous version keeps serving: {exc}") from None
            for served in await self._dp.replace(name, [served_version(i) for i in loaded]):
                await asyncio.to_thread(served.model.unload)
            self._failed.pop(name, None)
            if residency is not None and name in self._entries:
                self._entries[name] = index.models[0]
                residency.adopt(name)
            log.info("loaded %s versions %s", name, [i.version for i in loaded])
            return self._dp.loaded_versions(name)

    async def unload(self, name: str) -> None:
        async with self._lock:
            for served in await self._dp.remove(name):
                await asyncio.to_thread(served.model.unload)
            if self.residency is not None:
                self.residency.forget(name)
            log.info("unloaded %s", name)
