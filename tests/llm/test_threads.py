"""The per-step thread tuner: a prior before measuring, the faster count once measured, rare exploration in
short bursts whose first step (right after the team is resized) is not measured."""

from __future__ import annotations

import os

import pytest

from headroom.llm.threads import (
    ThreadTunerConfig,
    ThreadTunerState,
    bucket_of,
    choose_threads,
    observe,
    thread_candidates,
    thread_plan,
    usable_cpus,
)

CFG = ThreadTunerConfig(candidates=(1, 2), wide_step_min_tokens=32, explore_every_steps=8, window_steps=1)


def _run(
    state: ThreadTunerState, num_tokens: int, steps: int, s_per_step: dict[int, float], switch_s: float = 0.0,
    cfg: ThreadTunerConfig = CFG,
) -> tuple[ThreadTunerState, list[int]]:
    """`steps` steps of `num_tokens` tokens on a machine where a step takes s_per_step[threads] seconds, plus
    `switch_s` when the thread count differs from the previous step's."""
    chosen: list[int] = []
    for _ in range(steps):
        t = choose_threads(state, cfg, num_tokens)
        extra = switch_s if chosen and chosen[-1] != t else 0.0
        chosen.append(t)
        state = observe(state, cfg, num_tokens, t, s_per_step[t] + extra)
    return state, chosen


def test_prior_before_any_measurement() -> None:
    assert choose_threads(ThreadTunerState(), CFG, 1) == 1  # a decode of one sequence: one thread
    assert choose_threads(ThreadTunerState(), CFG, 31) == 1
    assert choose_threads(ThreadTunerState(), CFG, 32) == 2  # a full decode batch or a prefill chunk: both
    assert [bucket_of(n) for n in (1, 2, 3, 4, 31, 32)] == [1, 2, 2, 3, 5, 6]


def test_switches_to_two_threads_when_they_measure_faster() -> None:  # a quiet machine
    state, chosen = _run(ThreadTunerState(), 1, 40, {1: 0.030, 2: 0.018})
    # the prior until the first burst (steps 5-7 of every 8); step 5 is the switch, step 6 measures 2 threads
    assert chosen[:7] == [1] * 5 + [2, 2]
    # then 2 threads, re-checking 1 in bursts of 3 every int(8 x 0.030 / 0.018) = 13 steps (phases 10-12)
    assert [i for i, t in enumerate(chosen) if t == 1 and i >= 7] == [10, 11, 12, 23, 24, 25, 36, 37, 38]
    assert choose_threads(state, CFG, 1) == 2


def test_the_step_after_a_switch_does_not_count() -> None:
    # resizing the OpenMP team costs the next step 12 ms: a one-step probe would see 2 threads at 36 ms vs
    # 32 ms and stay on 1 forever; the burst measures them at their real 24 ms
    state, chosen = _run(ThreadTunerState(), 1, 60, {1: 0.032, 2: 0.024}, switch_s=0.012)
    assert choose_threads(state, CFG, 1) == 2 and chosen[-8:].count(2) >= 5
    assert state.mean_s_per_token[(1, 2)] == pytest.approx(0.024)
    assert state.mean_s_per_token[(1, 1)] == pytest.approx(0.032)


def test_keeps_one_thread_and_explores_rarely_when_two_stall() -> None:  # a busy machine
    state, chosen = _run(ThreadTunerState(), 1, 8 * 10 * 4, {1: 0.030, 2: 0.300})
    # tried at steps 5-6 (6 measured: 10x slower), then only in bursts at phases 77-79 of every 80 steps
    bursts = [5, 6, 77, 78, 79, 157, 158, 159, 237, 238, 239, 317, 318, 319]
    assert [i for i, t in enumerate(chosen) if t == 2] == bursts
    assert choose_threads(state, CFG, 1) == 1


def test_follows_a_change_of_load_and_buckets_are_separate() -> None:
    state, _ = _run(ThreadTunerState(), 64, 40, {1: 0.20, 2: 0.12})
    assert choose_threads(state, CFG, 64) == 2
    state, chosen = _run(state, 64, 200, {1: 0.20, 2: 2.0})  # someone takes the other core
    assert chosen[-20:].count(1) >= 17  # at most one 3-step burst of 2 threads in 20 steps
    assert choose_threads(state, CFG, 1) == 1  # the 1-token bucket was never measured: its prior


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="candidates"):
        ThreadTunerConfig(candidates=()).validate()
    with pytest.raises(ValueError, match="explore_run_steps"):
        ThreadTunerConfig(candidates=(1, 2), explore_every_steps=3, explore_run_steps=3).validate()
    with pytest.raises(ValueError, match="explore_run_steps"):
        ThreadTunerConfig(candidates=(1, 2), explore_run_steps=1).validate()
    with pytest.raises(ValueError, match="window_steps"):
        ThreadTunerConfig(candidates=(1, 2), window_steps=0).validate()


def test_candidates_come_from_the_cpus_this_process_may_use() -> None:
    assert usable_cpus() == len(os.sched_getaffinity(0))  # taskset / cpusets, not the host's count
    assert [thread_candidates(n) for n in (1, 2, 3, 6, 16)] == [(1,), (1, 2), (1, 2, 3), (1, 2, 4, 6),
                                                                (1, 2, 4, 8, 16)]
    assert thread_plan(3, 16) == (3, None)  # an explicit count is used as given, never tuned
    assert thread_plan(0, 1) == (1, None)  # one CPU: nothing to choose
    for cpus in (2, 6, 64):
        start, tuner = thread_plan(0, cpus)
        assert start == 1 and tuner is not None and tuner.candidates == thread_candidates(cpus)
    with pytest.raises(ValueError, match="cpus must be >= 1"):
        thread_candidates(0)


def test_the_tuner_finds_the_fastest_of_many_counts() -> None:
    """A 8-CPU machine where 4 threads are fastest for one-token steps (8 oversubscribe a busy machine)."""
    cfg = ThreadTunerConfig(candidates=thread_candidates(8), explore_every_steps=8, window_steps=1)
    state, chosen = _run(ThreadTunerState(), 1, 300, {1: 0.040, 2: 0.025, 4: 0.015, 8: 0.030}, cfg=cfg)
    assert set(chosen) == {1, 2, 4, 8}  # every count was measured
    # then 4, re-checking the runner-up (2) in bursts of 3 every int(8 x 0.025 / 0.015) = 13 steps
    assert choose_threads(state, cfg, 1) == 4 and chosen[-100:].count(4) >= 75
    assert set(chosen[-100:]) == {2, 4}


def test_one_outlier_does_not_keep_the_faster_count_unused() -> None:
    """Served on a quiet 2-core EPYC, the first measured 2-thread decode step took 24 ms against ~6 ms steady and 9 ms
    on 1 thread; a running mean seeded by it kept decode on 1 thread for hundreds of steps. The median of the last
    steps believes the steady time as soon as a second 2-thread step is measured."""
    cfg = ThreadTunerConfig(candidates=(1, 2), explore_every_steps=8)  # the default window
    state, chosen, seen_two = ThreadTunerState(), [], 0
    for _ in range(120):
        t = choose_threads(state, cfg, 1)
        first_measured_two = t == 2 and bool(chosen) and chosen[-1] == 2 and seen_two == 0
        seen_two += t == 2 and bool(chosen) and chosen[-1] == 2  # measured 2-thread steps so far
        chosen.append(t)
        state = observe(state, cfg, 1, t, 0.024 if first_measured_two else {1: 0.009, 2: 0.006}[t])
    assert state.mean_s_per_token[(1, 2)] == pytest.approx(0.006)
    # settled on 2 threads; 1 is retried in 3-step bursts every ~8 x 9 / 6 = 12 steps: ~30 of the last 40 on 2
    assert chosen[-40:].count(2) >= 28
    assert state.recent[(1, 2)][0] != pytest.approx(0.024)  # the outlier has left the window


def test_a_lasting_change_of_load_is_followed_with_the_default_window() -> None:
    cfg = ThreadTunerConfig(candidates=(1, 2), explore_every_steps=8)
    state, _ = _run(ThreadTunerState(), 1, 60, {1: 0.009, 2: 0.006}, cfg=cfg)
    assert choose_threads(state, cfg, 1) == 2
    state, chosen = _run(state, 1, 60, {1: 0.009, 2: 0.060}, cfg=cfg)  # another process takes a core
    assert chosen[:4] == [2, 2, 2, 1]  # three slow steps make the median slow, then 1 thread
    assert chosen[-20:].count(1) >= 17 and choose_threads(state, cfg, 1) == 1
