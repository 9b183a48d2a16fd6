"""`headroom sim --validate`, the judged loads: which arrival rate each requested load means.

The issue's target is stated in *utilisation* ("p50 and p99 within 15 % up to 70 % utilisation"), the fraction
of wall time the model is busy. For a server without batching that is rate x service time, a fixed fraction of
its capacity. With dynamic batching it is not: batches are small at moderate rates, and small batches cost more
per item, so a server offered 70 % of its full-batch capacity is much busier than 70 % (measured on minilm: 88 %
busy, past the knee). Two bases, therefore:

* ``utilisation`` (default): the rate at which the *calibrated simulator* keeps the model busy that fraction of
  the time, on the very arrival schedule the bench will send (same seed, so the search is deterministic); found by
  bisection, since utilisation grows with the rate. The real server's own busy fraction at that rate is measured
  and reported beside it (`headroom_busy_seconds_total` over the run's wall time);
* ``capacity``: a fraction of the calibrated model's full-batch capacity (`effective_capacity_per_s`), the
  behaviour before this module.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from headroom.loadgen.arrivals import ArrivalSpec, make_schedule
from headroom.sim.config import SimConfig
from headroom.sim.engine import simulate
from headroom.sim.profile import ServiceProfile

LOAD_BASES = ("utilisation", "capacity")


@dataclass(frozen=True, slots=True)
class RateSearch:
    """The outcome of `rate_for_utilisation`."""

    rate_per_s: float  # the arrival rate found
    utilisation: float  # the simulator's utilisation at that rate (on the seeded schedule)
    iterations: int  # simulations run by the bisection


def simulated_utilisation(rate_per_s: float, sim_cfg: SimConfig, profile: ServiceProfile, duration_s: float,
                          seed: int) -> float:
    """The simulator's busy fraction under Poisson arrivals at `rate_per_s` for `duration_s`, on the schedule
    `seed` draws (the one the bench sends for that seed)."""
    spec = ArrivalSpec(kind="poisson", rate_per_s=rate_per_s, duration_s=duration_s)
    arrivals = make_schedule(spec, np.random.default_rng(seed))
    return float(simulate(replace(sim_cfg, seed=seed), profile, arrivals).utilisation)


def rate_for_utilisation(target: float, sim_cfg: SimConfig, profile: ServiceProfile, duration_s: float, seed: int,
                         capacity_per_s: float, tolerance: float = 0.002, max_iterations: int = 40) -> RateSearch:
    """The Poisson rate at which the simulator's utilisation is `target` (within `tolerance`), searched between 0
    and 1.5 x `capacity_per_s` (the full-batch capacity: utilisation reaches 1 at or below it). ValueError for a
    target outside (0, 1) or a model the simulator never keeps that busy below 1.5 x capacity."""
    if not 0 < target < 1:
        raise ValueError(f"a target utilisation must be in (0, 1), got {target}")
    if not capacity_per_s > 0 or duration_s <= 0:
        raise ValueError(f"capacity_per_s and duration_s must be > 0, got {capacity_per_s}, {duration_s}")
    lo, hi = 0.0, 1.5 * capacity_per_s
    if simulated_utilisation(hi, sim_cfg, profile, duration_s, seed) < target:
        raise ValueError(f"the simulator stays under {target:.0%} utilisation even at {hi:,.1f} req/s "
                         "(1.5 x the calibrated capacity): check the profile and the capacity")
    rate, util, runs = hi, 1.0, 0
    while runs < max_iterations:
        rate = (lo + hi) / 2
        util = simulated_utilisation(rate, sim_cfg, profile, duration_s, seed)
        runs += 1
        if abs(util - target) <= tolerance:
            break
        if util < target:
            lo = rate
        else:
            hi = rate
    return RateSearch(rate_per_s=rate, utilisation=util, iterations=runs)
