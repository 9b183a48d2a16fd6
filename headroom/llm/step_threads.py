"""The thread count each step runs with (mechanism; the policy that chooses it is `headroom.llm.threads`).

Shared by the native runner (which hands the count to its C step) and the fp32 torch runner (which sets torch's
intra-op threads through `set_threads`). A native step's result never depends on its thread count, so tuning it
is safe for batch invariance.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from headroom.llm.config import EngineConfig
from headroom.llm.step_batch import ModelBatch
from headroom.llm.threads import (
    ThreadTunerConfig,
    ThreadTunerState,
    choose_threads,
    observe,
    thread_plan,
    usable_cpus,
)

T = TypeVar("T")


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
    """The thread count each step runs with: `num_threads` when set; else chosen per step by measuring among counts
    up to the CPUs this process may use (`headroom.llm.threads.thread_plan`); off the CPU, `default()`.
    `set_threads` applies a count in the calling thread (torch's OpenMP counts are per thread); None when the step
    takes the count as an argument (native)."""

    def __init__(self, engine: EngineConfig, on_cpu: bool, set_threads: Callable[[int], None] | None = None,
                 default: Callable[[], int] = default_threads) -> None:
        self.now = 0  # what was last set (0 = nothing yet)
        self._set_in = 0  # the thread it was set in (OpenMP counts are per calling thread)
        self._set = set_threads
        self._default = default
        self._tuner: ThreadTunerConfig | None = None
        self._state = ThreadTunerState()
        if on_cpu:
            threads, self._tuner = thread_plan(engine.num_threads, usable_cpus())
            self._apply(threads)

    def _apply(self, threads: int) -> None:
        if self._set is not None:
            self._set(threads)
        self.now, self._set_in = threads, threading.get_ident()

    def means(self) -> dict[tuple[int, int], float]:
        """The tuner's estimates (medians of recent steps): (step-size bucket, threads) -> seconds per token (empty:
        no tuner)."""
        return dict(self._state.mean_s_per_token)

    def run(self, batch: ModelBatch, forward: Callable[[int], T]) -> T:
        """`forward(threads)` with the chosen thread count (applied again when called from another thread, e.g. the
        engine loop's own), timed for the tuner."""
        tuner = self._tuner
        if tuner is None:
            if not self.now:
                self.now = self._default()  # asked once: it does not change while the process runs
            elif self._set is not None and threading.get_ident() != self._set_in:
                self._apply(self.now)
            return forward(self.now)
        num_tokens = sum(len(it.token_ids) for it in batch.items)
        threads = choose_threads(self._state, tuner, num_tokens)
        if threads != self.now or threading.get_ident() != self._set_in:
            self._apply(threads)
        start = time.perf_counter()
        out = forward(threads)
        self._state = observe(self._state, tuner, num_tokens, threads, time.perf_counter() - start)
        return out
