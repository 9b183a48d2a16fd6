"""A model's KServe V2 metadata from its configuration: one function for `headroom serve`'s data plane and the Ray
Serve ingress (which answers from the repository without a loaded model)."""

from __future__ import annotations

from collections.abc import Sequence

from headroom.core.dataplane import ModelMetadata, TensorMetadata
from headroom.models.config import ModelConfig


def metadata_from_config(name: str, cfg: ModelConfig, versions: Sequence[str]) -> ModelMetadata:
    """V2 metadata: the batch dimension (-1) leads every tensor of a batching model."""
    lead = (-1,) if cfg.max_batch_size > 0 else ()
    return ModelMetadata(
        name=name,
        versions=tuple(versions),
        platform=cfg.platform,
        inputs=tuple(TensorMetadata(t.name, t.datatype, lead + t.shape) for t in cfg.inputs),
        outputs=tuple(TensorMetadata(t.name, t.datatype, lead + t.shape) for t in cfg.outputs),
    )


__all__ = ["metadata_from_config"]
