"""Host CPU sharing (headroom.sim.cpu_share) and its one seam in the simulator: hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from headroom.sim.config import SimConfig
from headroom.sim.cpu_share import (
    HostBacklog,
    add_work,
    advance,
    arrivals_between,
    batch_end_s,
    effective_capacity_per_s,
    split_host_cpu,
    stretch_factor,
)
from headroom.sim.engine import simulate
from headroom.sim.profile import ServiceProfile


def test_arrivals_during_a_batch_each_add_their_host_work() -> None:
    arrivals = [0.0, 5.0, 6.0, 20.0]
    backlog = advance(HostBacklog(), arrivals, 0.0, 1.0)
    assert backlog == HostBacklog(next_arrival=1, host_free_s=0.0)  # arrival 0's work ran in [-1, 0]
    # work 10 from t=0: preempted by the work of the arrivals at 5 (in [4, 5]) and 6 (in [5, 6]) -> ends at 12
    assert batch_end_s(0.0, 10.0, arrivals, backlog, 1.0) == pytest.approx(12.0)
    assert arrivals_between(arrivals, 0.0, 12.0) == 2


def test_a_burst_before_the_start_delays_the_batch_by_its_backlog() -> None:
    arrivals = [0.0, 0.5, 0.5]
    backlog = advance(HostBacklog(), arrivals, 0.5, 1.0)
    assert backlog.host_free_s == pytest.approx(2.0)  # three jobs of 1 s released at -1, -0.5, -0.5: done at 2
    assert batch_end_s(0.5, 3.0, arrivals, backlog, 1.0) == pytest.approx(5.0)


def test_no_host_cost_leaves_the_batch_alone_and_bad_inputs_are_refused() -> None:
    assert batch_end_s(3.0, 2.0, [3.5, 4.0], HostBacklog(), 0.0) == 5.0
    with pytest.raises(ValueError):
        batch_end_s(0.0, -1.0, [], HostBacklog(), 0.1)
    with pytest.raises(ValueError):
        SimConfig(host_cpu_per_request_s=-0.001)
    with pytest.raises(ValueError, match="continuous"):
        SimConfig(batching="continuous", host_cpu_per_request_s=0.001)


def test_mean_stretch_matches_the_processor_sharing_formula() -> None:
    rate, cost, work = 100.0, 0.003, 0.050  # host work fills 30 % of the core: stretch 1 / 0.7
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(1 / rate, 200_000)).tolist()
    starts = np.sort(rng.uniform(10.0, arrivals[-1] - 10.0, 2_000)).tolist()
    backlog, ratios = HostBacklog(), []
    for s in starts:
        backlog = advance(backlog, arrivals, s, cost)
        ratios.append((batch_end_s(s, work, arrivals, backlog, cost) - s) / work)
    assert float(np.mean(ratios)) == pytest.approx(stretch_factor(rate, cost), rel=0.03)
    assert stretch_factor(1000.0, 0.001) == math.inf


def test_effective_capacity_charges_each_request_its_host_work() -> None:
    assert effective_capacity_per_s(32, 0.150, 0.002) == pytest.approx(32 / (0.150 + 0.064))
    # at that rate the stretched full batch takes exactly B / rate: the server is saturated
    cap = effective_capacity_per_s(1, 0.010, 0.002)
    assert 0.010 * stretch_factor(cap, 0.002) == pytest.approx(1 / cap)
    with pytest.raises(ValueError):
        effective_capacity_per_s(0, 0.01, 0.0)


def test_simulator_stretches_each_batch_by_the_arrivals_host_work() -> None:
    cfg = SimConfig(batching="none", host_cpu_per_request_s=0.001)
    res = simulate(cfg, ServiceProfile.constant(0.010), np.array([0.0, 0.004, 0.030]))
    # batch 1: [0, 11] ms (the 4-ms arrival's work ran in [3, 4]); batch 2: [11, 21]; batch 3: [30, 40]
    assert sorted(res.latencies_s.tolist()) == pytest.approx([0.010, 0.011, 0.017])
    assert res.busy_s == pytest.approx(0.031)
    plain = simulate(SimConfig(batching="none"), ServiceProfile.constant(0.010), np.array([0.0, 0.004, 0.030]))
    assert sorted(plain.latencies_s.tolist()) == pytest.approx([0.010, 0.010, 0.016])


def test_simulated_service_time_under_poisson_load_follows_the_mean_stretch() -> None:
    rate, cost = 60.0, 0.002
    arrivals = np.cumsum(np.random.default_rng(1).exponential(1 / rate, 6_000))
    res = simulate(SimConfig(batching="none", host_cpu_per_request_s=cost, seed=1),
                   ServiceProfile.constant(0.010), arrivals)
    assert res.busy_s / res.completed == pytest.approx(0.010 * stretch_factor(rate, cost), rel=0.03)


def test_host_cpu_splits_into_per_request_and_per_batch_work() -> None:
    # 0.8 ms per request + 1.2 ms per batch: 2.0 ms/request at B = 1, 0.95 ms/request at B = 8
    per_request, per_batch = split_host_cpu(0.0020, 1.0, 0.0008 + 0.0012 / 8, 8.0)
    assert per_request == pytest.approx(0.0008) and per_batch == pytest.approx(0.0012)
    assert split_host_cpu(0.002, 1.0, 0.0025, 8.0) == (0.002, 0.0)  # did not fall: all per request
    assert split_host_cpu(0.002, 1.0, 0.001, 1.2) == (0.002, 0.0)  # batch sizes too close to tell
    assert split_host_cpu(0.002, 1.0, 0.0001, 2.0) == pytest.approx((0.0, 0.002))  # would go negative: per batch
    with pytest.raises(ValueError):
        split_host_cpu(0.002, 0.5, 0.001, 8.0)


def test_per_batch_host_work_delays_only_a_batch_that_starts_behind_it() -> None:
    """10 ms batches of one request, 2 ms of front-end work at each completion. Arrivals at 0, 1 and 50 ms:
    the first is served 0-10 ms; its completion work holds the core 10-12 ms, so the second (queued since
    1 ms) runs 12-22 ms: latency 21 ms instead of 19; the third finds the core free (latency 10)."""
    arrivals = np.array([0.0, 0.001, 0.050])
    cfg = SimConfig(batching="none", host_cpu_per_batch_s=0.002)
    res = simulate(cfg, ServiceProfile.constant(0.010), arrivals)
    assert sorted(res.latencies_s.tolist()) == pytest.approx([0.010, 0.010, 0.021])
    plain = simulate(SimConfig(batching="none"), ServiceProfile.constant(0.010), arrivals)
    assert sorted(plain.latencies_s.tolist()) == pytest.approx([0.010, 0.010, 0.019])
    backlog = add_work(HostBacklog(), 0.010, 0.002)
    assert backlog.host_free_s == pytest.approx(0.012)
    assert batch_end_s(0.010, 0.010, [], backlog, 0.0) == pytest.approx(0.022)
    assert add_work(backlog, 0.011, 0.001).host_free_s == pytest.approx(0.013)  # queues behind pending work
    with pytest.raises(ValueError):
        add_work(backlog, 0.0, -1.0)
    with pytest.raises(ValueError, match="host_cpu_per_batch_s"):
        SimConfig(host_cpu_per_batch_s=-0.001)
