"""`headroom sim --validate`, step 1: the bench's workload and the model's service-time profile, measured
the way the server will run it (same samples, preprocessing, collation, CPUs and thread count).

Pinning: with `--server-cpus`, the profile is measured with this process pinned to those CPUs and the model
loaded with one intra-op thread per CPU (`runtime.intra_op_threads` overridden in a temporary repository,
`pinned_repository`), and the server is started from that same repository on those CPUs, so the profile and
the server run the same threads on the same cores. The profile also records, in `meta`, the process CPU
seconds per second of predict (`cpu_per_wall`) and the calling thread's `busy_fraction`: its CPU time over
the time it was runnable (wall minus its run-queue wait, /proc/thread-self/schedstat), ~1 for a CPU-bound
model even on a busy machine, ~0 for a model that sleeps or waits on a device; and `thread_cpu_ms`, the
predicting thread's mean CPU time by batch size (with one intra-op thread: the batch time on an idle core,
so `service_ms` far above it means other processes were taking the core while the profile was measured).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import yaml

from headroom.loadgen.workloads import Sample, WorkloadSpec, make_workload, sentences
from headroom.models.base import Model
from headroom.models.config import ModelConfig
from headroom.models.repository import ModelRepository
from headroom.profiling.affinity import parse_cpus
from headroom.profiling.measure import BatchTiming, default_batch_sizes, profile_document
from headroom.sim.profile import ServiceProfile, profile_from_mapping, resolve_profile

THREADED_BACKENDS = ("onnxruntime", "torch")


@contextlib.contextmanager
def pinned(cpus: str) -> Iterator[frozenset[int]]:
    """Run the block with this thread on `cpus` (threads it starts inherit them); restore afterwards.
    An empty spec changes nothing."""
    before = frozenset(os.sched_getaffinity(0))
    if not cpus:
        yield before
        return
    wanted = parse_cpus(cpus)
    if not wanted <= before:
        raise ValueError(f"CPUs {sorted(wanted - before)} are not available to this process "
                         f"(it may use {sorted(before)}); pick --server-cpus / --generator-cpus among those")
    os.sched_setaffinity(0, wanted)
    try:
        yield wanted
    finally:
        os.sched_setaffinity(0, before)


def _thread_sched_s() -> tuple[float, float]:
    """(CPU seconds, run-queue wait seconds) of the calling thread; zeros where schedstat is unavailable."""
    try:
        cpu_ns, wait_ns = Path("/proc/thread-self/schedstat").read_text().split()[:2]
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(cpu_ns) / 1e9, int(wait_ns) / 1e9


def pinned_repository(source: Path, model: str, threads: int, workdir: Path) -> Path:
    """A repository holding `model` with `runtime.intra_op_threads = threads` (its other files symlinked).
    Returns `source` unchanged when `threads` is 0 or the backend has no thread knob."""
    directory = source / model
    raw = yaml.safe_load((directory / "config.yaml").read_text())
    if threads <= 0 or not isinstance(raw, dict) or raw.get("backend") not in THREADED_BACKENDS:
        return source
    runtime = dict(raw.get("runtime") or {})
    runtime["intra_op_threads"] = threads
    raw["runtime"] = runtime
    params = dict(raw.get("parameters") or {})
    params.pop("intra_op_threads", None)
    raw["parameters"] = params
    target = workdir / "repository" / model
    target.mkdir(parents=True)
    (target / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    for entry in directory.iterdir():
        if entry.name != "config.yaml":
            (target / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
    return target.parent


def workload_for(model: str, config: ModelConfig, workdir: Path, seed: int) -> WorkloadSpec:
    """The bench dataset for a model: digits images; for text models the bench's sentences as V2 bodies of
    shape [1, 1] (the batch dimension included, as the server validates them); a small FP32 row otherwise."""
    spec = config.inputs[0]
    if model == "digits" or spec.shape == (1, 8, 8):
        return WorkloadSpec(kind="digits")
    if spec.datatype == "BYTES":
        texts = [s.text for s in sentences(256, np.random.default_rng(seed + 1))]
        bodies = [{"inputs": [{"name": spec.name, "shape": [1, 1], "datatype": "BYTES", "data": [t]}]} for t in texts]
    else:
        dims = [1] + [d if d > 0 else 8 for d in spec.shape]
        bodies = [{"inputs": [{"name": spec.name, "shape": dims, "datatype": "FP32",
                               "data": [0.5] * int(np.prod(dims))}]}]
    path = workdir / "bodies.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"body": b}) + b"\n" for b in bodies))
    return WorkloadSpec(kind="jsonl", path=str(path), num_samples=len(bodies))


def wire_inputs(sample: Sample, config: ModelConfig) -> dict[str, npt.NDArray[Any]]:
    """The decoded V2 tensors the server hands the model for one bench sample (what preprocess receives)."""
    spec = config.inputs[0]
    if sample.body is not None:
        t = sample.body["inputs"][0]
        if t["datatype"] == "BYTES":
            return {t["name"]: np.array([str(v).encode() for v in t["data"]], dtype=object).reshape(t["shape"])}
        return {t["name"]: np.asarray(t["data"], dtype=np.float32).reshape(t["shape"])}
    if sample.pixels is not None:
        return {spec.name: sample.pixels.astype(np.float32)}
    return {spec.name: np.array([[sample.text.encode()]], dtype=object)}


def measure_on_workload(model: Model, config: ModelConfig, samples: list[Sample], batch_sizes: tuple[int, ...],
                        repeats: int, warmup: int = 2) -> tuple[list[BatchTiming], dict[str, float]]:
    """Predict time of batches of bench samples, preprocessed and collated as the server does, and how busy the
    CPU was meanwhile (`cpu_per_wall`, `busy_fraction`: see the module docstring). Repeat k of size B uses
    samples k*B .. k*B+B-1 (padding varies as in the server); sizes are interleaved round-robin so a burst of
    load from other processes lands on every size alike."""
    items = [model.preprocess(wire_inputs(s, config), {}) for s in samples]

    def batch(size: int, k: int) -> Any:
        return model.collate([items[(k * size + j) % len(items)] for j in range(size)])

    for size in batch_sizes:
        for k in range(warmup):
            model.predict(batch(size, k))
    times: dict[int, list[float]] = {b: [] for b in batch_sizes}
    own_cpu: dict[int, float] = dict.fromkeys(batch_sizes, 0.0)
    cpu_s = wall_s = thread_cpu_s = wait_s = 0.0
    for k in range(repeats):
        for size in batch_sizes:
            b = batch(size, k)
            sched0, cpu0, start = _thread_sched_s(), time.process_time(), time.perf_counter()
            model.predict(b)
            elapsed = time.perf_counter() - start
            cpu_s += time.process_time() - cpu0
            sched1 = _thread_sched_s()
            thread_cpu_s += sched1[0] - sched0[0]
            own_cpu[size] += sched1[0] - sched0[0]
            wait_s += sched1[1] - sched0[1]
            wall_s += elapsed
            times[size].append(elapsed)
    runnable_s = wall_s - wait_s
    busy = min(1.0, thread_cpu_s / runnable_s) if runnable_s > 0 and thread_cpu_s > 0 else cpu_s / max(wall_s, 1e-12)
    return [BatchTiming(b, tuple(times[b])) for b in batch_sizes], {
        "cpu_per_wall": cpu_s / wall_s if wall_s > 0 else 0.0, "busy_fraction": busy,
        "run_queue_wait_fraction": wait_s / wall_s if wall_s > 0 else 0.0,
        **{f"thread_cpu_ms_{b}": own_cpu[b] / repeats * 1e3 for b in batch_sizes}}


def measure_profile(model: str, repository: Path, workload: WorkloadSpec, seed: int, repeats: int,
                    profile_path: str | None, on_step: Callable[[str], None]) -> ServiceProfile:
    """The profile file given, or predict time by batch size measured here on the bench's own samples
    (on the CPUs this thread runs on now: see `pinned`); `meta` records how CPU-bound predict was."""
    if profile_path:
        return resolve_profile(profile_path)
    repo = ModelRepository(repository)
    entry = repo.scan([model]).models[0]
    samples = make_workload(workload, np.random.default_rng(seed + 1))
    loaded = repo.load_version(entry, entry.versions[-1])
    try:
        sizes = default_batch_sizes(entry.config.max_batch_size)
        on_step(f"profiling {model} at batch sizes {', '.join(map(str, sizes))} ({repeats} repeats)")
        timings, busy = measure_on_workload(loaded.model, entry.config, samples, sizes, repeats)
    finally:
        loaded.unload()
    doc = profile_document(model, timings, repeats)
    meta = doc["meta"]
    if isinstance(meta, dict):
        meta["inputs"] = f"bench workload {workload.kind!r} (seed {seed + 1}), preprocessed as the server does"
        meta.update({k: round(v, 4) for k, v in busy.items() if not k.startswith("thread_cpu_ms_")})
        meta["thread_cpu_ms"] = {k.rpartition("_")[2]: round(v, 4) for k, v in busy.items()
                                 if k.startswith("thread_cpu_ms_")}
        meta["cpus"] = sorted(os.sched_getaffinity(0))
        meta["intra_op_threads"] = entry.config.runtime.intra_op_threads
    return profile_from_mapping(doc)
