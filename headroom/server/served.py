"""A served model version: what the composition root hands the data plane (what its config means for
scheduling is `headroom.batching.model_config`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from headroom.models.base import ColdStartStage, Model
from headroom.models.config import ModelConfig


@dataclass(frozen=True, slots=True)
class ServedVersion:
    """A loaded, warmed-up model version handed to the data plane by the composition root."""

    name: str  # model name
    version: str  # version directory name ("1", "2", ...)
    config: ModelConfig  # its validated configuration
    model: Model  # the loaded backend object
    cold_start: tuple[ColdStartStage, ...] = ()  # timed load stages
    version_dir: Path | None = None  # where its files are (the drift monitor looks for its reference there)
    warmup_batches: tuple[tuple[int, float], ...] = ()  # (size, seconds) per warmup batch: the first estimate
