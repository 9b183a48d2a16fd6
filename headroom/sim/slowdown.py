"""In-service slowdown: how much longer a batch takes inside the loaded server than the isolated profile says.

The service-time profile times `predict` back to back on a quiet core. Inside the server under open-loop
load the same batch can take longer for reasons the queueing model does not see: idle gaps between batches
(cold caches and predictors after the core idled), the load generator busy on the neighbouring core (on a
VM, vCPUs that share a physical core or a host quota), the event loop's work interleaved with the batch.
On the 2-vCPU bench machine the batch thread's *CPU time* per batch grows, not its run-queue wait, so this
is not processor sharing (that part is `headroom.sim.cpu_share`).

`service_time_scale` measures it once, on a calibration pass apart from the judged loads (open-loop Poisson
at a low rate, e.g. 0.15 of the isolated capacity): the server's executor time per batch over what the
profile (plus the per-batch executor cost) gives at the pass's mean batch size, with the host-CPU stretch
expected at the pass's rate divided out (the simulator applies that stretch itself). The simulator then
multiplies every batch's service time by it (`SimConfig.service_time_scale`) and the validation takes its
load fractions of the capacity that implies (`effective_capacity_per_s`). Pure functions.
"""

from __future__ import annotations

import math

from headroom.sim.cpu_share import stretch_factor
from headroom.sim.profile import ServiceProfile


def expected_busy_per_batch_s(profile: ServiceProfile, mean_batch_size: float) -> float:
    """The profile's batch time at a (fractional) mean batch size, interpolated between its points. Exact
    for the mean of a mix of sizes on one linear segment (e.g. batches of 1 and 2 at a low load)."""
    if not mean_batch_size >= 1:
        raise ValueError(f"mean_batch_size must be >= 1, got {mean_batch_size}")
    return profile.interpolated_service_s(mean_batch_size)


def service_time_scale(busy_per_batch_s: float, mean_batch_size: float, profile: ServiceProfile,
                       rate_per_s: float = 0.0, host_cost_s: float = 0.0) -> float:
    """Measured executor seconds per batch / (profile time at the mean batch size x the host-CPU stretch at
    `rate_per_s` with `host_cost_s` per arrival). `profile` must already include the per-batch executor cost.
    ValueError when the measurement is empty or the host work alone would fill the core."""
    if not (busy_per_batch_s > 0 and math.isfinite(busy_per_batch_s)):
        raise ValueError(f"busy_per_batch_s must be > 0 and finite (did the calibration pass run any batch?), "
                         f"got {busy_per_batch_s}")
    stretch = stretch_factor(rate_per_s, host_cost_s)
    if not math.isfinite(stretch):
        raise ValueError(f"host work alone fills the core at {rate_per_s:g} req/s x {host_cost_s * 1e3:g} ms: "
                         "calibrate at a lower rate")
    return busy_per_batch_s / (expected_busy_per_batch_s(profile, mean_batch_size) * stretch)


def effective_capacity_per_s(batch_size: int, batch_s: float, host_cost_s: float, scale: float = 1.0,
                             host_per_batch_s: float = 0.0) -> float:
    """Requests per second at full batches of `batch_size` taking `batch_s` in the profile (executor cost
    included), slowed by `scale`, each request also costing `host_cost_s` of the model's core and each batch
    `host_per_batch_s` (back to back, every batch's front-end work delays the next):
    ``B / (scale x T(B) + B x host_cost_s + host_per_batch_s)``."""
    if batch_size < 1 or batch_s <= 0 or host_cost_s < 0 or host_per_batch_s < 0 or not scale > 0:
        raise ValueError("batch_size must be >= 1, batch_s > 0, host costs >= 0 and scale > 0")
    return batch_size / (scale * batch_s + batch_size * host_cost_s + host_per_batch_s)
