"""The per-step thread tuner: a prior before measuring, the faster count once measured, rare exploration."""

from __future__ import annotations

import pytest

from headroom.llm.threads import ThreadTunerConfig, ThreadTunerState, bucket_of, choose_threads, observe

CFG = ThreadTunerConfig(candidates=(1, 2), wide_step_min_tokens=32, explore_every_steps=8, ewma_alpha=0.5)


def _run(state: ThreadTunerState, num_tokens: int, steps: int, s_per_step: dict[int, float]) -> tuple[
    ThreadTunerState, list[int]
]:
    """`steps` steps of `num_tokens` tokens on a machine where a step takes s_per_step[threads] seconds."""
    chosen = []
    for _ in range(steps):
        t = choose_threads(state, CFG, num_tokens)
        chosen.append(t)
        state = observe(state, CFG, num_tokens, t, s_per_step[t])
    return state, chosen


def test_prior_before_any_measurement() -> None:
    assert choose_threads(ThreadTunerState(), CFG, 1) == 1  # a decode of one sequence: one thread
    assert choose_threads(ThreadTunerState(), CFG, 31) == 1
    assert choose_threads(ThreadTunerState(), CFG, 32) == 2  # a full decode batch or a prefill chunk: both
    assert [bucket_of(n) for n in (1, 2, 3, 4, 31, 32)] == [1, 2, 2, 3, 5, 6]


def test_switches_to_two_threads_when_they_measure_faster() -> None:  # a quiet machine
    state, chosen = _run(ThreadTunerState(), 1, 40, {1: 0.030, 2: 0.018})
    assert chosen[:8] == [1] * 7 + [2]  # the prior, until the first exploration (every 8th step)
    # then 2 threads, re-checking 1 every int(8 x 0.030 / 0.018) = 13 steps (steps 12, 25, 38)
    assert [i for i, t in enumerate(chosen) if t == 1 and i >= 8] == [12, 25, 38]
    assert choose_threads(state, CFG, 1) == 2


def test_keeps_one_thread_and_explores_rarely_when_two_stall() -> None:  # a busy machine
    state, chosen = _run(ThreadTunerState(), 1, 8 * 10 * 4, {1: 0.030, 2: 0.300})
    # tried once at step 7; 10x slower, so retried only every 8 x 10 steps (79, 159, 239, 319)
    assert [i for i, t in enumerate(chosen) if t == 2] == [7, 79, 159, 239, 319]
    assert choose_threads(state, CFG, 1) == 1


def test_follows_a_change_of_load_and_buckets_are_separate() -> None:
    state, _ = _run(ThreadTunerState(), 64, 40, {1: 0.20, 2: 0.12})
    assert choose_threads(state, CFG, 64) == 2
    state, chosen = _run(state, 64, 200, {1: 0.20, 2: 2.0})  # someone takes the other core
    assert chosen[-20:].count(1) >= 19
    assert choose_threads(state, CFG, 1) == 1  # the 1-token bucket was never measured: its prior


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="candidates"):
        ThreadTunerConfig(candidates=()).validate()
    with pytest.raises(ValueError, match="explore_every_steps"):
        ThreadTunerConfig(candidates=(1, 2), explore_every_steps=1).validate()
