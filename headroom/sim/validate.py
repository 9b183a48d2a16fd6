"""`headroom sim --validate`: the simulator checked against the real server.

Steps (`run_validation`):

1. service-time profile: the batched predict call by batch size, timed here on the bench's own samples
   (preprocessed and collated as the server does), on the server's CPUs with the server's thread count
   (`headroom.sim.validate_profile`), or `--profile FILE`;
2. the real server: `python -m headroom.cli.main serve --model M [--cpus C]` in a subprocess on a free loopback
   port (`headroom.sim.calibrate.real_server`); this process (the load generator) moves to `--generator-cpus`;
3. calibration (`headroom.sim.calibrate`), four passes apart from the judged loads: a closed-loop,
   single-stream run gives the per-batch executor cost that defines the *isolated* capacity,
   B_max / (T(B_max) + per-batch); a closed-loop saturation run (2 x B_max in flight, `saturation`) gives the
   throughput the server really sustains (reported); two open-loop Poisson runs at fractions of the capacity
   the single-stream costs imply: at `calibration_high_load` (0.85) the host CPU per request at large batches,
   and at `calibration_load` (0.15) the judged fixed per-request cost, per-batch cost, host CPU per request
   (split with the high pass's into per-request and per-batch work, `cpu_share.split_host_cpu`) and the
   in-service slowdown `service_time_scale` (executor time per batch in the loaded server / the profile's,
   `headroom.sim.slowdown`);
4. the bench (`headroom.loadgen.runner.run_bench`), open-loop Poisson at each judged load: by default a target
   *utilisation*, the rate at which the calibrated simulator keeps the model busy that fraction of the time on
   the schedule the bench sends (`headroom.sim.validate_loads`); or (`load_basis` capacity) a fraction of the
   *effective* capacity B_max / (scale x (T(B_max) + per-batch) + B_max x host per request + host per batch).
   The real server's busy fraction is measured at each load and reported beside the simulator's;
5. the simulator on the SAME arrival schedule (same seed), 1 replica per model instance, the model's own
   batching policy (`headroom.batching.model_config.policy_config`), service time = (profile + executor cost) x
   scale, stretched by the host work of the arrivals and of each completion on the model's cores
   (`headroom.sim.cpu_share`),
   latency = simulated latency + the fixed per-request cost;
6. relative errors of p50, p99 and mean batch size per load; pass/fail against the target up to a load.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from headroom.batching.model_config import policy_config
from headroom.batching.policy import BatchPolicyConfig
from headroom.loadgen.arrivals import ArrivalSpec
from headroom.loadgen.clients import ClientConfig
from headroom.loadgen.runner import BenchConfig, environment
from headroom.loadgen.workloads import WorkloadSpec
from headroom.models.config import ModelConfig
from headroom.models.repository import ModelRepository
from headroom.profiling.affinity import parse_cpus
from headroom.sim.calibrate import (
    Overhead,
    RunningServer,
    calibrate,
    measured_bench,
    real_server,
    saturation,
)
from headroom.sim.config import SimConfig
from headroom.sim.cpu_share import split_host_cpu
from headroom.sim.profile import ServiceProfile
from headroom.sim.slowdown import effective_capacity_per_s, service_time_scale
from headroom.sim.validate_compare import compare_load, host_config, host_cost_s, host_share, opt_ms, opt_round
from headroom.sim.validate_loads import LOAD_BASES, rate_for_utilisation
from headroom.sim.validate_profile import measure_profile, pinned, pinned_repository, workload_for
from headroom.sim.validate_report import overhead_json, slowdown_report, split_source, with_batch_overhead

SCHEMA = "headroom.sim.validate/4"
OVERHEAD_MODES = ("fixed", "empirical")


@dataclass(frozen=True, slots=True)
class ValidateConfig:
    """One validation run."""

    model: str  # model directory name in the repository (digits, minilm, noop, ...)
    model_repository: Path = Path("models")  # where the model lives
    profile_path: str | None = None  # a profile file to use instead of measuring one here
    profile_repeats: int = 30  # timed predict calls per batch size when profiling here
    loads: tuple[float, ...] = (0.3, 0.5, 0.7, 0.9)  # judged loads: target utilisations or capacity fractions
    load_basis: str = "utilisation"  # what `loads` are: utilisation | capacity (`headroom.sim.validate_loads`)
    capacity_per_s: float = 0.0  # > 0: use this capacity (req/s) instead of the calibrated model's
    duration_s: float = 30.0  # seconds of Poisson arrivals per load
    warmup_queries: int = 20  # bench warm-up requests before each measured run (not measured)
    calibration_queries: int = 200  # single-stream requests that measure the fixed per-request cost
    target_rel_error: float = 0.15  # |sim - real| / real allowed for p50 and p99
    pass_up_to_load: float = 0.7  # loads at or below this must meet the target; above it is reported only
    seed: int = 0  # seeds the schedule (bench and simulator share it), the dataset and the service noise
    overhead: str = "fixed"  # judged model of the per-request cost: fixed (median) | empirical (measured draws)
    server_start_timeout_s: float = 120.0  # how long to wait for /v2/health/ready
    server_cpus: str = ""  # pin the server (and the profiling) to these CPUs, taskset -c syntax; "" = no pinning
    generator_cpus: str = ""  # pin the load generator (this process during calibration and bench); "" = no
    model_threads: int = 0  # intra-op threads for the profile and server; 0 = one per server CPU if pinned
    host_cpu: bool = True  # judged simulation models the host work sharing the model's cores (cpu_share)
    calibration_load: float = 0.15  # open-loop calibration pass at this fraction of the isolated capacity: the
    #   judged overhead, host CPU and in-service slowdown come from it; 0 = no pass (single-stream costs, scale 1)
    calibration_duration_s: float = 15.0  # seconds of Poisson arrivals in that pass
    saturation_queries: int = 600  # closed-loop calibration pass at 2 x B_max in flight (before the open-loop
    #   passes): the throughput the server really sustains (reported), and host CPU per request at full batches
    #   for the per-request / per-batch split when there is no high-load pass (0 = skip)
    calibration_high_load: float = 0.85  # open-loop calibration pass at this fraction of the calibration capacity
    #   (after saturation): host CPU per request at large batches *under open-loop arrivals*, which splits the
    #   low pass's host CPU into per-request and per-batch work (closed-loop saturation under-states it: its
    #   requests arrive in bursts that share event-loop wake-ups); 0 = no pass (split with saturation's)

    def __post_init__(self) -> None:
        if not self.loads or any(not 0 < f < 1.5 for f in self.loads):
            raise ValueError(f"loads must be fractions of capacity in (0, 1.5), e.g. 0.3,0.5,0.7; got {self.loads}")
        if self.duration_s <= 0 or self.calibration_queries < 1 or self.profile_repeats < 1:
            raise ValueError("duration_s must be > 0; calibration_queries and profile_repeats >= 1")
        if self.capacity_per_s < 0 or self.target_rel_error <= 0:
            raise ValueError("capacity_per_s must be >= 0 (0 = from the profile); target_rel_error > 0")
        if self.overhead not in OVERHEAD_MODES:
            raise ValueError(f"overhead must be one of {', '.join(OVERHEAD_MODES)}, got {self.overhead!r}")
        if not 0 <= self.calibration_load < 0.5 or self.calibration_duration_s <= 0:
            raise ValueError(f"calibration_load must be in [0, 0.5) (a low load, apart from the judged ones; 0 = no "
                             f"open-loop pass) and calibration_duration_s > 0, got {self.calibration_load}, "
                             f"{self.calibration_duration_s}")
        if self.load_basis not in LOAD_BASES:
            raise ValueError(f"load_basis must be one of {', '.join(LOAD_BASES)}, got {self.load_basis!r}")
        if self.load_basis == "utilisation" and any(f >= 1 for f in self.loads):
            raise ValueError(f"target utilisations must be < 1, got {self.loads}")
        if self.calibration_high_load != 0 and not 0.5 <= self.calibration_high_load <= 1.2:
            raise ValueError(f"calibration_high_load must be 0 (no pass) or in [0.5, 1.2] (a high load, apart from "
                             f"the judged ones), got {self.calibration_high_load}")
        if self.saturation_queries < 0:
            raise ValueError(f"saturation_queries must be >= 0 (0 = skip the pass), got {self.saturation_queries}")
        if self.model_threads < 0:
            raise ValueError(f"model_threads must be >= 0 (0 = one per server CPU), got {self.model_threads}")
        for spec in (self.server_cpus, self.generator_cpus):
            if spec:
                parse_cpus(spec)

    def threads(self) -> int:
        """Intra-op threads to give the model (0 = leave its config alone)."""
        if self.model_threads:
            return self.model_threads
        return len(parse_cpus(self.server_cpus)) if self.server_cpus else 0

    def server_cores(self) -> int:
        """How many cores the server runs on."""
        return len(parse_cpus(self.server_cpus)) if self.server_cpus else len(os.sched_getaffinity(0))


def capacity_per_s(profile: ServiceProfile, max_batch_size: int, per_batch_s: float = 0.0) -> float:
    """Requests per second one instance sustains at full batches: B / (T(B) + executor cost)."""
    b = max(1, max_batch_size)
    return b / (profile.mean_service_s(b) + per_batch_s)


def sim_config_for(config: ModelConfig, seed: int) -> SimConfig:
    """The simulated deployment of one served model: its batching policy, one replica per instance."""
    policy: BatchPolicyConfig = policy_config(config)
    batching = policy.mode if config.max_batch_size > 0 else "none"
    if batching not in ("none", "static", "dynamic", "adaptive"):
        raise ValueError(f"the simulator cannot validate batching mode {batching!r} (dynamic, static, adaptive)")
    instances = max(1, config.instances)
    return SimConfig(replicas=instances, batching=batching, policy=policy, shared_queue=instances > 1, seed=seed)


def _config_threads(config: ModelConfig) -> int:
    """Intra-op threads named in the model's parameters (the older spelling), else 1."""
    value = config.parameters.get("intra_op_threads", 1)
    return value if isinstance(value, int) and value > 0 else 1


def _bench_load(server: RunningServer, cfg: ValidateConfig, fraction: float, rate: float, seed: int,
                workload: WorkloadSpec, threads: int) -> tuple[ArrivalSpec, dict[str, Any]]:
    """One open-loop bench run; the result gets `server_usage`: per-batch means and CPU over the run."""
    spec = ArrivalSpec(kind="poisson", rate_per_s=rate, duration_s=cfg.duration_s)
    bench = BenchConfig(client=ClientConfig(url=server.url, model=cfg.model, http_client="aiohttp"),
                        scenario="server", arrival=spec, duration_s=cfg.duration_s, workload=workload, seed=seed,
                        warmup_queries=cfg.warmup_queries, scrape_interval_s=0.5,
                        label=f"sim-validate {fraction:.0%}")
    outcome, used = measured_bench(server, cfg.model, bench, threads)
    result = outcome.result
    b = used["batches"]
    result["server_usage"] = {
        "batches": int(b), "mean_batch_size": used["items"] / b if b else None,
        "compute_per_batch_ms": used["compute_s"] / b * 1e3 if b else None,
        "busy_per_batch_ms": used["busy_s"] / b * 1e3 if b else None,
        "host_cpu_per_request_ms": used["host_cpu_per_item_s"] * 1e3,
        "batch_thread_wait_per_batch_ms": used["batch_threads_wait_s"] / b * 1e3 if b else None,
        "server_cpu_s": round(used["cpu_s"], 3), "batch_threads_cpu_s": round(used["batch_threads_cpu_s"], 3),
        "utilisation": round(used["busy_s"] / used["wall_s"], 4) if used["wall_s"] > 0 else None}
    return spec, result


def run_validation(cfg: ValidateConfig, on_step: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Profile, start the server, calibrate, bench each load, simulate it, compare. Returns the JSON report."""
    entry = ModelRepository(cfg.model_repository).scan([cfg.model]).models
    if not entry:
        raise ValueError(f"{cfg.model!r} is not a tensor model in {cfg.model_repository} (LLMs: not yet)")
    mcfg = entry[0].config
    sim_base = sim_config_for(mcfg, cfg.seed)
    with tempfile.TemporaryDirectory(prefix="headroom-validate-") as tmp:
        workdir = Path(tmp)
        repository = pinned_repository(cfg.model_repository, cfg.model, cfg.threads(), workdir)
        workload = workload_for(cfg.model, mcfg, workdir, cfg.seed)
        with pinned(cfg.server_cpus):
            profile = measure_profile(cfg.model, repository, workload, cfg.seed, cfg.profile_repeats,
                                      cfg.profile_path, on_step)
        on_step(f"starting the server for {cfg.model}" + (f" on CPUs {cfg.server_cpus}" if cfg.server_cpus else ""))
        with real_server(cfg.model, repository, cfg.server_start_timeout_s, workdir / "server.log",
                         cfg.server_cpus) as server, pinned(cfg.generator_cpus):
            on_step(f"calibrating: {cfg.calibration_queries} single-stream requests")
            threads = cfg.threads() or mcfg.runtime.intra_op_threads or _config_threads(mcfg)
            single = calibrate(server, cfg.model, workload, cfg.calibration_queries, cfg.seed, threads)
            cap_b = sim_base.policy.max_batch_size if sim_base.batching != "none" else 1
            isolated = capacity_per_s(with_batch_overhead(profile, single.per_batch_s), cap_b) * sim_base.replicas
            overhead, scale, slow = single, 1.0, slowdown_report(None, single, profile, 0.0, cfg)
            # the saturation pass (before the open-loop pass, so that its after-effects settle before the judged
            # loads): the throughput the server really sustains, and host CPU per request at full batches, which
            # splits the low-load host CPU into per-request and per-batch work
            measured: dict[str, Any] = {}
            share = host_share(profile, cfg.server_cores(), threads)
            sat: dict[str, float] = {}
            if cfg.saturation_queries:
                on_step(f"calibrating: saturation, {cfg.saturation_queries} requests, closed loop, "
                        f"{2 * cap_b} in flight")
                sat = saturation(server, cfg.model, workload, 2 * cap_b, cfg.saturation_queries, cfg.seed + 2,
                                 threads)
                measured = {"throughput_per_s": round(sat["throughput_per_s"], 3), "errors": int(sat["errors"]),
                            "concurrency": int(sat["concurrency"]),
                            "host_cpu_per_request_ms": opt_ms(sat["host_cpu_per_request_s"]),
                            "busy_per_batch_ms": opt_ms(sat["busy_per_batch_s"]),
                            "mean_batch_size": opt_round(sat["mean_batch_size"])}
            # the open-loop passes run at fractions of the capacity the single-stream costs imply (host work
            # included: with a fast model the front end is the bottleneck), or of --capacity-per-s when given
            base = cfg.capacity_per_s or effective_capacity_per_s(
                cap_b, with_batch_overhead(profile, single.per_batch_s).mean_service_s(cap_b),
                host_cost_s(single, profile, cfg.server_cores(), threads)) * sim_base.replicas

            def open_loop_pass(fraction: float, seed: int) -> Overhead:
                on_step(f"calibrating: open loop at {fraction * base:,.1f} req/s ({fraction:.0%} of {base:,.1f} "
                        f"req/s) for {cfg.calibration_duration_s:g} s")
                return calibrate(server, cfg.model, workload, cfg.calibration_queries, seed, threads,
                                 rate_per_s=fraction * base, duration_s=cfg.calibration_duration_s)

            high = open_loop_pass(cfg.calibration_high_load, cfg.seed + 3) if cfg.calibration_high_load > 0 else None
            cal_rate = cfg.calibration_load * base
            if cfg.calibration_load > 0:
                overhead = open_loop_pass(cfg.calibration_load, cfg.seed + 1)
            per_req, per_batch = overhead.host_cpu_per_request_s, 0.0
            far = (high.host_cpu_per_request_s, high.mean_batch_size) if high is not None and high.batches else \
                (sat["host_cpu_per_request_s"], sat["mean_batch_size"]) if sat else None
            if far is not None and far[1] >= 1 and overhead.mean_batch_size >= 1:
                per_req, per_batch = split_host_cpu(overhead.host_cpu_per_request_s, overhead.mean_batch_size, *far)
            host_cost = per_req * share
            host_batch = per_batch * share
            if cfg.calibration_load > 0:
                cost = host_cost if cfg.host_cpu else 0.0
                scale = service_time_scale(overhead.busy_per_batch_s, max(1.0, overhead.mean_batch_size),
                                           with_batch_overhead(profile, overhead.per_batch_s), cal_rate, cost)
                slow = slowdown_report(overhead, single, profile, cost, cfg, scale) | {
                    "calibration_capacity_per_s": round(base, 3),
                    "calibration_capacity": "--capacity-per-s" if cfg.capacity_per_s else
                    "single-stream costs: B_max / (T(B_max) + per-batch + B_max x host cost)"}
            sim_profile = with_batch_overhead(profile, overhead.per_batch_s)
            sim_base = replace(sim_base, service_time_scale=scale,
                               host_cpu_per_batch_s=host_batch if cfg.host_cpu else 0.0)
            effective = effective_capacity_per_s(cap_b, sim_profile.mean_service_s(cap_b),
                                                 host_cost if cfg.host_cpu else 0.0, scale,
                                                 host_batch if cfg.host_cpu else 0.0) * sim_base.replicas
            if measured:
                measured["effective_over_measured"] = opt_round(effective / measured["throughput_per_s"]) \
                    if measured["throughput_per_s"] > 0 else None
            capacity = cfg.capacity_per_s or effective
            judged_sim = host_config(sim_base, cfg.host_cpu, host_cost, host_batch)
            rows = []
            for i, fraction in enumerate(cfg.loads):
                seed = cfg.seed + 1000 * (i + 1)
                rate = fraction * capacity
                if cfg.load_basis == "utilisation":
                    rate = rate_for_utilisation(fraction, judged_sim, sim_profile, cfg.duration_s, seed,
                                                capacity).rate_per_s
                on_step(f"load {fraction:.0%} {cfg.load_basis}: {rate:,.1f} req/s for {cfg.duration_s:g} s (bench)")
                spec, real = _bench_load(server, cfg, fraction, rate, seed, workload, threads)
                rows.append(compare_load(fraction, rate, real, replace(sim_base, seed=seed), sim_profile, overhead,
                                         spec, seed, cfg, host_cost, host_batch))
    judged = [r for r in rows if r["judged"]]
    source = "--capacity-per-s" if cfg.capacity_per_s else (
        "effective: B_max / (scale x (T(B_max) + per-batch) + B_max x host cost)" if cfg.host_cpu
        else "effective: B_max / (scale x (T(B_max) + per-batch))")
    return {
        "schema": SCHEMA, "model": cfg.model, "environment": environment() | {"load_average": os.getloadavg()},
        "config": {"loads": list(cfg.loads), "load_basis": cfg.load_basis, "duration_s": cfg.duration_s,
                   "seed": cfg.seed,
                   "target_rel_error": cfg.target_rel_error, "pass_up_to_load": cfg.pass_up_to_load,
                   "calibration_queries": cfg.calibration_queries, "profile_path": cfg.profile_path,
                   "overhead": cfg.overhead, "server_cpus": cfg.server_cpus, "generator_cpus": cfg.generator_cpus,
                   "model_threads": cfg.threads(), "host_cpu": cfg.host_cpu,
                   "calibration_load": cfg.calibration_load, "calibration_duration_s": cfg.calibration_duration_s,
                   "saturation_queries": cfg.saturation_queries,
                   "calibration_high_load": cfg.calibration_high_load},
        "simulated": {"batching": sim_base.batching, "replicas": sim_base.replicas,
                      "max_batch_size": sim_base.policy.max_batch_size,
                      "max_queue_delay_ms": sim_base.policy.max_queue_delay_s * 1e3,
                      "preferred_batch_sizes": list(sim_base.policy.preferred_batch_sizes),
                      "host_cpu_per_request_ms": opt_ms(host_cost if cfg.host_cpu else 0.0),
                      "host_cpu_per_batch_ms": opt_ms(host_batch if cfg.host_cpu else 0.0),
                      "service_time_scale": round(scale, 4)},
        "profile": profile.to_json(),
        "overhead": overhead_json(overhead) | {"host_cost_per_arrival_ms": opt_ms(host_cost),
                                                "host_cost_per_batch_ms": opt_ms(host_batch),
                                                "host_split": split_source(high, per_batch)},
        "high_load_calibration": overhead_json(high) if high is not None else None,
        "single_stream_calibration": overhead_json(single),
        "slowdown": slow,
        "capacity": {"isolated_per_s": isolated, "effective_per_s": effective, "used_per_s": capacity,
                     "service_time_scale": round(scale, 4), "source": source,
                     "measured_saturation": measured or None},
        "loads": rows,
        "verdict": {"pass": bool(judged) and all(r["pass"] for r in judged),
                    "judged_loads": [r["load_fraction"] for r in judged],
                    "worst_abs_error_judged": max((abs(e) for r in judged for e in (r["rel_error"]["p50"],
                                                  r["rel_error"]["p99"]) if e is not None), default=None)},
    }
