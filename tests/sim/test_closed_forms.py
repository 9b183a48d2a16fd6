"""The simulator against M/M/1, M/D/1 and M/M/c mean waits (within 3 %), at several utilisations.

The reference is evaluated at the load the run was actually offered (realised arrival rate, realised mean
service time), so the check measures the simulator's queueing, not the sampling noise of the inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

from headroom.loadgen.arrivals import poisson
from headroom.plan import queueing
from headroom.sim.config import SimConfig
from headroom.sim.engine import simulate
from headroom.sim.profile import ServiceProfile

REQUESTS = 100_000


def _run(rho: float, servers: int, service_s: float, distribution: str, seed: int,
         requests: int = REQUESTS) -> tuple[float, float, float]:
    rate = rho * servers / service_s
    duration_s = requests / rate
    arrivals = poisson(rate, duration_s, np.random.default_rng(seed))
    cfg = SimConfig(replicas=servers, batching="none", shared_queue=True, seed=seed)
    result = simulate(cfg, ServiceProfile.constant(service_s, distribution=distribution), arrivals)
    assert result.completed == arrivals.size
    assert result.utilisation == pytest.approx(rho, rel=0.03)
    return result.mean_wait_s, arrivals.size / duration_s, result.busy_s / result.completed


@pytest.mark.parametrize("rho", [0.3, 0.5, 0.7])
def test_mm1_mean_wait(rho: float) -> None:
    wait, rate, service = _run(rho, 1, 0.010, "exponential", seed=11)
    assert wait == pytest.approx(queueing.mm1(rate, service).mean_wait_s, rel=0.03)


@pytest.mark.parametrize("rho", [0.3, 0.5, 0.7])
def test_md1_mean_wait(rho: float) -> None:
    wait, rate, service = _run(rho, 1, 0.010, "deterministic", seed=12)
    assert service == pytest.approx(0.010)
    assert wait == pytest.approx(queueing.md1(rate, service).mean_wait_s, rel=0.03)


@pytest.mark.parametrize(("servers", "rho"), [(2, 0.5), (2, 0.7), (3, 0.6)])
def test_mmc_mean_wait(servers: int, rho: float) -> None:
    # Several servers make the mean wait a rarer, noisier quantity: 150k requests keep its error near 1 %.
    wait, rate, service = _run(rho, servers, 0.020, "exponential", seed=13, requests=150_000)
    assert wait == pytest.approx(queueing.mmc(rate, service, servers).mean_wait_s, rel=0.03)


def test_md1_is_not_mm1() -> None:
    """The check can fail: a deterministic server's wait is about half an exponential one's."""
    wait_d, rate, service = _run(0.5, 1, 0.010, "deterministic", seed=14, requests=20_000)
    assert wait_d < 0.6 * queueing.mm1(rate, service).mean_wait_s


@pytest.mark.slow
@pytest.mark.parametrize("rho", [0.3, 0.5, 0.7, 0.8, 0.9])
def test_closed_forms_long_runs(rho: float) -> None:
    """A million requests per model and utilisation, up to 90 % (run with -m slow)."""
    wait, rate, service = _run(rho, 1, 0.010, "exponential", seed=21, requests=1_000_000)
    assert wait == pytest.approx(queueing.mm1(rate, service).mean_wait_s, rel=0.03)
    wait, rate, service = _run(rho, 1, 0.010, "deterministic", seed=22, requests=1_000_000)
    assert wait == pytest.approx(queueing.md1(rate, service).mean_wait_s, rel=0.03)
    wait, rate, service = _run(rho, 4, 0.020, "exponential", seed=23, requests=1_000_000)
    assert wait == pytest.approx(queueing.mmc(rate, service, 4).mean_wait_s, rel=0.03)
