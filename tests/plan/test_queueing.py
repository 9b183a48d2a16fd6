"""Queueing closed forms against the textbook's worked numbers and hand-derived values."""

from __future__ import annotations

import math

import pytest

from headroom.plan import queueing as q


def test_littles_law_napkin_math_1_2() -> None:
    # 1,000 QPS x 50 ms = 50 requests in the system; 50 in flight at 10 ms -> 5,000 req/s; 10 at 10 ms -> 1,000.
    assert q.littles_law_in_system(1000, 0.050) == pytest.approx(50)
    assert q.littles_law_rate_per_s(50, 0.010) == pytest.approx(5000)
    assert q.littles_law_rate_per_s(10, 0.010) == pytest.approx(1000)
    assert q.littles_law_in_system(500, 0.040) == pytest.approx(20)  # self-check answer D
    assert q.littles_law_time_s(20, 500) == pytest.approx(0.040)


def test_table_7_knee() -> None:
    rows = q.knee_table(0.005)
    assert [round(r.latency_multiple, 1) for r in rows] == [2.0, 3.3, 5.0, 10.0, 20.0]
    assert [round(r.mean_latency_s * 1e3) for r in rows] == [10, 17, 25, 50, 100]
    # Section 1.12: at 70 % the p99 is 4.6 / 0.3 = 15.3 x service; 5 ms service: ~76.7 ms at 70 %, ~230 ms at 90 %.
    seventy, ninety = rows[1], rows[3]
    assert seventy.p99_latency_s / 0.005 == pytest.approx(15.33, abs=0.01)
    assert seventy.p99_latency_s * 1e3 == pytest.approx(76.7, abs=0.05)
    assert ninety.p99_latency_s * 1e3 == pytest.approx(230.0)


def test_mm1_self_check_10ms_service() -> None:
    # rho 0.5 -> W = 20 ms; rho 0.9 -> W = 100 ms (a 5x increase).
    assert q.mm1(50, 0.010).mean_time_in_system_s == pytest.approx(0.020)
    assert q.mm1(90, 0.010).mean_time_in_system_s == pytest.approx(0.100)


def test_fallacy_faster_inference_shrinks_the_queue() -> None:
    # 80 % at 5 ms: 20 ms queueing. Same rate at 2 ms: 32 % and 0.9 ms; 21.2x less queueing; 25 -> 2.9 ms.
    before = q.mm1(160, 0.005)
    after = q.mm1(160, 0.002)
    assert before.utilisation == pytest.approx(0.8)
    assert before.mean_wait_s * 1e3 == pytest.approx(20.0)
    assert after.utilisation == pytest.approx(0.32)
    assert after.mean_wait_s * 1e3 == pytest.approx(0.94, abs=0.005)
    assert before.mean_wait_s / after.mean_wait_s == pytest.approx(21.25, abs=0.01)
    assert after.mean_time_in_system_s * 1e3 == pytest.approx(2.94, abs=0.005)
    assert before.mean_time_in_system_s / after.mean_time_in_system_s == pytest.approx(8.5, abs=0.05)


def test_md1_is_half_mm1_wait_and_pk_interpolates() -> None:
    for lam in (20.0, 50.0, 90.0):
        mm, md = q.mm1(lam, 0.01), q.md1(lam, 0.01)
        assert md.mean_wait_s == pytest.approx(mm.mean_wait_s / 2)
        g = q.mg1(lam, 0.01, 0.5)
        assert g.mean_wait_s == pytest.approx(mm.mean_wait_s * (1 + 0.25) / 2)
        assert g.mean_in_queue == pytest.approx(lam * g.mean_wait_s)


def test_mmc_two_servers_at_90_percent() -> None:
    # lambda 90/s, S 20 ms, c 2: a = 1.8, rho 0.9.
    # Erlang C = (a^2/2!)/(1-rho) / (1 + a + (a^2/2!)/(1-rho)) = 16.2 / 19 = 0.852631...
    r = q.mmc(90, 0.020, 2)
    assert r.utilisation == pytest.approx(0.9)
    assert r.prob_wait == pytest.approx(16.2 / 19)
    assert r.mean_wait_s == pytest.approx((16.2 / 19) / (100 - 90))  # 85.26 ms
    assert r.mean_time_in_system_s == pytest.approx((16.2 / 19) / 10 + 0.020)
    assert r.mean_in_system == pytest.approx(90 * r.mean_time_in_system_s)


def test_mmc_with_one_server_is_mm1() -> None:
    a, b = q.mmc(70, 0.01, 1), q.mm1(70, 0.01)
    assert a.prob_wait == pytest.approx(0.7)
    assert a.mean_wait_s == pytest.approx(b.mean_wait_s)


def test_percentiles() -> None:
    # M/M/1 response time is exponential with mean W: p99 = ln(100) W.
    assert q.mm1_response_percentile_s(50, 0.01, 0.99) == pytest.approx(math.log(100) * 0.02)
    # M/M/1 wait: P(Wq > t) = rho e^{-(mu - lambda) t}.
    t = q.mmc_wait_percentile_s(50, 0.01, 1, 0.99)
    assert 0.5 * math.exp(-50 * t) == pytest.approx(0.01)
    assert q.mmc_wait_percentile_s(10, 0.01, 1, 0.5) == 0.0  # 90 % never wait
    # M/D/1: the CDF at 0 is 1 - rho, and the p99 wait sits below M/M/1's.
    assert q.md1_wait_cdf(50, 0.01, 0.0) == pytest.approx(0.5)
    p99_md1 = q.md1_wait_percentile_s(80, 0.01, 0.99)
    assert q.md1_wait_cdf(80, 0.01, p99_md1) == pytest.approx(0.99, abs=1e-4)
    assert p99_md1 < q.mmc_wait_percentile_s(80, 0.01, 1, 0.99)


def test_tail_factor() -> None:
    assert q.tail_factor(0.99) == 4.6
    assert q.tail_factor(0.99, exact=True) == pytest.approx(4.60517, abs=1e-5)


def test_unstable_queue_says_how_to_fix() -> None:
    with pytest.raises(ValueError, match="servers"):
        q.mmc(100, 0.02, 2)
    with pytest.raises(ValueError, match="unstable"):
        q.mm1(200, 0.005)
