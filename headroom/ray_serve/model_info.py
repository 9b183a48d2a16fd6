"""Model metadata, configuration and readiness on a Ray Serve application, from the repository the ingress scanned.

The ingress answers them itself (no replica call: they describe the repository, not a loaded model), as
`headroom serve` answers them: KServe V2 `GET /v2/models/{m}[/versions/{v}]` (metadata), `.../config` (Triton's
JSON config schema), `.../ready`, and gRPC `ModelMetadata` / `ModelConfig` (`headroom.ray_serve.grpc_ingress`).
Versions are the ones the model's version policy selects on disk; an LLM has none (naming one is a 404), as under
`headroom serve`. With multiplexing a version is loaded on a replica on its first request, so "ready" means the
application serves it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from headroom.core.dataplane import ModelMetadata
from headroom.core.errors import ModelNotFound
from headroom.models.config import ModelConfig
from headroom.models.repository import RepositoryIndex
from headroom.server.model_metadata import metadata_from_config

_MODEL_PATH = re.compile(r"^/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?(?P<what>/config|/ready)?/?$")


@dataclass(frozen=True, slots=True)
class ServedModels:
    """Name -> (config, versions) of every model the application serves (LLMs by their served name)."""

    models: dict[str, tuple[ModelConfig, tuple[str, ...]]]

    @classmethod
    def of(cls, index: RepositoryIndex) -> ServedModels:
        models = {e.name: (e.config, tuple(str(v) for v in e.versions)) for e in index.models}
        for e in index.llm_models:
            models[str(e.config.parameters.get("served_model_name") or e.name)] = (e.config, ())
        return cls(models)

    def config(self, name: str, version: str = "") -> ModelConfig:
        config, versions = self._entry(name)
        if version and version not in versions:
            raise ModelNotFound(f"Request for unknown model: '{name}' version {version} is not found (versions: "
                                f"{', '.join(versions) or 'none: an LLM has no versions'})")
        return config

    def metadata(self, name: str, version: str = "") -> ModelMetadata:
        config = self.config(name, version)
        return metadata_from_config(name, config, (version,) if version else self._entry(name)[1])

    def _entry(self, name: str) -> tuple[ModelConfig, tuple[str, ...]]:
        entry = self.models.get(name)
        if entry is None:
            raise ModelNotFound(f"Request for unknown model: '{name}' is not found (served models: "
                                f"{', '.join(sorted(self.models)) or 'none'})")
        return entry


def model_path(path: str) -> tuple[str, str, str] | None:
    """(model, version, "" | "config" | "ready") of a V2 model metadata / config / ready path, else None."""
    m = _MODEL_PATH.match(path)
    if m is None:
        return None
    return m["model"], m["version"] or "", (m["what"] or "").strip("/")


__all__ = ["ServedModels", "model_path"]
