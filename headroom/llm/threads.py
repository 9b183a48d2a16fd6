"""Intra-op threads per step on CPU, chosen by measuring (policy only; the runner applies it).

An OpenMP team as wide as the CPUs is a gamble: with those CPUs free it speeds up big steps (32-row matmuls, prefill
chunks) and maybe single-sequence decode; with another process on one of them every OpenMP barrier (one per op)
waits for a time slice (on a 2-core box a one-token step went from ~35 ms to 0.1-1 s). Which count wins depends on
the machine and its load *now*, so the candidates come from the machine (1, 2, 4, ... up to the CPUs this process
may run on, `usable_cpus`: its affinity mask, so `taskset` and cgroup cpusets count, not the host's CPU count) and
the tuner keeps, per step-size bucket (tokens in the step, powers of two), the median of the last few steps'
seconds per token for each thread count, uses the fastest, and now and then runs a step with another to notice when
the load changes. A median, not a running mean: the first decode steps on a wider team were measured at up to 4x
their steady time (24 ms against 6 ms, a served 2-core EPYC), and a running mean seeded by such an outlier kept the
faster count unused for hundreds of steps, since the alternative is retried the more rarely the worse it looked
(served one-stream TPOT 8.1-8.8 ms against 6.7-7.0 ms with 2 threads fixed). It starts from a prior (every CPU for
steps of at least `wide_step_min_tokens` tokens, 1 thread below), so nothing is explored blindly. Exploration is
rarer the worse the alternative measured (every `explore_every_steps` x ratio steps), which bounds its cost to about
`explore_run_steps`/`explore_every_steps` of a step. An exploration runs the other count for `explore_run_steps`
consecutive steps, and the first step after any change of thread count is not measured: waking or parking OpenMP
workers made that step ~10 ms (~20%) slower here, which biased a one-step probe against the wider team and kept
single-sequence decode on 1 thread on a quiet machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace


@dataclass(frozen=True, slots=True)
class ThreadTunerConfig:
    """Settings of the tuner."""

    candidates: tuple[int, ...]  # thread counts it chooses between, e.g. (1, 2)
    wide_step_min_tokens: int = 32  # prior: steps of at least this many tokens start at the widest candidate
    explore_every_steps: int = 64  # per bucket, a burst in this many steps (x the measured ratio) tries the other
    window_steps: int = 5  # per (bucket, threads): the estimate is the median of this many latest measured steps
    explore_run_steps: int = 3  # steps per exploration burst (the first one, right after the switch, is not measured)

    def validate(self) -> None:
        """Raise ValueError on settings that cannot work."""
        if not self.candidates or min(self.candidates) < 1:
            raise ValueError("thread candidates must be >= 1")
        if not 2 <= self.explore_run_steps < self.explore_every_steps or self.window_steps < 1:
            raise ValueError(
                "need 2 <= explore_run_steps < explore_every_steps (the first step after a switch is not "
                "measured) and window_steps >= 1"
            )


@dataclass(frozen=True, slots=True)
class ThreadTunerState:
    """What the tuner has measured."""

    # (bucket, threads) -> seconds per token of steps run with that many threads: the median of `recent`
    mean_s_per_token: Mapping[tuple[int, int], float] = field(default_factory=dict)
    recent: Mapping[tuple[int, int], tuple[float, ...]] = field(default_factory=dict)  # the latest window_steps
    steps: Mapping[int, int] = field(default_factory=dict)  # bucket -> steps seen in it
    last_threads: int = 0  # thread count of the previous step (0 = none yet): a step after a change is not measured


def bucket_of(num_tokens: int) -> int:
    """Step-size bucket: 1 token -> 1, 2-3 -> 2, 4-7 -> 3, ... (bit length)."""
    return max(num_tokens, 1).bit_length()


def _prior(cfg: ThreadTunerConfig, num_tokens: int) -> int:
    return max(cfg.candidates) if num_tokens >= cfg.wide_step_min_tokens else min(cfg.candidates)


def choose_threads(state: ThreadTunerState, cfg: ThreadTunerConfig, num_tokens: int) -> int:
    """Thread count for the next step of `num_tokens` tokens."""
    b = bucket_of(num_tokens)
    means = {c: state.mean_s_per_token[(b, c)] for c in cfg.candidates if (b, c) in state.mean_s_per_token}
    prior = _prior(cfg, num_tokens)
    best = min(means, key=lambda c: means[c]) if means else prior
    others = [c for c in cfg.candidates if c != best]
    if not others:
        return best
    n = state.steps.get(b, 0)
    # the least-measured alternative; explore it once in `explore_every_steps` x (how much worse it was)
    alt = min(others, key=lambda c: (c in means, means.get(c, 0.0)))
    ratio = means[alt] / means[best] if alt in means and means[best] > 0 else 1.0
    period = int(cfg.explore_every_steps * max(1.0, min(ratio, 16.0)))
    return alt if n % period >= period - cfg.explore_run_steps else best


def observe(
    state: ThreadTunerState, cfg: ThreadTunerConfig, num_tokens: int, threads: int, elapsed_s: float
) -> ThreadTunerState:
    """The state after a step of `num_tokens` tokens ran with `threads` threads in `elapsed_s` seconds."""
    b = bucket_of(num_tokens)
    steps = dict(state.steps)
    steps[b] = steps.get(b, 0) + 1
    if threads != state.last_threads:  # the team was just resized: this step's time is not representative
        return replace(state, steps=steps, last_threads=threads)
    per_token = elapsed_s / max(num_tokens, 1)
    window = (*state.recent.get((b, threads), ()), per_token)[-cfg.window_steps :]
    ordered = sorted(window)
    recent, means = dict(state.recent), dict(state.mean_s_per_token)
    recent[(b, threads)] = window
    means[(b, threads)] = ordered[(len(ordered) - 1) // 2]  # the lower median: one outlier of two is not believed
    return replace(state, mean_s_per_token=means, recent=recent, steps=steps)


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask (`taskset`, cgroup cpusets), else the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # platforms without sched_getaffinity (macOS)
        return os.cpu_count() or 1


def thread_candidates(cpus: int) -> tuple[int, ...]:
    """The thread counts worth measuring on `cpus` CPUs: 1, 2, 4, ... below `cpus`, and `cpus` itself."""
    if cpus < 1:
        raise ValueError(f"cpus must be >= 1, got {cpus}")
    counts, c = [], 1
    while c < cpus:
        counts.append(c)
        c *= 2
    return (*counts, cpus)


def thread_plan(requested: int, cpus: int) -> tuple[int, ThreadTunerConfig | None]:
    """(threads to start with, the tuner or None) for `num_threads` = `requested` on `cpus` usable CPUs: an
    explicit count is used as given; 0 = auto starts on 1 thread and, with more than one CPU, tunes per step."""
    if requested > 0:
        return requested, None
    if cpus <= 1:
        return 1, None
    tuner = ThreadTunerConfig(thread_candidates(cpus))
    tuner.validate()
    return 1, tuner
