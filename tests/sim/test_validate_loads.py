"""`headroom.sim.validate_loads`: the judged loads as target utilisations, found on the simulator."""

from __future__ import annotations

import pytest

from headroom.batching.policy import BatchPolicyConfig
from headroom.sim.config import SimConfig
from headroom.sim.profile import ServiceProfile
from headroom.sim.validate_loads import rate_for_utilisation, simulated_utilisation


def _dynamic(max_batch_size: int = 32) -> SimConfig:
    policy = BatchPolicyConfig(mode="dynamic", max_batch_size=max_batch_size, max_queue_delay_s=0.005)
    return SimConfig(replicas=1, batching="dynamic", policy=policy, seed=0)


def test_without_batching_the_rate_is_the_utilisation_over_the_service_time() -> None:
    profile = ServiceProfile.constant(0.010)  # deterministic 10 ms: utilisation = rate x 10 ms
    cfg = SimConfig(replicas=1, batching="none", seed=0)
    found = rate_for_utilisation(0.5, cfg, profile, duration_s=200.0, seed=3, capacity_per_s=100.0)
    assert found.utilisation == pytest.approx(0.5, abs=0.002)
    assert found.rate_per_s == pytest.approx(50.0, rel=0.03)  # the seeded schedule's own rate is ~50/s
    again = rate_for_utilisation(0.5, cfg, profile, duration_s=200.0, seed=3, capacity_per_s=100.0)
    assert again == found  # same seed, same schedule, same search


def test_with_dynamic_batching_a_capacity_fraction_understates_how_busy_the_server_is() -> None:
    profile = ServiceProfile.linear(0.005, 0.001, max_batch_size=32)  # small batches cost more per item
    cfg = _dynamic()
    capacity = 32 / profile.mean_service_s(32)  # full batches: ~865 req/s
    found = rate_for_utilisation(0.7, cfg, profile, duration_s=20.0, seed=1, capacity_per_s=capacity)
    assert found.utilisation == pytest.approx(0.7, abs=0.002)
    assert found.rate_per_s < 0.7 * capacity  # 70 % busy is reached well before 70 % of the full-batch capacity
    assert simulated_utilisation(0.7 * capacity, cfg, profile, 20.0, 1) > 0.8
    assert 0 < found.iterations <= 40


def test_a_higher_target_needs_a_higher_rate() -> None:
    profile = ServiceProfile.linear(0.005, 0.001, max_batch_size=32)
    capacity = 32 / profile.mean_service_s(32)
    rates = [rate_for_utilisation(u, _dynamic(), profile, 20.0, 1, capacity).rate_per_s for u in (0.3, 0.5, 0.7)]
    assert rates == sorted(rates) and len(set(rates)) == 3


@pytest.mark.parametrize("target", [0.0, 1.0, -0.2, 1.3])
def test_a_target_outside_zero_one_is_refused(target: float) -> None:
    with pytest.raises(ValueError, match="utilisation"):
        rate_for_utilisation(target, SimConfig(seed=0), ServiceProfile.constant(0.01), 10.0, 0, 100.0)


def test_a_capacity_hint_far_too_low_is_reported() -> None:
    cfg = SimConfig(replicas=1, batching="none", seed=0)
    with pytest.raises(ValueError, match="stays under"):  # 1.5 req/s x 10 ms never makes the server 50 % busy
        rate_for_utilisation(0.5, cfg, ServiceProfile.constant(0.010), 50.0, 0, capacity_per_s=1.0)
