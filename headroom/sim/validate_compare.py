"""`headroom sim --validate`, one load: simulate the bench's own arrival schedule and compare with the real run.

`compare_load` runs the simulator on the schedule the bench sent (same seed), with and without the host-CPU
terms, adds the calibrated fixed per-request cost, and reports p50/p99/mean-batch errors plus the server's own
usage during the load (diagnostics that never feed the simulation). The orchestration (profile, server,
calibration passes, loads) is `headroom.sim.validate`.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from headroom.loadgen.arrivals import ArrivalSpec, make_schedule
from headroom.sim.calibrate import Overhead
from headroom.sim.config import SimConfig
from headroom.sim.cpu_share import stretch_factor
from headroom.sim.engine import simulate
from headroom.sim.profile import ServiceProfile
from headroom.sim.slowdown import service_time_scale

if TYPE_CHECKING:
    from headroom.sim.validate import ValidateConfig


def relative_error(sim: float, real: float) -> float:
    """(sim - real) / real; nan when either is missing or real is 0."""
    if not (math.isfinite(sim) and math.isfinite(real)) or real == 0:
        return math.nan
    return (sim - real) / real


def opt_ms(seconds: float) -> float | None:
    """Seconds as milliseconds rounded to 4 places; None (JSON null) when not finite."""
    return round(seconds * 1e3, 4) if math.isfinite(seconds) else None


def opt_round(value: float) -> float | None:
    """`value` rounded to 4 places; None (JSON null) when not finite."""
    return round(value, 4) if math.isfinite(value) else None


def _pcts(latencies_s: npt.NDArray[np.float64]) -> tuple[float, float]:
    if not latencies_s.size:
        return math.nan, math.nan
    p50, p99 = np.percentile(latencies_s, [50, 99])
    return float(p50), float(p99)


def host_share(profile: ServiceProfile, server_cores: int, model_threads: int) -> float:
    """The share of host CPU that costs the model time: the share of the server's cores the model keeps busy
    while it predicts, the profile's `busy_fraction` (1 when the profile does not say) x min(1, threads /
    cores). A preempted intra-op thread stalls its operator, so a model with a thread on every core loses the
    whole host cost; one that sleeps loses nothing."""
    busy = min(1.0, max(0.0, float(profile.meta.get("busy_fraction", 1.0))))
    return busy * min(1.0, max(1, model_threads) / max(1, server_cores))


def host_cost_s(overhead: Overhead, profile: ServiceProfile, server_cores: int, model_threads: int) -> float:
    """Model seconds lost per arrival (`SimConfig.host_cpu_per_request_s`): the host CPU per request x
    `host_share`."""
    return overhead.host_cpu_per_request_s * host_share(profile, server_cores, model_threads)


def host_config(sim_cfg: SimConfig, on: bool, host_cost: float, host_batch: float) -> SimConfig:
    """`sim_cfg` with the host-CPU terms (`on`: per arrival and per batch) or without them."""
    return replace(sim_cfg, host_cpu_per_request_s=host_cost if on else 0.0,
                   host_cpu_per_batch_s=host_batch if on else 0.0)


def _simulated(sim_cfg: SimConfig, profile: ServiceProfile, overhead: Overhead, arrivals: npt.NDArray[np.float64],
               seed: int) -> tuple[Any, tuple[float, float], tuple[float, float]]:
    res = simulate(sim_cfg, profile, arrivals)
    fixed = _pcts(res.latencies_s + overhead.per_request_s)
    drawn = _pcts(res.latencies_s + overhead.draw(res.latencies_s.size, np.random.default_rng(seed + 7)))
    return res, fixed, drawn


def compare_load(fraction: float, rate: float, real: dict[str, Any], sim_cfg: SimConfig, profile: ServiceProfile,
                 overhead: Overhead, spec: ArrivalSpec, seed: int, cfg: ValidateConfig,
                 host_cost: float = 0.0, host_batch: float = 0.0) -> dict[str, Any]:
    """Simulate one load on the bench's own schedule (with and without the host-CPU term) and compare with the
    bench's result; the judged simulation is the one `cfg.host_cpu` selects."""
    arrivals = make_schedule(spec, np.random.default_rng(seed))
    judged_cfg = host_config(sim_cfg, cfg.host_cpu, host_cost, host_batch)
    other_cfg = host_config(sim_cfg, not cfg.host_cpu, host_cost, host_batch)
    res, fixed_pct, drawn_pct = _simulated(judged_cfg, profile, overhead, arrivals, seed)
    _, alt_fixed, alt_drawn = _simulated(other_cfg, profile, overhead, arrivals, seed)
    sim_p50, sim_p99 = fixed_pct if cfg.overhead == "fixed" else drawn_pct
    alt_p50, alt_p99 = alt_fixed if cfg.overhead == "fixed" else alt_drawn
    real_p50 = float(real["latency_ms"]["p50_ms"]) / 1e3
    real_p99 = float(real["latency_ms"]["p99_ms"]) / 1e3
    stages = real.get("server_timing_ms", {})
    means = real.get("server_metrics", {}).get("window_means", {})
    real_batch = next((float(v) for k, v in means.items() if k.startswith("headroom_batch_size{")), math.nan)
    e50, e99 = relative_error(sim_p50, real_p50), relative_error(sim_p99, real_p99)
    judged = fraction <= cfg.pass_up_to_load + 1e-9
    ok = all(math.isfinite(e) and abs(e) <= cfg.target_rel_error for e in (e50, e99))
    at_batch = max(1, round(real_batch)) if math.isfinite(real_batch) else 0
    usage = dict(real.get("server_usage", {}))
    if usage.get("busy_per_batch_ms") is not None and usage.get("batch_thread_wait_per_batch_ms") is not None:
        # host work the model expects during a batch; the rest of the batch thread's run-queue wait is time
        # other processes (or anything unmodelled) took from it
        expected = rate * host_cost * usage["busy_per_batch_ms"]
        usage["host_wait_expected_per_batch_ms"] = round(expected, 3)
        usage["wait_unexplained_per_batch_ms"] = round(usage["batch_thread_wait_per_batch_ms"] - expected, 3)
    if usage.get("busy_per_batch_ms") and (usage.get("mean_batch_size") or 0) >= 1 and rate * host_cost < 1:
        # the in-service slowdown as the calibration pass measures it, here at this load (diagnostic only)
        usage["slowdown_at_load"] = round(service_time_scale(usage["busy_per_batch_ms"] / 1e3,
                                                             usage["mean_batch_size"], profile, rate, host_cost), 4)
    return {
        "load_fraction": fraction, "load_basis": cfg.load_basis, "rate_per_s": rate, "requests": int(arrivals.size),
        "real": {"p50_ms": opt_ms(real_p50), "p99_ms": opt_ms(real_p99), "mean_batch_size": opt_round(real_batch),
                 "completed": real["counts"]["completed"],
                 "compute_mean_ms": stages.get("compute", {}).get("mean_ms"),
                 "queue_mean_ms": stages.get("queue", {}).get("mean_ms"),
                 "throughput_per_s": real["throughput"]["requests_per_s"], "errors": real["counts"]["errors"],
                 "late_fraction": real["generator"]["late_fraction"], "valid": real["scenario"]["valid"],
                 "utilisation": usage.get("utilisation"),
                 "server_usage": usage},
        "sim": {"p50_ms": opt_ms(sim_p50), "p99_ms": opt_ms(sim_p99), "mean_batch_size": opt_round(res.mean_batch_size),
                "utilisation": opt_round(res.utilisation), "throughput_per_s": res.throughput_per_s,
                "overhead": cfg.overhead, "host_cpu": cfg.host_cpu, "mean_wait_ms": opt_ms(res.mean_wait_s),
                "busy_per_batch_ms": opt_ms(res.busy_s / max(1.0, res.completed / max(res.mean_batch_size, 1e-9))),
                "profile_ms_at_real_batch": opt_ms(profile.mean_service_s(at_batch)) if at_batch else None,
                "mean_stretch_at_rate": opt_round(stretch_factor(rate, host_cost))},
        "sim_fixed_overhead": {"p50_ms": opt_ms(fixed_pct[0]), "p99_ms": opt_ms(fixed_pct[1]),
                               "rel_error_p50": opt_round(relative_error(fixed_pct[0], real_p50)),
                               "rel_error_p99": opt_round(relative_error(fixed_pct[1], real_p99))},
        "sim_empirical_overhead": {"p50_ms": opt_ms(drawn_pct[0]), "p99_ms": opt_ms(drawn_pct[1]),
                                   "rel_error_p50": opt_round(relative_error(drawn_pct[0], real_p50)),
                                   "rel_error_p99": opt_round(relative_error(drawn_pct[1], real_p99))},
        f"sim_{'without' if cfg.host_cpu else 'with'}_host_cpu": {
            "p50_ms": opt_ms(alt_p50), "p99_ms": opt_ms(alt_p99),
            "rel_error_p50": opt_round(relative_error(alt_p50, real_p50)),
            "rel_error_p99": opt_round(relative_error(alt_p99, real_p99))},
        "rel_error": {"p50": opt_round(e50), "p99": opt_round(e99),
                      "mean_batch_size": opt_round(relative_error(res.mean_batch_size, real_batch))},
        "judged": judged, "pass": ok if judged else None,
    }
