"""Napkin math 1.3: 5,000 QPS, p99 50 ms, 5 ms service."""

from __future__ import annotations

import pytest

from headroom.plan.capacity import plan_capacity, utilisation_after_failures


def test_resnet_capacity_example() -> None:
    p = plan_capacity(5000, 0.050, 0.005, headroom=0.3, redundancy=1)
    assert p.max_utilisation == pytest.approx(0.54)
    assert p.required_rate_per_s == pytest.approx(9259.3, abs=0.05)
    assert p.per_replica_rate_per_s == pytest.approx(200)
    assert p.base_replicas == 47
    assert p.replicas_with_headroom == 62
    assert p.recommended_replicas == 62
    assert p.utilisation_after_k_failures == pytest.approx(0.410, abs=0.0005)
    assert p.survives_k_failures


def test_n_plus_2_variants() -> None:
    # N+2: 49 GPUs at the safe utilisation, about 64 to keep 30 % headroom after two failures.
    p = plan_capacity(5000, 0.050, 0.005, headroom=0.3, redundancy=2)
    assert p.min_replicas_n_plus_k == 49
    assert p.headroom_after_k_failures == 64
    assert p.recommended_replicas == 62
    assert p.survives_k_failures


def test_redundancy_dominates_without_headroom() -> None:
    p = plan_capacity(5000, 0.050, 0.005, headroom=0.0, redundancy=3)
    assert p.recommended_replicas == 50
    assert p.utilisation_after_k_failures <= p.max_utilisation


def test_exact_tail_factor_and_measured_rate() -> None:
    p = plan_capacity(5000, 0.050, 0.005, exact=True)
    assert p.max_utilisation == pytest.approx(1 - 0.1 * 4.60517, abs=1e-5)
    q = plan_capacity(1000, 0.050, 0.005, per_replica_rate_per_s=100, headroom=0.0, redundancy=0)
    assert q.base_replicas == 19  # 1000 / 0.54 / 100 = 18.5


def test_after_failures_helper_and_errors() -> None:
    assert utilisation_after_failures(5000, 200, 62, 1) == pytest.approx(5000 / 12200)
    with pytest.raises(ValueError, match="relax the SLO"):
        plan_capacity(100, 0.020, 0.005)
    with pytest.raises(ValueError, match="no replica"):
        utilisation_after_failures(10, 1, 2, 2)
