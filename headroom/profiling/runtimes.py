"""One model under several runtimes (PyTorch eager, torch.compile, ONNX Runtime): latency by batch size.

`runtime_variant(config, runtime, threads)` is pure: the config that runs the same model under `runtime`
(a backend switch uses headroom.models.builtin.runtime_variants.RUNTIME_PARAMETERS). `profile_runtimes`
loads each variant through the repository (cold start timed, compile included), measures the batched model
call per batch size (headroom.profiling.measure) and unloads it. `runtimes_document` is the JSON; the CLI
prints it as the textbook's runtime table (runtime, latency, speed-up over eager, notes).
"""

from __future__ import annotations

import dataclasses
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from headroom.models.base import ColdStartStage
from headroom.models.builtin.runtime_variants import RUNTIME_PARAMETERS
from headroom.models.config import ModelConfig
from headroom.models.repository import ModelEntry, ModelRepository
from headroom.profiling.measure import BatchTiming, measure_batch

RUNTIMES = ("eager", "compile", "onnx")
_BACKEND = {"eager": "torch", "compile": "torch", "onnx": "onnxruntime"}
NOTES = {
    "eager": "baseline, no graph optimization",
    "compile": "torch.compile: inductor C++ kernels, compiled at load",
    "onnx": "graph optimization, fused CPU kernels",
}


@dataclass(frozen=True, slots=True)
class RuntimeProfile:
    """One runtime's measurements."""

    runtime: str  # eager | compile | onnx
    threads: int  # intra-op threads it ran with (0 = the runtime decided)
    cold_start: tuple[ColdStartStage, ...]  # load stages (read_weights, build_session, compile, warmup, ...)
    timings: tuple[BatchTiming, ...]  # predict times per batch size
    cache: str  # what the compiled-artifact cache did: "", "off", "hit", "miss", "miss (written)"


def parse_runtimes(spec: str) -> tuple[str, ...]:
    """'eager,compile,onnx' -> ('eager', 'compile', 'onnx'); ValueError naming the unknown one."""
    names = tuple(part.strip() for part in spec.split(",") if part.strip())
    if not names:
        raise ValueError(f"--runtimes: name at least one of {', '.join(RUNTIMES)}")
    for name in names:
        if name not in RUNTIMES:
            raise ValueError(f"--runtimes: {name!r} is not one of {', '.join(RUNTIMES)}")
    return names


def parse_batch_sizes(spec: str) -> tuple[int, ...]:
    """'1,8,32' -> (1, 8, 32); ValueError when a size is not a positive integer."""
    try:
        sizes = tuple(int(part) for part in spec.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--batch-sizes {spec!r}: write positive integers separated by commas, e.g. 1,8,32") from None
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"--batch-sizes {spec!r}: write positive integers separated by commas, e.g. 1,8,32")
    return sizes


def configured_threads(config: ModelConfig) -> int:
    """The intra-op thread count the model's config asks for (0 = the runtime decides)."""
    if config.runtime.intra_op_threads is not None:
        return config.runtime.intra_op_threads
    for key in ("intra_op_threads", "num_threads"):
        value = config.parameters.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return 0


def runtime_variant(config: ModelConfig, runtime: str, threads: int, cache_dir: str = "",
                    cache_artifacts: bool = False) -> ModelConfig:
    """The same model run by `runtime` with `threads` intra-op threads; ValueError when it has no such variant.

    `cache_artifacts` turns on the optimized-graph cache (onnx) and the compiled-artifact cache (compile).
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime {runtime!r} is not one of {', '.join(RUNTIMES)}")
    backend = _BACKEND[runtime]
    model_class = str(config.parameters.get("model_class", ""))
    overrides = RUNTIME_PARAMETERS.get(model_class, {}).get(backend)
    if config.backend != backend and overrides is None:
        raise ValueError(
            f"model {config.name!r} (backend {config.backend}, model_class {model_class or 'none'}) has no "
            f"{runtime} variant: it needs a {backend} model; list it in RUNTIME_PARAMETERS "
            f"(headroom/models/builtin/runtime_variants.py) or profile only {_own_runtimes(config)}"
        )
    parameters = {**config.parameters, **(overrides or {})}
    runtime_cfg = dataclasses.replace(
        config.runtime,
        mode="compile" if runtime == "compile" else "eager",
        intra_op_threads=threads,
        inter_op_threads=config.runtime.inter_op_threads if runtime == "onnx" else None,
        cache_dir=cache_dir or config.runtime.cache_dir,
        optimized_model_cache=config.runtime.optimized_model_cache or cache_artifacts,
        compile_cache=config.runtime.compile_cache or cache_artifacts,
    )
    return dataclasses.replace(config, backend=backend, parameters=parameters, runtime=runtime_cfg,
                               platform="onnxruntime_onnx" if runtime == "onnx" else "pytorch_libtorch")


def _own_runtimes(config: ModelConfig) -> str:
    return "onnx" if config.backend == "onnxruntime" else "eager,compile" if config.backend == "torch" else "none"


def profile_runtimes(
    repo: ModelRepository,
    entry: ModelEntry,
    version: int,
    runtimes: Sequence[str],
    batch_sizes: Sequence[int],
    repeats: int,
    threads: int,
    cache_dir: str = "",
    on_done: Callable[[str, BatchTiming | None], None] | None = None,
    cache_artifacts: bool = False,
) -> list[RuntimeProfile]:
    """Load the model under each runtime in turn, measure each batch size, unload; in `runtimes` order.

    `on_done(runtime, None)` is called once a runtime is loaded, then `on_done(runtime, timing)` per size.
    """
    results = []
    for runtime in runtimes:
        config = runtime_variant(entry.config, runtime, threads, cache_dir, cache_artifacts)
        variant = dataclasses.replace(entry, config=config)
        loaded = repo.load_version(variant, version)
        if on_done is not None:
            on_done(runtime, None)
        try:
            timings = []
            for size in batch_sizes:
                timing = measure_batch(loaded.model, size, repeats)
                timings.append(timing)
                if on_done is not None:
                    on_done(runtime, timing)
        finally:
            loaded.unload()
        cache = str(getattr(loaded.model, "compile_cache", "") or getattr(loaded.model, "optimized_graph_cache", ""))
        results.append(RuntimeProfile(runtime, threads, loaded.cold_start, tuple(timings), cache))
    return results


def speedups(profiles: Sequence[RuntimeProfile]) -> dict[tuple[str, int], float]:
    """(runtime, batch size) -> eager's p50 / this runtime's p50 (only when eager was measured)."""
    eager = next((p for p in profiles if p.runtime == "eager"), None)
    if eager is None:
        return {}
    base = {t.batch_size: t.percentile_ms(50) for t in eager.timings}
    return {
        (p.runtime, t.batch_size): base[t.batch_size] / t.percentile_ms(50)
        for p in profiles
        for t in p.timings
        if t.batch_size in base and t.percentile_ms(50) > 0
    }


def runtimes_document(model: str, version: int, profiles: Sequence[RuntimeProfile], repeats: int,
                      model_repository: Path) -> dict[str, object]:
    """The JSON form of a runtime comparison."""
    ups = speedups(profiles)
    return {
        "model": model,
        "version": version,
        "model_repository": str(model_repository),
        "repeats": repeats,
        "machine": {"node": platform.node(), "machine": platform.machine(), "python": platform.python_version(),
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        "runtimes": [
            {
                "runtime": p.runtime,
                "notes": NOTES[p.runtime],
                "intra_op_threads": p.threads,
                "artifact_cache": p.cache,
                "cold_start_s": {s.name: round(s.duration_s, 4) for s in p.cold_start},
                "load_s": round(sum(s.duration_s for s in p.cold_start), 4),
                "batches": [
                    {
                        "batch_size": t.batch_size,
                        "p50_ms": round(t.percentile_ms(50), 4),
                        "p99_ms": round(t.percentile_ms(99), 4),
                        "mean_ms": round(t.mean_ms, 4),
                        "throughput_items_per_s": round(t.batch_size / (t.mean_ms / 1e3), 2) if t.mean_ms else 0.0,
                        "speedup_vs_eager_p50": round(ups[(p.runtime, t.batch_size)], 3)
                        if (p.runtime, t.batch_size) in ups else None,
                    }
                    for t in p.timings
                ],
            }
            for p in profiles
        ],
    }
