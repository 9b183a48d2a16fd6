"""Continuous batching: iteration-level joins, exact timings, and why it beats static batching for LLMs."""

from __future__ import annotations

import numpy as np
import pytest

from headroom.batching.policy import BatchPolicyConfig
from headroom.loadgen.arrivals import poisson
from headroom.sim.config import SimConfig
from headroom.sim.engine import simulate
from headroom.sim.profile import LlmProfile, ServiceProfile


def _llm(output_tokens: int = 10, prefill_ms_per_token: float = 0.0, slots: int = 8,
         dist: str = "fixed") -> ServiceProfile:
    llm = LlmProfile(prefill_s_per_token=prefill_ms_per_token / 1e3, decode_sizes=(1, 8),
                     decode_step_s=(0.010, 0.010), max_num_seqs=slots, prompt_tokens=100,
                     output_tokens=output_tokens, output_dist=dist)
    return ServiceProfile.constant(0.010, llm=llm, name="toy-llm")


def test_single_sequence_timing() -> None:
    # prefill 100 tokens x 0.1 ms = 10 ms in the first iteration, then 10 iterations of 10 ms.
    r = simulate(SimConfig(batching="continuous"), _llm(prefill_ms_per_token=0.1), np.array([0.0]))
    assert r.completed == 1
    assert r.p50_latency_s == pytest.approx(0.010 + 10 * 0.010)
    assert r.mean_ttft_s == pytest.approx(0.020)


def test_a_late_arrival_joins_at_the_next_iteration_boundary() -> None:
    # A at 0 (10 tokens, ends at 100 ms). B at 25 ms joins at the 30 ms boundary, ends 10 iterations later.
    r = simulate(SimConfig(batching="continuous"), _llm(), np.array([0.0, 0.025]))
    assert sorted(r.latencies_s.tolist()) == pytest.approx([0.100, 0.130 - 0.025])
    assert r.mean_ttft_s == pytest.approx((0.010 + (0.040 - 0.025)) / 2)
    assert r.mean_batch_size > 1


def test_single_sequence_token_latencies() -> None:
    # TTFT = prefill (100 tokens x 0.1 ms) + one decode step; every later token one step (10 ms).
    r = simulate(SimConfig(batching="continuous"), _llm(prefill_ms_per_token=0.1), np.array([0.0]))
    for q in (50, 90, 99):
        assert getattr(r, f"ttft_p{q}_s") == pytest.approx(0.010 + 0.010)
        assert getattr(r, f"tpot_p{q}_s") == pytest.approx(0.010)
        assert getattr(r, f"itl_p{q}_s") == pytest.approx(0.010)
    assert r.mean_tpot_s == pytest.approx(0.010) and r.mean_itl_s == pytest.approx(0.010)
    m = r.summary()
    assert m["ttft_p99_s"] == pytest.approx(0.020) and m["tpot_p50_s"] == pytest.approx(0.010)


def test_a_joining_prefill_stretches_the_running_sequences_token_gap() -> None:
    # A at 0: first token at 20 ms (10 ms prefill + 10 ms step), then 10 ms steps. B arrives at 25 ms, joins at
    # the 30 ms boundary: that iteration runs B's 10 ms prefill too, so A's next token comes 20 ms later (at 50).
    # A ends at 120 ms (10 tokens), B at 140 ms. ITLs: A 8 x 10 ms + 1 x 20 ms, B 9 x 10 ms.
    r = simulate(SimConfig(batching="continuous"), _llm(prefill_ms_per_token=0.1), np.array([0.0, 0.025]))
    assert sorted(r.latencies_s.tolist()) == pytest.approx([0.115, 0.120])
    assert [r.ttft_p50_s, r.ttft_p99_s] == pytest.approx(np.percentile([0.020, 0.025], [50, 99]).tolist())
    assert [r.tpot_p50_s, r.tpot_p99_s] == pytest.approx(
        np.percentile([(0.120 - 0.020) / 9, (0.140 - 0.050) / 9], [50, 99]).tolist())
    gaps = [0.010] * 17 + [0.020]
    assert [r.itl_p50_s, r.itl_p90_s, r.itl_p99_s] == pytest.approx(np.percentile(gaps, [50, 90, 99]).tolist())
    assert r.mean_itl_s == pytest.approx(float(np.mean(gaps)))


def test_without_prefill_cost_every_token_gap_is_one_step_at_any_load() -> None:
    arrivals = poisson(40, 30.0, np.random.default_rng(3))
    r = simulate(SimConfig(batching="continuous", replicas=2, router="least_outstanding", warmup_s=5.0, seed=3),
                 _llm(output_tokens=12, slots=4, dist="geometric"), arrivals)
    assert r.completed == r.offered > 900
    assert r.max_queue_depth > 4  # the slots were full: requests queued, TTFT includes that wait
    for q in (50, 90, 99):
        assert getattr(r, f"itl_p{q}_s") == pytest.approx(0.010)
        assert getattr(r, f"tpot_p{q}_s") == pytest.approx(0.010)
    assert r.ttft_p50_s >= 0.010 - 1e-12
    assert r.ttft_p99_s > r.ttft_p50_s


def test_slots_limit_the_running_set() -> None:
    r = simulate(SimConfig(batching="continuous"), _llm(slots=1), np.array([0.0, 0.0]))
    assert sorted(r.latencies_s.tolist()) == pytest.approx([0.100, 0.200])
    assert r.mean_batch_size == pytest.approx(1.0)


def test_continuous_beats_static_on_the_tail_with_uneven_outputs() -> None:
    """Simulator page experiments 1-2: static batching suffers head-of-line blocking; continuous does not."""
    arrivals = poisson(30, 120.0, np.random.default_rng(4))
    llm = _llm(output_tokens=20, slots=16, dist="geometric")
    cont = simulate(SimConfig(batching="continuous", seed=4), llm, arrivals)
    # Static: a batch of 16 runs as long as its longest sequence, ~20 x H(16) = 68 iterations; take 60.
    static_profile = ServiceProfile((1, 16), (0.010 * 60, 0.010 * 60))
    static = simulate(SimConfig(batching="static", seed=4,
                                policy=BatchPolicyConfig(max_batch_size=16, static_timeout_s=1.0)),
                      static_profile, arrivals)
    assert cont.completed == static.completed == arrivals.size
    assert cont.p99_latency_s < static.p99_latency_s
    assert cont.p50_latency_s < static.p50_latency_s


def test_requests_that_waited_past_their_timeout_are_shed() -> None:
    # One slot, 10 iterations of 10 ms each: the second request would start at 100 ms, past its 50 ms deadline.
    r = simulate(SimConfig(batching="continuous", timeout_s=0.050), _llm(slots=1), np.array([0.0, 0.0, 0.2]))
    assert r.completed == 2
    assert r.expired == 1
