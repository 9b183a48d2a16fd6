"""Cost per inference: example 1.3, table 22 and the GPU-vs-CPU self-check."""

from __future__ import annotations

import pytest

from headroom.plan.cost import InstanceOption, compare, cost_per_million, parse_option


def test_example_1_3_cost_of_latency() -> None:
    a = cost_per_million(4.0, 200)
    b = cost_per_million(4.0, 800)
    assert a == pytest.approx(5.56, abs=0.005)
    assert b == pytest.approx(1.39, abs=0.005)
    assert a / b == pytest.approx(4.0)


def test_table_22_resnet_cost() -> None:
    assert cost_per_million(0.17, 50) == pytest.approx(0.94, abs=0.005)
    assert cost_per_million(0.53, 400) == pytest.approx(0.37, abs=0.005)
    assert cost_per_million(3.06, 1200) == pytest.approx(0.71, abs=0.005)


def test_gpu_vs_cpu_at_low_load() -> None:
    # 5 QPS: one $0.20/h CPU (20 QPS) beats one $2/h GPU (200 QPS) running at 2.5 %, wasting $1.95/h idle.
    rows = compare([InstanceOption("gpu", 2.0, 200), InstanceOption("cpu", 0.2, 20)], 5)
    assert [r.name for r in rows] == ["cpu", "gpu"]
    gpu = rows[1]
    assert gpu.instances == 1
    assert gpu.utilisation == pytest.approx(0.025)
    assert gpu.fleet_hourly_cost - rows[0].fleet_hourly_cost == pytest.approx(1.80)
    # At capacity the unit cost is the same (both $2.78 per million).
    assert gpu.cost_per_million_at_capacity == pytest.approx(rows[0].cost_per_million_at_capacity)


def test_compare_sizes_fleets_with_a_utilisation_cap() -> None:
    rows = compare([InstanceOption("t4", 0.53, 400)], 1000, max_utilisation=0.7)
    assert rows[0].instances == 4  # 1000 / 280 = 3.6


def test_parse_option() -> None:
    assert parse_option("g4dn.xlarge:0.53:400") == InstanceOption("g4dn.xlarge", 0.53, 400)
    with pytest.raises(ValueError, match="NAME:HOURLY_COST"):
        parse_option("t4:0.53")
