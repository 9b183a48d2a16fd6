"""The generative (`backend: llm`) models a server runs on its LLM engine, as the V2 routes see them.

They have no tensor slot in the data plane: their metadata, readiness and Triton config come from here, and
their requests go to `/v2/models/{m}/generate[_stream]` and the OpenAI routes.
"""

from __future__ import annotations

from typing import Any

from headroom.core.errors import ModelNotFound
from headroom.models.config import ModelConfig
from headroom.server.statistics import LLMStatistics


class GenerativeModels:
    """Name -> (config, engine); an engine is anything with `ready() -> bool` (the LLM service)."""

    def __init__(self) -> None:
        self._models: dict[str, tuple[ModelConfig, Any]] = {}
        self._stats: dict[str, LLMStatistics] = {}

    def add(self, config: ModelConfig, engine: Any) -> LLMStatistics:
        """Serve `config`'s LLM on `engine`; returns the statistics its requests are to be counted in."""
        self._models[config.name] = (config, engine)
        return self._stats.setdefault(config.name, LLMStatistics())

    def names(self) -> list[str]:
        return sorted(self._models)

    def stats(self, name: str, version: str = "") -> dict[str, object]:
        """`name`'s statistics in Triton's schema (the version is "": an LLM has none)."""
        self.config(name, version)  # a version is a 404
        return {**self._stats[name].stats.to_json(name, ""), "queue_depth": None, "cold_start": []}

    def __contains__(self, name: object) -> bool:
        return name in self._models

    def config(self, name: str, version: str = "") -> ModelConfig:
        """The model's config; a generative model has no versions, so naming one is a 404."""
        if version:
            raise ModelNotFound(f"Request for unknown model: '{name}' version {version} is not found")
        return self._models[name][0]

    def ready(self, name: str) -> bool | None:
        """Whether `name`'s engine is ready; None when `name` is not a generative model."""
        entry = self._models.get(name)
        return None if entry is None else bool(entry[1].ready())

    def engine(self, name: str) -> Any:
        """The engine serving `name`; ModelNotFound when there is none."""
        entry = self._models.get(name)
        if entry is None:
            raise ModelNotFound(f"Request for unknown model: '{name}' is not found (generative models: "
                                f"{', '.join(sorted(self._models)) or 'none'})")
        return entry[1]


__all__ = ["GenerativeModels"]
