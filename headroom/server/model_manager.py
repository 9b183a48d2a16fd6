"""Model lifecycle behind the V2 repository extension: index, load (or reload), unload; on-demand residency.

A reload loads the new versions completely (read, build, warmup) before swapping them in; if that fails the
old versions keep serving and the error is returned. Unload stops routing at once, lets admitted requests
finish, then releases the model.

With a memory budget (`serve --model-memory-budget-mb`), `enable_budget` hands a `Residency` the loader and
unloader below: models load on demand and the least recently used idle ones are evicted (see
headroom/lifecycle/residency.py). The repository API keeps working: an explicit load of a model that is not
resident goes through the budget; an unload frees its share (the next request brings it back).

Model control follows Triton (`serve --model-control-mode`): `none` (the default) and `poll` refuse load and
unload with Triton's error; `explicit` allows them. A load may carry Triton's `config` override, applied to
that load (headroom.protocol.triton_config) or refused naming the key. An LLM (`backend: llm`) reloads from its
config.yaml (a new engine loads while the old one serves, then the old one drains) and unloads after its
in-flight requests finish (server/generative.py); it takes no config override. An LLM directory new to the
server (added after start) is loaded and served through `add_llm` (server/llm_front.py), in poll mode by the
poller and in explicit mode by a load.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping

from prometheus_client import CollectorRegistry

from headroom.core.clock import Clock
from headroom.core.errors import HeadroomError, InvalidRequest, ModelNotFound, NotReady
from headroom.lifecycle.memory_budget import model_size_bytes
from headroom.lifecycle.residency import Residency, ResidencyConfig
from headroom.models.config import ModelConfig
from headroom.models.repository import LoadedModel, ModelEntry, ModelRepository, RepositoryIndex
from headroom.protocol.triton_config import apply_config_override
from headroom.server.dataplane import DataPlane
from headroom.server.served import ServedVersion

log = logging.getLogger("headroom.models")

MODEL_CONTROL_MODES = ("none", "explicit", "poll")
#: Triton's error (UNAVAILABLE) for a load/unload outside explicit mode, in every mode but explicit.
CONTROL_REFUSED = "explicit model load / unload is not allowed if polling is enabled"


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

    def __init__(self, repository: ModelRepository, dataplane: DataPlane, control_mode: str = "none",
                 served: tuple[str, ...] | None = None,
                 add_llm: Callable[[ModelConfig], Awaitable[None]] | None = None) -> None:
        if control_mode not in MODEL_CONTROL_MODES:
            raise ValueError(f"model control mode {control_mode!r} is not one of {', '.join(MODEL_CONTROL_MODES)}")
        self._repo = repository
        self._dp = dataplane
        self.control_mode = control_mode
        self._served = served  # `serve --model` names: the only directories this server lists and loads
        self._add_llm = add_llm  # serves an LLM new to this server (server/llm_front.LLMFleet.add)
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

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model this server serves with its state: READY (with version), UNAVAILABLE (with the
        reason); `ready_only` keeps the READY rows (Triton's `{"ready": true}`)."""
        rows = self._index()
        return [r for r in rows if r["state"] == "READY"] if ready_only else rows

    def _index(self) -> list[dict[str, str]]:
        rows: list[dict[str, str]] = []
        try:
            entries = self._repo.scan(self._served)
        except ValueError as exc:
            raise HeadroomError(f"the model repository cannot be scanned: {exc}") from None
        for entry in (*entries.models, *entries.llm_models):
            loaded = self._dp.loaded_versions(entry.name)
            if loaded:
                rows.extend({"name": entry.name, "version": v, "state": "READY", "reason": ""} for v in loaded)
            elif entry.config.backend == "llm":
                ready = self._dp.generative.ready(entry.name)
                state = "READY" if ready else "UNAVAILABLE"
                reason = ("LLM engine" if ready else "not served" if ready is None else "unloaded"
                          if self._dp.generative.unloaded(entry.name) else "LLM engine not ready")
                rows.append({"name": entry.name, "version": "", "state": state, "reason": reason})
            elif self.residency is not None and self.residency.manages(entry.name) and entry.name not in self._failed:
                rows.append({"name": entry.name, "version": "", "state": "UNAVAILABLE",
                             "reason": "not resident (memory budget): the next request loads it"})
            else:
                rows.append({"name": entry.name, "version": "", "state": "UNAVAILABLE",
                             "reason": self._failed.get(entry.name, "unloaded")})
        return rows

    def _check_control(self, name: str) -> None:
        if self.control_mode != "explicit":
            raise NotReady(f"{CONTROL_REFUSED} (this server runs with --model-control-mode {self.control_mode}; "
                           f"start it with --model-control-mode explicit to load and unload '{name}')")
        if self._served is not None and name not in self._served:
            raise ModelNotFound(f"Request for unknown model: '{name}' is not found (this server serves only "
                                f"{', '.join(self._served)}: serve --model)")

    async def load(self, name: str, config_override: Mapping[str, object] | None = None) -> list[str]:
        """Load (or reload) `name`'s selected versions, with Triton's `config` override applied to this load
        (or refused); returns the versions now serving. Only in explicit model-control mode."""
        self._check_control(name)
        return await self.reload(name, config_override)

    async def reload(self, name: str, config_override: Mapping[str, object] | None = None) -> list[str]:
        """`load` without the model-control check (the repository poller uses it)."""
        residency = self.residency
        if config_override is None and residency is not None and residency.manages(name) \
                and not residency.is_resident(name):
            async with residency.use(name):  # through the budget: may evict idle models
                return self._dp.loaded_versions(name)
        async with self._lock:
            try:
                index = self._repo.scan([name])
            except ValueError as exc:
                raise (ModelNotFound if "no model directory" in str(exc) else InvalidRequest)(str(exc)) from None
            if not index.models:
                return await self._reload_llm(name, index, config_override)
            if config_override is not None:
                entry = index.models[0]
                config = apply_config_override(entry.config, config_override)
                versions = config.version_policy.select(entry.available_versions)
                if not versions:
                    raise InvalidRequest(f"config override: version_policy selects none of the versions on "
                                         f"disk {list(entry.available_versions)}")
                index = RepositoryIndex((dataclasses.replace(entry, config=config, versions=versions),), ())
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

    async def _reload_llm(self, name: str, index: RepositoryIndex,
                          config_override: Mapping[str, object] | None) -> list[str]:
        """(Re)load an LLM the server runs: its engine reloads from the config on disk (the old one drains)."""
        if config_override is not None:
            raise InvalidRequest(f"model '{name}' is an LLM: a config override is not supported; edit its "
                                 "config.yaml and load it again")
        new = name not in self._dp.generative
        if new and self._add_llm is None:
            raise InvalidRequest(f"model '{name}' is an LLM this server did not start with; restart it to serve "
                                 "a new LLM")
        try:
            config = index.llm_models[0].config
            await (self._add_llm(config) if new and self._add_llm is not None else self._dp.generative.reload(config))
        except HeadroomError:
            raise
        except Exception as exc:  # a bad config or model file: this load fails, the server and old engine stay
            raise InvalidRequest(f"loading '{name}' failed; the previous engine keeps serving: {exc}") from None
        log.info("loaded LLM %s", name)
        return []

    async def unload(self, name: str) -> None:
        """Stop serving `name` (explicit model-control mode only)."""
        self._check_control(name)
        await self.remove(name)

    async def remove(self, name: str) -> None:
        """`unload` without the model-control check (the repository poller uses it)."""
        async with self._lock:
            if name in self._dp.generative and not self._dp.loaded_versions(name):
                await self._dp.generative.unload(name)
                log.info("unloaded LLM %s", name)
                return
            for served in await self._dp.remove(name):
                await asyncio.to_thread(served.model.unload)
            if self.residency is not None:
                self.residency.forget(name)
            log.info("unloaded %s", name)
