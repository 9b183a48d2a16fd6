"""The in-service slowdown: its measurement (pure, hand-computed) and the simulator's one seam for it."""

from __future__ import annotations

import numpy as np
import pytest

from headroom.sim.config import SimConfig
from headroom.sim.engine import simulate
from headroom.sim.profile import ServiceProfile
from headroom.sim.slowdown import effective_capacity_per_s, expected_busy_per_batch_s, service_time_scale

# 10 ms + 5 ms per item: T(1) = 15 ms, T(2) = 20 ms, T(4) = 30 ms (deterministic)
PROFILE = ServiceProfile.linear(0.010, 0.005, max_batch_size=8)


def test_expected_batch_time_interpolates_the_profile_at_the_mean_batch_size() -> None:
    assert expected_busy_per_batch_s(PROFILE, 1.0) == pytest.approx(0.015)
    # 80 % batches of 1 and 20 % of 2: mean 1.2, mean time 0.8 x 15 + 0.2 x 20 = 16 ms
    assert expected_busy_per_batch_s(PROFILE, 1.2) == pytest.approx(0.016)
    with pytest.raises(ValueError, match="mean_batch_size"):
        expected_busy_per_batch_s(PROFILE, 0.5)


def test_scale_is_measured_time_over_profile_time_with_the_host_stretch_divided_out() -> None:
    assert service_time_scale(0.020, 1.2, PROFILE) == pytest.approx(0.020 / 0.016)  # 1.25
    # at 50 req/s with 2 ms of host work each the core is 10 % host work: stretch 1 / 0.9
    assert service_time_scale(0.020, 1.2, PROFILE, rate_per_s=50.0, host_cost_s=0.002) == pytest.approx(1.125)
    assert service_time_scale(0.015, 1.0, PROFILE) == pytest.approx(1.0)  # the profile holds: no slowdown


@pytest.mark.parametrize(("busy", "rate", "cost"), [(0.0, 0.0, 0.0), (float("nan"), 0.0, 0.0), (0.02, 500.0, 0.002)])
def test_scale_refuses_an_empty_measurement_or_a_core_full_of_host_work(busy: float, rate: float,
                                                                        cost: float) -> None:
    with pytest.raises(ValueError):
        service_time_scale(busy, 1.0, PROFILE, rate, cost)


def test_effective_capacity_counts_the_slowdown_and_the_host_work() -> None:
    # B = 4, T(4) = 30 ms, slowed 1.5x -> 45 ms, plus 4 x 2 ms of host work: 4 / 53 ms
    assert effective_capacity_per_s(4, 0.030, 0.002, scale=1.5) == pytest.approx(4 / 0.053)
    assert effective_capacity_per_s(4, 0.030, 0.0) == pytest.approx(4 / 0.030)
    # plus 3 ms of front-end work per batch: 4 / 56 ms
    assert effective_capacity_per_s(4, 0.030, 0.002, scale=1.5, host_per_batch_s=0.003) == pytest.approx(4 / 0.056)
    with pytest.raises(ValueError):
        effective_capacity_per_s(4, 0.030, 0.0, scale=0.0)


def test_the_simulator_multiplies_every_batch_time_by_the_scale() -> None:
    """One request per batch, 10 ms each, slowed 1.5x -> 15 ms on the virtual clock. Arrivals at 0, 5 and
    100 ms: the first is served 0-15 ms (latency 15), the second waits for it and is served 15-30 ms
    (latency 25), the third finds the server idle (latency 15)."""
    arrivals = np.array([0.0, 0.005, 0.100])
    profile = ServiceProfile.constant(0.010)
    res = simulate(SimConfig(batching="none", service_time_scale=1.5), profile, arrivals)
    assert sorted(res.latencies_s.tolist()) == pytest.approx([0.015, 0.015, 0.025])
    assert res.busy_s == pytest.approx(0.045)
    plain = simulate(SimConfig(batching="none"), profile, arrivals)
    assert sorted(plain.latencies_s.tolist()) == pytest.approx([0.010, 0.010, 0.015])


def test_the_scale_applies_before_the_host_cpu_stretch() -> None:
    """A lone request at t = 0.002 s with 1 ms of host work: the host work occupies [1 ms, 2 ms], the batch
    (10 ms x 2 = 20 ms) starts at 2 ms and nothing else arrives: latency 20 ms exactly."""
    res = simulate(SimConfig(batching="none", service_time_scale=2.0, host_cpu_per_request_s=0.001),
                   ServiceProfile.constant(0.010), np.array([0.002]))
    assert res.latencies_s.tolist() == pytest.approx([0.020])


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf")])
def test_a_scale_that_is_not_a_positive_ratio_is_refused(scale: float) -> None:
    with pytest.raises(ValueError, match="service_time_scale"):
        SimConfig(service_time_scale=scale)


def test_continuous_batching_refuses_a_scale() -> None:
    with pytest.raises(ValueError, match="continuous"):
        SimConfig(batching="continuous", service_time_scale=1.2)
