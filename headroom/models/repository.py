"""The model repository: `<root>/<name>/config.yaml` plus numeric version directories `<name>/<N>/`.

    models/
      digits/config.yaml        backend, inputs/outputs, batching, warmup, parameters
      digits/1/model.onnx       one directory per version; the version policy picks which are served
      smollm2/config.yaml       `backend: llm` -> listed in `llm_models`, never loaded here

`scan()` validates every config (errors name the file and the key to fix). `load()` creates each selected
version's Model through the backend registry and loads it in a worker thread, timing the cold-start stages
(read_weights, build_session, warmup); a model is ready only after warmup ran every configured batch size.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from headroom.core.compute_priority import run_lowered
from headroom.models.artifacts import ModelLoadError
from headroom.models.backends import create_model
from headroom.models.base import ColdStartStage, LoadContext, Model
from headroom.models.config import ModelConfig, load_model_config
from headroom.models.trust import check_trusted
from headroom.models.warmup import run_warmup

log = logging.getLogger("headroom.models")


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model directory found by a scan (nothing loaded yet)."""

    name: str  # the model's name: its directory name
    directory: Path  # <root>/<name>
    config: ModelConfig  # the validated config.yaml
    available_versions: tuple[int, ...]  # numeric version directories present on disk, ascending
    versions: tuple[int, ...]  # the ones the version policy selects for serving, ascending

    def version_dir(self, version: int) -> Path:
        return self.directory / str(version)


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A loaded, warmed-up model version: what the server schedules requests onto."""

    config: ModelConfig  # the model's config
    version: str  # version number as a string (V2 versions are strings)
    version_dir: Path  # <root>/<name>/<version>
    model: Model  # the loaded Model object (preprocess/collate/predict/split/postprocess)
    cold_start: tuple[ColdStartStage, ...]  # timed stages in order: read_weights, build_session, warmup, ...
    warmup_batch_sizes: tuple[int, ...]  # batch sizes the warmup executed
    warmup_batch_s: tuple[float, ...] = ()  # seconds each of those batches took (pipeline end to end)

    @property
    def warmup_batches(self) -> tuple[tuple[int, float], ...]:
        """(batch size, seconds) of the warmup batches that seed the batcher's service-time estimate: all but
        the first when there are several (the first run carries one-time costs: allocation, graph setup)."""
        runs = tuple(zip(self.warmup_batch_sizes, self.warmup_batch_s, strict=False))
        return runs[1:] if len(runs) > 1 else runs

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def load_time_s(self) -> float:
        """Sum of the cold-start stages."""
        return sum(stage.duration_s for stage in self.cold_start)

    def unload(self) -> None:
        self.model.unload()


@dataclass(frozen=True, slots=True)
class RepositoryIndex:
    """The result of a scan: tensor models for this server, generative ones for the LLM engine."""

    models: tuple[ModelEntry, ...]  # backends onnxruntime / torch / python, sorted by name
    llm_models: tuple[ModelEntry, ...]  # `backend: llm` entries, handed to headroom.llm

    def get(self, name: str) -> ModelEntry | None:
        return next((m for m in self.models if m.name == name), None)


def _numeric_versions(directory: Path) -> tuple[int, ...]:
    return tuple(sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit()))


def scan_entry(directory: Path) -> ModelEntry:
    """Validate one model directory; raises ValueError naming the file and what to fix."""
    config = load_model_config(directory)
    available = _numeric_versions(directory)
    if config.backend != "llm" and not available:
        raise ModelLoadError(
            f"{directory}: no version directory; put the model's files in a numbered subdirectory such as "
            f"{directory / '1'}/ (the highest number is served by default); for the default models run "
            f"`headroom build-models --model-repository {directory.parent}`"
        )
    selected = config.version_policy.select(available)
    if available and not selected:
        raise ModelLoadError(
            f"{directory / 'config.yaml'}.version_policy: selects none of the versions on disk {list(available)}"
        )
    return ModelEntry(config.name, directory, config, available, selected)


class ModelRepository:
    """Scans a repository directory and loads its models."""

    def __init__(self, root: Path, trusted: Iterable[str] | None = None) -> None:
        self.root = Path(root)
        #: kinds of model code it may load (headroom.models.trust); None = everything (library use)
        self.trusted = None if trusted is None else frozenset(trusted)

    def scan(self, names: Iterable[str] | None = None) -> RepositoryIndex:
        """Validate every `<root>/*/config.yaml` (or only `names`); raises on the first bad one."""
        if not self.root.is_dir():
            raise ModelLoadError(
                f"model repository {self.root} does not exist; create it or run "
                f"`headroom build-models --model-repository {self.root}`"
            )
        wanted = set(names) if names is not None else None
        tensor: list[ModelEntry] = []
        llm: list[ModelEntry] = []
        for directory in sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
            if wanted is not None and directory.name not in wanted:
                continue
            if not (directory / "config.yaml").exists():
                log.warning("skipping %s: no config.yaml", directory)
                continue
            entry = scan_entry(directory)
            if self.trusted is not None:
                check_trusted(entry.config, self.trusted, str(directory / "config.yaml"))
            (llm if entry.config.backend == "llm" else tensor).append(entry)
        if wanted is not None:
            missing = wanted - {e.name for e in tensor + llm}
            if missing:
                raise ModelLoadError(f"model repository {self.root}: no model directory named {sorted(missing)}")
        return RepositoryIndex(models=tuple(tensor), llm_models=tuple(llm))

    def load_version(self, entry: ModelEntry, version: int) -> LoadedModel:
        """Create, load and warm up one version (blocking: call it from a worker thread)."""
        version_dir = entry.version_dir(version)
        stages: list[ColdStartStage] = []
        model = create_model(entry.config, f"{entry.directory / 'config.yaml'}")
        ctx = LoadContext(entry.config, version_dir, stages.append)
        def load_and_warm() -> tuple[tuple[int, float], ...]:
            model.load(ctx)
            with ctx.stage("warmup"):
                return run_warmup(model)

        try:  # in a thread at the model's compute priority: the runtime's thread pools are created there
            runs = run_lowered(load_and_warm, entry.config.runtime.compute_nice, f"load-{entry.name}")
        except ModelLoadError:
            model.unload()
            raise
        except Exception as exc:
            model.unload()
            raise ModelLoadError(
                f"{version_dir}: loading model {entry.name!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
        loaded = LoadedModel(entry.config, str(version), version_dir, model, tuple(stages),
                             tuple(size for size, _ in runs), tuple(seconds for _, seconds in runs))
        log.info(
            "loaded %s v%s in %.3fs (%s)",
            entry.name,
            version,
            loaded.load_time_s,
            ", ".join(f"{s.name}={s.duration_s * 1000:.1f}ms" for s in stages),
        )
        return loaded

    def load(self, index: RepositoryIndex | None = None) -> list[LoadedModel]:
        """Load every selected version of every tensor model, one after another (blocking)."""
        index = index or self.scan()
        return [self.load_version(e, v) for e in index.models for v in e.versions]

    async def load_async(self, index: RepositoryIndex | None = None, max_parallel: int = 2) -> list[LoadedModel]:
        """Load every selected version in worker threads (at most `max_parallel` at once), in index order.

        On failure the versions that did load are unloaded and the first error is raised.
        """
        index = index or self.scan()
        gate = asyncio.Semaphore(max(1, max_parallel))

        async def one(entry: ModelEntry, version: int) -> LoadedModel:
            async with gate:
                return await asyncio.to_thread(self.load_version, entry, version)

        jobs = [one(e, v) for e in index.models for v in e.versions]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        loaded = [r for r in results if isinstance(r, LoadedModel)]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for item in loaded:
                item.unload()
            raise errors[0]
        return loaded


def load_repository(root: Path) -> list[LoadedModel]:
    """Convenience: scan and load everything under `root` (blocking)."""
    start = time.monotonic()
    loaded = ModelRepository(root).load()
    log.info("repository %s loaded in %.2fs", root, time.monotonic() - start)
    return loaded
