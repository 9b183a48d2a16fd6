"""Measure batch service time (the predict call) by batch size, into the profile format the planner and the
simulator read (headroom.sim.profile, docs/sim.md):

    {"name": "minilm", "service_ms": {"1": 9.1, "2": 11.0, ...}, "distribution": "lognormal", "cv": 0.08,
     "meta": {"machine": ..., "date": ..., "repeats": 20, "p50_ms": {...}, "p99_ms": {...},
              "cpus": 2, "peak_rss_bytes": 412000000}}

Inputs come from the model's own `warmup_inputs` (real sentences for minilm, zeros elsewhere), preprocessed
and collated once per batch size, so only the batched model call is timed, as the batcher executes it.
"""

from __future__ import annotations

import platform
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from headroom.models.base import Model


@dataclass(frozen=True, slots=True)
class BatchTiming:
    """Measured predict times at one batch size."""

    batch_size: int  # items per call
    times_s: tuple[float, ...]  # one wall time per repeat

    @property
    def mean_ms(self) -> float:
        return float(np.mean(self.times_s)) * 1e3

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.times_s, q)) * 1e3

    @property
    def cv(self) -> float:
        mean = float(np.mean(self.times_s))
        return float(np.std(self.times_s)) / mean if mean > 0 else 0.0


def default_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to max_batch_size (always including it)."""
    cap = max(1, max_batch_size)
    sizes = [1]
    while sizes[-1] * 2 <= cap:
        sizes.append(sizes[-1] * 2)
    if sizes[-1] != cap:
        sizes.append(cap)
    return tuple(sizes)


def measure_batch(model: Model, batch_size: int, repeats: int, warmup: int = 2) -> BatchTiming:
    """Time `repeats` predict calls on one collated batch of `batch_size` items."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    item = model.preprocess(model.warmup_inputs(batch_size), {})
    batch = model.collate([item])
    for _ in range(warmup):
        model.predict(batch)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.predict(batch)
        times.append(time.perf_counter() - start)
    return BatchTiming(batch_size, tuple(times))


def profile_model(model: Model, batch_sizes: Sequence[int], repeats: int,
                  on_done: Callable[[BatchTiming], None] | None = None) -> list[BatchTiming]:
    results = []
    for size in batch_sizes:
        timing = measure_batch(model, size, repeats)
        results.append(timing)
        if on_done is not None:
            on_done(timing)
    return results


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (getrusage: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def profile_document(model_name: str, timings: Sequence[BatchTiming], repeats: int, cpus: int | None = None,
                     peak_rss_bytes: int | None = None) -> dict[str, object]:
    """The JSON profile (see module docstring). `cpus` (the CPUs the measuring process could run on) and
    `peak_rss_bytes` (its peak resident memory, the model loaded and running) describe the shape the times hold
    for: `headroom deploy k8s --from-profile` sizes a replica's resource requests from them."""
    cvs = [t.cv for t in timings]
    return {
        "name": model_name,
        "service_ms": {str(t.batch_size): round(t.mean_ms, 4) for t in timings},
        "distribution": "lognormal",
        "cv": round(float(np.median(cvs)), 4) if cvs else 0.0,
        "meta": {
            "machine": f"{platform.node()} {platform.machine()} {platform.processor() or ''}".strip(),
            "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "repeats": repeats,
            "p50_ms": {str(t.batch_size): round(t.percentile_ms(50), 4) for t in timings},
            "p99_ms": {str(t.batch_size): round(t.percentile_ms(99), 4) for t in timings},
            "throughput_items_per_s": {str(t.batch_size): round(t.batch_size / (t.mean_ms / 1e3), 2)
                                       for t in timings},
            **({} if cpus is None else {"cpus": cpus}),
            **({} if peak_rss_bytes is None else {"peak_rss_bytes": peak_rss_bytes}),
        },
    }
