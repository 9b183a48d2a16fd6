"""`headroom sim --validate`, the report's calibration sections: what each calibration pass measured, how the
in-service slowdown was derived, where the host-CPU split came from. Pure functions of the measurements."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from headroom.sim.calibrate import Overhead
from headroom.sim.cpu_share import stretch_factor
from headroom.sim.profile import ServiceProfile
from headroom.sim.slowdown import expected_busy_per_batch_s
from headroom.sim.validate_compare import opt_ms, opt_round

if TYPE_CHECKING:
    from headroom.sim.validate import ValidateConfig


def with_batch_overhead(profile: ServiceProfile, per_batch_s: float) -> ServiceProfile:
    """The profile with a constant executor cost added to every batch size's mean."""
    return replace(profile, service_times_s=tuple(t + per_batch_s for t in profile.service_times_s),
                   name=f"{profile.name} + {per_batch_s * 1e3:.3f} ms/batch")


def overhead_json(o: Overhead) -> dict[str, Any]:
    return {"mode": f"open loop, Poisson {o.rate_per_s:.2f} req/s" if o.rate_per_s else "single-stream closed loop",
            "per_request_ms": opt_ms(o.per_request_s), "per_batch_ms": opt_ms(o.per_batch_s),
            "p50_ms": opt_ms(o.single_stream_p50_s), "compute_p50_ms": opt_ms(o.single_stream_compute_p50_s),
            "host_cpu_per_request_ms": opt_ms(o.host_cpu_per_request_s), "server_cpu_s": round(o.server_cpu_s, 3),
            "batch_threads_cpu_s": round(o.batch_threads_cpu_s, 3), "requests": o.requests, "batches": o.batches,
            "busy_per_batch_ms": opt_ms(o.busy_per_batch_s), "mean_batch_size": opt_round(o.mean_batch_size),
            "batch_threads_cpu_per_batch_ms": opt_ms(o.batch_threads_cpu_s / o.batches) if o.batches else None}


def slowdown_report(open_loop: Overhead | None, single: Overhead, profile: ServiceProfile, host_cost: float,
                     cfg: ValidateConfig, scale: float = 1.0) -> dict[str, Any]:
    """How the in-service slowdown (`SimConfig.service_time_scale`) was measured, and what it compares."""
    if open_loop is None:
        return {"service_time_scale": 1.0, "measured": "not measured (calibration_load 0): the profile as is"}
    expected = expected_busy_per_batch_s(with_batch_overhead(profile, open_loop.per_batch_s),
                                         max(1.0, open_loop.mean_batch_size))
    single_expected = expected_busy_per_batch_s(with_batch_overhead(profile, single.per_batch_s),
                                                max(1.0, single.mean_batch_size))
    return {"service_time_scale": round(scale, 4),
            "measured": f"open-loop Poisson at {open_loop.rate_per_s:.2f} req/s ({cfg.calibration_load:g} of the "
                        f"calibration capacity) for {cfg.calibration_duration_s:g} s: executor time per batch / "
                        f"(profile + per-batch cost at the mean batch size x host-CPU stretch at that rate)",
            "busy_per_batch_ms": opt_ms(open_loop.busy_per_batch_s), "expected_busy_per_batch_ms": opt_ms(expected),
            "host_stretch_at_rate": opt_round(stretch_factor(open_loop.rate_per_s, host_cost)),
            "mean_batch_size": opt_round(open_loop.mean_batch_size),
            "batch_threads_cpu_per_batch_ms": opt_ms(open_loop.batch_threads_cpu_s / max(1, open_loop.batches)),
            "single_stream_ratio": opt_round(single.busy_per_batch_s / single_expected) if single.batches else None}


def split_source(high: Overhead | None, per_batch_s: float) -> str:
    """Which calibration passes the per-request / per-batch host-CPU split came from."""
    if per_batch_s <= 0:
        return "all per request"
    far = "the high-load open-loop pass" if high is not None and high.batches else "the saturation pass"
    return f"per request + per batch from the low-load open-loop pass and {far}"
