"""The generative (`backend: llm`) models a server runs on its LLM engine, as the V2 routes see them.

They have no tensor slot in the data plane: their metadata, readiness, statistics and Triton config come from
here, and their requests go to `/v2/models/{m}/generate[_stream]`, gRPC ModelInfer / ModelStreamInfer and the
OpenAI routes. The repository API and the poller reload (a new engine is loaded, then the old one drains) and
unload them through here.
"""

from __future__ import annotations

from typing import Any

from headroom.core.errors import ModelNotFound
from headroom.models.config import ModelConfig
from headroom.server.statistics import LLMStatistics


class GenerativeModels:
    """Name -> (config, engine); an engine is the LLM service (`model_ready()`, `reload(config)`, `unload()`,
    `serving.unloaded`)."""

    def __init__(self) -> None:
        self._models: dict[str, tuple[ModelConfig, Any]] = {}
        self._stats: dict[str, LLMStatistics] = {}

    def add(self, config: ModelConfig, engine: Any) -> LLMStatistics:
        """Serve `config`'s LLM on `engine`; returns the statistics its requests are to be counted in."""
        self._models[config.name] = (config, engine)
        return self._stats.setdefault(config.name, LLMStatistics())

    def loaded_names(self) -> list[str]:
        """The generative models serving now (not unloaded)."""
        return sorted(name for name, (_, engine) in self._models.items() if not engine.serving.unloaded)

    def stats(self, name: str, version: str = "") -> dict[str, object]:
        """`name`'s statistics in Triton's schema (the version is "": an LLM has none)."""
        self.config(name, version)  # a version is a 404
        return {**self._stats[name].stats.to_json(name, ""), "queue_depth": None, "cold_start": []}

    def __contains__(self, name: object) -> bool:
        return name in self._models

    def config(self, name: str, version: str = "") -> ModelConfig:
        """The model's config; a generative model has no versions, so naming one is a 404, and so is an
        unloaded one (as a tensor model's, Triton's answer for a model that is not loaded)."""
        if version:
            raise ModelNotFound(f"Request for unknown model: '{name}' version {version} is not found")
        config, engine = self._models[name]
        if engine.serving.unloaded:
            raise ModelNotFound(f"Request for unknown model: '{name}' is unloaded; load it through the repository "
                                f"API (POST /v2/repository/models/{name}/load)")
        return config

    def ready(self, name: str) -> bool | None:
        """Whether `name`'s engine is ready; None when `name` is not a generative model."""
        entry = self._models.get(name)
        return None if entry is None else bool(entry[1].model_ready())

    def unloaded(self, name: str) -> bool:
        return bool(self.engine(name).serving.unloaded)

    async def reload(self, config: ModelConfig, drain_timeout_s: float = 30.0) -> None:
        """Serve `config` for its (known) LLM: load the new engine, switch, drain and stop the old one."""
        engine = self.engine(config.name)
        await engine.reload(config, drain_timeout_s)
        self._models[config.name] = (config, engine)

    async def unload(self, name: str, drain_timeout_s: float = 30.0) -> None:
        """Stop serving `name` (404 from now on); in-flight requests finish first."""
        await self.engine(name).unload(drain_timeout_s)

    def engine(self, name: str) -> Any:
        """The engine serving `name`; ModelNotFound when there is none."""
        entry = self._models.get(name)
        if entry is None:
            raise ModelNotFound(f"Request for unknown model: '{name}' is not found (generative models: "
                                f"{', '.join(sorted(self._models)) or 'none'})")
        return entry[1]


__all__ = ["GenerativeModels"]
