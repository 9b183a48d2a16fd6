"""Model lifecycle behind the V2 repository extension: index, load (or reload), unload.

A reload loads the new versions completely (read, build, warmup) before swapping them in; if that fails the
old versions keep serving and the error is returned. Unload stops routing at once, lets admitted requests
finish, then releases the model.
"""

from __future__ import annotations

import asyncio
import logging

from headroom.core.errors import HeadroomError, InvalidRequest, ModelNotFound
from headroom.models.repository import ModelRepository
from headroom.server.dataplane import DataPlane, ServedVersion

log = logging.getLogger("headroom.models")


class ModelManager:
    """Loads and unloads tensor models from one repository into one data plane (one operation at a time)."""

    def __init__(self, repository: ModelRepository, dataplane: DataPlane) -> None:
        self._repo = repository
        self._dp = dataplane
        self._lock = asyncio.Lock()
        self._failed: dict[str, str] = {}

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
            else:
                rows.append({"name": entry.name, "version": "", "state": "UNAVAILABLE",
                             "reason": self._failed.get(entry.name, "unloaded")})
        return rows

    async def load(self, name: str) -> list[str]:
        """Load (or reload) `name`'s selected versions; returns the versions now serving."""
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
            new = [ServedVersion(name=i.name, version=i.version, config=i.config, model=i.model,
                                 cold_start=i.cold_start) for i in loaded]
            for served in await self._dp.replace(name, new):
                await asyncio.to_thread(served.model.unload)
            self._failed.pop(name, None)
            log.info("loaded %s versions %s", name, [i.version for i in loaded])
            return self._dp.loaded_versions(name)

    async def unload(self, name: str) -> None:
        async with self._lock:
            for served in await self._dp.remove(name):
                await asyncio.to_thread(served.model.unload)
            log.info("unloaded %s", name)
