"""The thread count each step runs with (mechanism; the policy that chooses it is `headroom.llm.threads`).

Shared by the native runner (which hands the count to its C step) and the fp32 torch runner (which sets torch's
intra-op threads through `set_threads`). A native step's result never depends on its thread count, so tuning it
is safe for batch invariance.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from headroom.llm.config import EngineConfig
from headroom.llm.step_batch import ModelBatch
from headroom.llm.threads import ThreadTunerConfig, ThreadTunerState, choose_threads, observe

T = TypeVar("T")


def cpu_threads(requested: int, cpu_count: int) -> int:
    """Intra-op threads to start with: `requested` if > 0; else 1 on a machine with <= 2 CPUs (an OpenMP team as
    wide as the machine stalls badly as soon as anything else runs: a decode step measured 40 ms with 1 thread
    vs 0.2-1.8 s with 2 on a busy 2-core box; the runner then picks per step, see `headroom.llm.threads`),
    else 0 = the default (`default_threads`)."""
    if requested > 0:
        return requested
    return 1 if cpu_count <= 2 else 0


def default_threads() -> int:
    """What torch would use by default, without importing it: $OMP_NUM_THREADS when set, else the physical cores
    among the CPUs this process may run on (hyper-threads share a core's vector units), else the CPU count."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cores: set[tuple[str, str]] = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
        except OSError:
            return len(cpus)
    return len(cores) or len(cpus) or (os.cpu_count() or 1)


class StepThreads:
    """The thread count each step runs with: `num_threads` when set; else on a <= 2-CPU machine chosen per step by
    measuring (`headroom.llm.threads`), else `default()`. `set_threads` applies a count in the calling thread
    (torch's OpenMP counts are per thread); None when the step takes the count as an argument (native)."""

    def __init__(self, engine: EngineConfig, on_cpu: bool, set_threads: Callable[[int], None] | None = None,
                 default: Callable[[], int] = default_threads) -> None:
        cpu_count = os.cpu_count() or 1
        self.now = 0  # what was last set (0 = nothing yet)
        self._set = set_threads
        self._default = default
        self._tuner: ThreadTunerConfig | None = None
        self._state = ThreadTunerState()
        if on_cpu:
            threads = cpu_threads(engine.num_threads, cpu_count)
            if threads:
                self._apply(threads)
            if engine.num_threads <= 0 and 1 < cpu_count <= 2:
                self._tuner = ThreadTunerConfig((1, cpu_count), engine.wide_step_min_tokens)
                self._tuner.validate()

    def _apply(self, threads: int) -> None:
        if self._set is not None:
            self._set(threads)
        self.now = threads

    def means(self) -> dict[tuple[int, int], float]:
        """The tuner's running means, (step-size bucket, threads) -> seconds per token (empty: no tuner)."""
        return dict(self._state.mean_s_per_token)

    def run(self, batch: ModelBatch, forward: Callable[[int], T]) -> T:
        """`forward(threads)` with the chosen thread count, timed for the tuner."""
        tuner = self._tuner
        if tuner is None:
            if not self.now:
                self.now = self._default()  # asked once: it does not change while the process runs
            return forward(self.now)
        num_tokens = sum(len(it.token_ids) for it in batch.items)
        threads = choose_threads(self._state, tuner, num_tokens)
        if threads != self.now:
            self._apply(threads)
        start = time.perf_counter()
        out = forward(threads)
        self._state = observe(self._state, tuner, num_tokens, threads, time.perf_counter() - start)
        return out
