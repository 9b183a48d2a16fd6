"""Batching equations 4 and 8-15 against the textbook's tables."""

from __future__ import annotations

import pytest

from headroom.plan import batching as b

RESNET = b.LinearServiceTime(fixed_s=0.005, per_item_s=0.0006)  # T_svc(B) = 5 ms + 0.6 ms * B


def test_equation_4_formation_delay() -> None:
    # 500 QPS, batch 1 -> 32: wait 0 -> 31 ms; total 2 ms -> 46 ms (23x) with T_inf(32) = 15 ms.
    assert b.formation_delay_s(1, 500) == 0
    assert b.formation_delay_s(32, 500) * 1e3 == pytest.approx(31.0)
    total = b.size_triggered_latency_s(32, 500, 0.015)
    assert total * 1e3 == pytest.approx(46.0)
    assert total / b.size_triggered_latency_s(1, 500, 0.002) == pytest.approx(23.0)


def test_equation_8_half_window() -> None:
    assert b.window_mean_wait_s(0.020) == pytest.approx(0.010)


def test_table_9_derived_columns() -> None:
    measured_ms = {1: 5.0, 4: 7.2, 8: 9.1, 16: 14.0, 32: 25.0}

    def measured(batch_size: int) -> float:
        return measured_ms[batch_size] / 1e3

    tput = {k: round(b.effective_capacity_per_s(k, measured)) for k in measured_ms}
    assert tput == {1: 200, 4: 556, 8: 879, 16: 1143, 32: 1280}
    assert tput[32] / tput[1] == pytest.approx(6.4)
    assert tput[8] / tput[1] == pytest.approx(4.4, abs=0.01)


def test_table_10_batch_variability() -> None:
    expected = {  # rate: (mean, std, P(0) %, P(>= 2 mean) %), each within half a unit of its last shown digit
        50: (0.5, 0.7, (61, 0.5), (39, 0.5)),
        200: (2, 1.4, (14, 0.5), (14, 0.5)),
        500: (5, 2.2, (0.7, 0.05), (3, 0.5)),
        1000: (10, 3.2, (0.005, 0.0005), (0.3, 0.05)),
    }
    for rate, (mean, std, (p0, tol0), (p2, tol2)) in expected.items():
        s = b.batch_size_stats(rate, 0.010)
        assert s.mean == pytest.approx(mean)
        assert s.std == pytest.approx(std, abs=0.05)
        assert s.prob_empty * 100 == pytest.approx(p0, abs=tol0)
        assert s.prob_at_least_double * 100 == pytest.approx(p2, abs=tol2)


def test_table_11_linear_service_model() -> None:
    rows = {k: (RESNET(k) * 1e3, (RESNET(k) + 0.010) * 1e3, b.effective_capacity_per_s(k, RESNET))
            for k in (1, 4, 8, 16, 32)}
    assert [round(v[0], 1) for v in rows.values()] == [5.6, 7.4, 9.8, 14.6, 24.2]
    assert [round(v[1], 1) for v in rows.values()] == [15.6, 17.4, 19.8, 24.6, 34.2]
    assert [round(v[2]) for v in rows.values()] == [179, 541, 816, 1096, 1322]
    assert b.served_throughput_per_s(500, 32, RESNET) == 500


def test_example_1_7_efficiency() -> None:
    assert b.batch_efficiency(1, 0.005, 0.0006) == pytest.approx(0.107, abs=0.001)
    assert b.batch_efficiency(32, 0.005, 0.0006) == pytest.approx(0.79, abs=0.005)


def test_equation_12_b_max() -> None:
    # T_window/2 + 5 + 0.6 B <= 50 ms with a 5 ms window -> B <= 70.8.
    assert b.max_batch_under_slo(0.050, 0.005, RESNET) == 70
    assert b.max_batch_under_slo(0.004, 0.0, RESNET) == 0


def test_equation_13_envelope() -> None:
    # 500 QPS, 10 ms: mean batch seen 6, p99 12; mean 13.6 ms; envelope 22.2 ms (1.63x).
    e = b.envelope(500, 0.010, RESNET)
    assert e.mean_batch_seen == pytest.approx(6)
    assert e.p99_batch_seen == 12
    assert e.mean_latency_s * 1e3 == pytest.approx(13.6)
    assert e.envelope_s * 1e3 == pytest.approx(22.2)
    assert e.envelope_s / e.mean_latency_s == pytest.approx(1.63, abs=0.005)


def test_table_14_practical_config() -> None:
    # 30 % of a 50 ms SLO -> 15 ms max window; chosen 12 ms with B_max 32 at 500 QPS; efficiency 0.89.
    e = b.envelope(500, 0.012, RESNET, max_batch_size=32, efficiency=0.89)
    assert e.mean_batch_seen == pytest.approx(7)
    assert e.p99_batch_seen == 13
    assert e.envelope_s * 1e3 == pytest.approx(24.8)
    assert e.saturated_capacity_per_s == pytest.approx(1176.9, abs=0.05)
    assert e.served_per_s == 500


def test_table_15_adaptive_window() -> None:
    expected = {100: (15.8, 1.6, 40.8), 500: (7.1, 3.5, 32.1), 1000: (5.0, 5.0, 30.0), 5000: (2.24, 11.2, 27.2)}
    for rate, (window_ms, batch, latency_ms) in expected.items():
        w = b.adaptive_window(rate, 0.050, 0.025)
        assert w.window_s * 1e3 == pytest.approx(window_ms, abs=0.05 if rate != 5000 else 0.005)
        assert w.mean_batch == pytest.approx(batch, abs=0.05)
        assert w.latency_budget_s * 1e3 == pytest.approx(latency_ms, abs=0.05)


def test_adaptive_window_capped_by_slo() -> None:
    assert b.adaptive_window(1, 0.030, 0.025).window_s == pytest.approx(0.005)


def test_poisson_helpers() -> None:
    assert sum(b.poisson_pmf(k, 3.0) for k in range(60)) == pytest.approx(1.0)
    assert b.poisson_quantile(0.99, 5.0) == 11
    assert b.poisson_pmf(0, 0.0) == 1.0
