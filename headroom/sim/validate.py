"""`headroom sim --validate`: the simulator checked against the real server.

Steps (`run_validation`):

1. service-time profile: the batched predict call by batch size, timed here on the bench's own samples
   (preprocessed and collated as the server does), on the server's CPUs with the server's thread count
   (`headroom.sim.validate_profile`), or `--profile FILE`;
2. the real server: `python -m headroom.cli.main serve --model M [--cpus C]` in a subprocess on a free loopback
   port (`headroom.sim.calibrate.real_server`); this process (the load generator) moves to `--generator-cpus`;
3. calibration (`headroom.sim.calibrate.calibrate`): a closed-loop, single-stream run gives the fixed
   per-request cost, the per-batch executor cost and the server's host CPU per request outside the model;
4. the bench (`headroom.loadgen.runner.run_bench`), open-loop Poisson at fractions of the capacity the
   calibrated model implies: B_max / (T(B_max) + per-batch + B_max x host CPU cost), the *effective* capacity
   (the isolated one, B_max / (T(B_max) + per-batch), is reported too);
5. the simulator on the SAME arrival schedule (same seed), 1 replica per model instance, the model's own
   batching policy (`headroom.server.dataplane.policy_config`), service time = profile + executor cost,
   stretched by the host work of the arrivals on the model's cores (`headroom.sim.cpu_share`),
   latency = simulated latency + the fixed per-request cost;
6. relative errors of p50, p99 and mean batch size per load; pass/fail against the target up to a load.
"""

from __future__ import annotations

import asyncio
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from headroom.batching.policy import BatchPolicyConfig
from headroom.loadgen.arrivals import ArrivalSpec, make_schedule
from headroom.loadgen.clients import ClientConfig
from headroom.loadgen.runner import BenchConfig, environment, run_bench
from headroom.loadgen.workloads import WorkloadSpec
from headroom.models.config import ModelConfig
from headroom.models.repository import ModelRepository
from headroom.profiling.affinity import parse_cpus
from headroom.server.dataplane import policy_config
from headroom.sim.calibrate import Overhead, RunningServer, calibrate, read_server, real_server, usage_between
from headroom.sim.config import SimConfig
from headroom.sim.cpu_share import effective_capacity_per_s, stretch_factor
from headroom.sim.engine import simulate
from headroom.sim.profile import ServiceProfile
from headroom.sim.validate_profile import measure_profile, pinned, pinned_repository, workload_for

SCHEMA = "headroom.sim.validate/2"
OVERHEAD_MODES = ("fixed", "empirical")


@dataclass(frozen=True, slots=True)
class ValidateConfig:
    """One validation run."""

    model: str  # model directory name in the repository (digits, minilm, noop, ...)
    model_repository: Path = Path("models")  # where the model lives
    profile_path: str | None = None  # a profile file to use instead of measuring one here
    profile_repeats: int = 30  # timed predict calls per batch size when profiling here
    loads: tuple[float, ...] = (0.3, 0.5, 0.7, 0.9)  # fractions of the (effective) capacity to offer
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

    def __post_init__(self) -> None:
        if not self.loads or any(not 0 < f < 1.5 for f in self.loads):
            raise ValueError(f"loads must be fractions of capacity in (0, 1.5), e.g. 0.3,0.5,0.7; got {self.loads}")
        if self.duration_s <= 0 or self.calibration_queries < 1 or self.profile_repeats < 1:
            raise ValueError("duration_s must be > 0; calibration_queries and profile_repeats >= 1")
        if self.capacity_per_s < 0 or self.target_rel_error <= 0:
            raise ValueError("capacity_per_s must be >= 0 (0 = from the profile); target_rel_error > 0")
        if self.overhead not in OVERHEAD_MODES:
            raise ValueError(f"overhead must be one of {', '.join(OVERHEAD_MODES)}, got {self.overhead!r}")
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


def relative_error(sim: float, real: float) -> float:
    """(sim - real) / real; nan when either is missing or real is 0."""
    if not (math.isfinite(sim) and math.isfinite(real)) or real == 0:
        return math.nan
    return (sim - real) / real


def capacity_per_s(profile: ServiceProfile, max_batch_size: int, per_batch_s: float = 0.0) -> float:
    """Requests per second one instance sustains at full batches: B / (T(B) + executor cost)."""
    b = max(1, max_batch_size)
    return b / (profile.mean_service_s(b) + per_batch_s)


def with_batch_overhead(profile: ServiceProfile, per_batch_s: float) -> ServiceProfile:
    """The profile with a constant executor cost added to every batch size's mean."""
    return replace(profile, service_times_s=tuple(t + per_batch_s for t in profile.service_times_s),
                   name=f"{profile.name} + {per_batch_s * 1e3:.3f} ms/batch")


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


def _ms(seconds: float) -> float | None:
    return round(seconds * 1e3, 4) if math.isfinite(seconds) else None


def _err(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None


def _pcts(latencies_s: npt.NDArray[np.float64]) -> tuple[float, float]:
    if not latencies_s.size:
        return math.nan, math.nan
    p50, p99 = np.percentile(latencies_s, [50, 99])
    return float(p50), float(p99)


def host_cost_s(overhead: Overhead, profile: ServiceProfile, server_cores: int, model_threads: int) -> float:
    """Model seconds lost per arrival (`SimConfig.host_cpu_per_request_s`): the host CPU per request times the
    share of the server's cores the model keeps busy while it predicts: the profile's `busy_fraction` (1 when
    the profile does not say) x min(1, threads / cores). A preempted intra-op thread stalls its operator, so
    a model with a thread on every core loses the whole host cost; one that sleeps loses nothing."""
    busy = min(1.0, max(0.0, float(profile.meta.get("busy_fraction", 1.0))))
    spread = min(1.0, max(1, model_threads) / max(1, server_cores))
    return overhead.host_cpu_per_request_s * busy * spread


def _simulated(sim_cfg: SimConfig, profile: ServiceProfile, overhead: Overhead, arrivals: npt.NDArray[np.float64],
               seed: int) -> tuple[Any, tuple[float, float], tuple[float, float]]:
    res = simulate(sim_cfg, profile, arrivals)
    fixed = _pcts(res.latencies_s + overhead.per_request_s)
    drawn = _pcts(res.latencies_s + overhead.draw(res.latencies_s.size, np.random.default_rng(seed + 7)))
    return res, fixed, drawn


def compare_load(fraction: float, rate: float, real: dict[str, Any], sim_cfg: SimConfig, profile: ServiceProfile,
                 overhead: Overhead, spec: ArrivalSpec, seed: int, cfg: ValidateConfig,
                 host_cost: float = 0.0) -> dict[str, Any]:
    """Simulate one load on the bench's own schedule (with and without the host-CPU term) and compare with the
    bench's result; the judged simulation is the one `cfg.host_cpu` selects."""
    arrivals = make_schedule(spec, np.random.default_rng(seed))
    with_host = replace(sim_cfg, host_cpu_per_request_s=host_cost)
    without = replace(sim_cfg, host_cpu_per_request_s=0.0)
    res, fixed_pct, drawn_pct = _simulated(with_host if cfg.host_cpu else without, profile, overhead, arrivals, seed)
    _, alt_fixed, alt_drawn = _simulated(without if cfg.host_cpu else with_host, profile, overhead, arrivals, seed)
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
    return {
        "load_fraction": fraction, "rate_per_s": rate, "requests": int(arrivals.size),
        "real": {"p50_ms": _ms(real_p50), "p99_ms": _ms(real_p99), "mean_batch_size": _err(real_batch),
                 "completed": real["counts"]["completed"],
                 "compute_mean_ms": stages.get("compute", {}).get("mean_ms"),
                 "queue_mean_ms": stages.get("queue", {}).get("mean_ms"),
                 "throughput_per_s": real["throughput"]["requests_per_s"], "errors": real["counts"]["errors"],
                 "late_fraction": real["generator"]["late_fraction"], "valid": real["scenario"]["valid"],
                 "server_usage": usage},
        "sim": {"p50_ms": _ms(sim_p50), "p99_ms": _ms(sim_p99), "mean_batch_size": _err(res.mean_batch_size),
                "utilisation": _err(res.utilisation), "throughput_per_s": res.throughput_per_s,
                "overhead": cfg.overhead, "host_cpu": cfg.host_cpu, "mean_wait_ms": _ms(res.mean_wait_s),
                "busy_per_batch_ms": _ms(res.busy_s / max(1.0, res.completed / max(res.mean_batch_size, 1e-9))),
                "profile_ms_at_real_batch": _ms(profile.mean_service_s(at_batch)) if at_batch else None,
                "mean_stretch_at_rate": _err(stretch_factor(rate, host_cost))},
        "sim_fixed_overhead": {"p50_ms": _ms(fixed_pct[0]), "p99_ms": _ms(fixed_pct[1]),
                               "rel_error_p50": _err(relative_error(fixed_pct[0], real_p50)),
                               "rel_error_p99": _err(relative_error(fixed_pct[1], real_p99))},
        "sim_empirical_overhead": {"p50_ms": _ms(drawn_pct[0]), "p99_ms": _ms(drawn_pct[1]),
                                   "rel_error_p50": _err(relative_error(drawn_pct[0], real_p50)),
                                   "rel_error_p99": _err(relative_error(drawn_pct[1], real_p99))},
        f"sim_{'without' if cfg.host_cpu else 'with'}_host_cpu": {
            "p50_ms": _ms(alt_p50), "p99_ms": _ms(alt_p99),
            "rel_error_p50": _err(relative_error(alt_p50, real_p50)),
            "rel_error_p99": _err(relative_error(alt_p99, real_p99))},
        "rel_error": {"p50": _err(e50), "p99": _err(e99),
                      "mean_batch_size": _err(relative_error(res.mean_batch_size, real_batch))},
        "judged": judged, "pass": ok if judged else None,
    }


def _bench_load(server: RunningServer, cfg: ValidateConfig, fraction: float, rate: float, seed: int,
                workload: WorkloadSpec, threads: int) -> tuple[ArrivalSpec, dict[str, Any]]:
    """One open-loop bench run; the result gets `server_usage`: per-batch means and CPU over the run."""
    spec = ArrivalSpec(kind="poisson", rate_per_s=rate, duration_s=cfg.duration_s)
    bench = BenchConfig(client=ClientConfig(url=server.url, model=cfg.model, http_client="aiohttp"),
                        scenario="server", arrival=spec, duration_s=cfg.duration_s, workload=workload, seed=seed,
                        warmup_queries=cfg.warmup_queries, scrape_interval_s=0.5,
                        label=f"sim-validate {fraction:.0%}")
    before = read_server(server, cfg.model)
    result = asyncio.run(run_bench(bench)).result
    used = usage_between(before, read_server(server, cfg.model), server.pid, threads)
    b = used["batches"]
    result["server_usage"] = {
        "batches": int(b), "mean_batch_size": used["items"] / b if b else None,
        "compute_per_batch_ms": used["compute_s"] / b * 1e3 if b else None,
        "busy_per_batch_ms": used["busy_s"] / b * 1e3 if b else None,
        "host_cpu_per_request_ms": used["host_cpu_per_item_s"] * 1e3,
        "batch_thread_wait_per_batch_ms": used["batch_threads_wait_s"] / b * 1e3 if b else None,
        "server_cpu_s": round(used["cpu_s"], 3), "batch_threads_cpu_s": round(used["batch_threads_cpu_s"], 3)}
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
            overhead = calibrate(server, cfg.model, workload, cfg.calibration_queries, cfg.seed, threads)
            host_cost = host_cost_s(overhead, profile, cfg.server_cores(), threads)
            sim_profile = with_batch_overhead(profile, overhead.per_batch_s)
            cap_b = sim_base.policy.max_batch_size if sim_base.batching != "none" else 1
            isolated = capacity_per_s(sim_profile, cap_b) * sim_base.replicas
            effective = effective_capacity_per_s(cap_b, sim_profile.mean_service_s(cap_b), host_cost) \
                * sim_base.replicas
            capacity = cfg.capacity_per_s or (effective if cfg.host_cpu else isolated)
            rows = []
            for i, fraction in enumerate(cfg.loads):
                rate, seed = fraction * capacity, cfg.seed + 1000 * (i + 1)
                on_step(f"load {fraction:.0%}: {rate:,.1f} req/s for {cfg.duration_s:g} s (bench)")
                spec, real = _bench_load(server, cfg, fraction, rate, seed, workload, threads)
                rows.append(compare_load(fraction, rate, real, replace(sim_base, seed=seed), sim_profile, overhead,
                                         spec, seed, cfg, host_cost))
    judged = [r for r in rows if r["judged"]]
    source = "--capacity-per-s" if cfg.capacity_per_s else (
        "effective: B_max / (T(B_max) + per-batch + B_max x host cost)" if cfg.host_cpu
        else "isolated: B_max / (T(B_max) + per-batch)")
    return {
        "schema": SCHEMA, "model": cfg.model, "environment": environment() | {"load_average": os.getloadavg()},
        "config": {"loads": list(cfg.loads), "duration_s": cfg.duration_s, "seed": cfg.seed,
                   "target_rel_error": cfg.target_rel_error, "pass_up_to_load": cfg.pass_up_to_load,
                   "calibration_queries": cfg.calibration_queries, "profile_path": cfg.profile_path,
                   "overhead": cfg.overhead, "server_cpus": cfg.server_cpus, "generator_cpus": cfg.generator_cpus,
                   "model_threads": cfg.threads(), "host_cpu": cfg.host_cpu},
        "simulated": {"batching": sim_base.batching, "replicas": sim_base.replicas,
                      "max_batch_size": sim_base.policy.max_batch_size,
                      "max_queue_delay_ms": sim_base.policy.max_queue_delay_s * 1e3,
                      "preferred_batch_sizes": list(sim_base.policy.preferred_batch_sizes),
                      "host_cpu_per_request_ms": _ms(host_cost if cfg.host_cpu else 0.0)},
        "profile": profile.to_json(),
        "overhead": {"per_request_ms": _ms(overhead.per_request_s), "per_batch_ms": _ms(overhead.per_batch_s),
                     "single_stream_p50_ms": _ms(overhead.single_stream_p50_s),
                     "single_stream_compute_p50_ms": _ms(overhead.single_stream_compute_p50_s),
                     "host_cpu_per_request_ms": _ms(overhead.host_cpu_per_request_s),
                     "host_cost_per_arrival_ms": _ms(host_cost), "server_cpu_s": round(overhead.server_cpu_s, 3),
                     "batch_threads_cpu_s": round(overhead.batch_threads_cpu_s, 3),
                     "calibration_requests": overhead.requests},
        "capacity": {"isolated_per_s": isolated, "effective_per_s": effective, "used_per_s": capacity,
                     "source": source},
        "loads": rows,
        "verdict": {"pass": bool(judged) and all(r["pass"] for r in judged),
                    "judged_loads": [r["load_fraction"] for r in judged],
                    "worst_abs_error_judged": max((abs(e) for r in judged for e in (r["rel_error"]["p50"],
                                                  r["rel_error"]["p99"]) if e is not None), default=None)},
    }


def report_table(report: dict[str, Any]) -> Any:
    """The comparison as a rich Table (p50, p99 and mean batch size per load, real / simulated)."""
    from rich.table import Table

    ov, cap = report["overhead"], report["capacity"]
    other = "empirical" if report["config"]["overhead"] == "fixed" else "fixed"
    host_alt = "without" if report["config"]["host_cpu"] else "with"
    table = Table(title=f"headroom sim --validate: {report['model']}, {report['simulated']['batching']} batching; "
                  f"modelled overhead {ov['per_request_ms']:.2f} ms/request ({report['config']['overhead']}) "
                  f"+ {ov['per_batch_ms']:.2f} ms/batch; host CPU {ov['host_cpu_per_request_ms']:.2f} ms/request "
                  f"({'modelled' if report['config']['host_cpu'] else 'not modelled'}); capacity isolated "
                  f"{cap['isolated_per_s']:,.1f} / effective {cap['effective_per_s']:,.1f} req/s")
    for col in ("load", "rate/s", "sim util", "p50 real/sim ms", "err", "p99 real/sim ms", "err",
                f"p99 err ({other})", f"p50/p99 err ({host_alt} host CPU)", "batch real/sim", "verdict"):
        table.add_column(col, justify="right")

    def f(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    for r in report["loads"]:
        e, real, sim = r["rel_error"], r["real"], r["sim"]
        verdict = ("[green]pass[/]" if r["pass"] else "[red]fail[/]") if r["judged"] else "reported"
        alt = r[f"sim_{other}_overhead"]["rel_error_p99"]
        h = r[f"sim_{host_alt}_host_cpu"]
        table.add_row(f"{r['load_fraction']:.0%}", f"{r['rate_per_s']:,.1f}", f(sim["utilisation"], ".0%"),
                      f"{f(real['p50_ms'], '.2f')} / {f(sim['p50_ms'], '.2f')}", f(e["p50"], "+.1%"),
                      f"{f(real['p99_ms'], '.2f')} / {f(sim['p99_ms'], '.2f')}", f(e["p99"], "+.1%"), f(alt, "+.1%"),
                      f"{f(h['rel_error_p50'], '+.1%')} / {f(h['rel_error_p99'], '+.1%')}",
                      f"{f(real['mean_batch_size'], '.2f')} / {f(sim['mean_batch_size'], '.2f')}", verdict)
    table.caption = (f"err = (sim - real) / real; target |err| <= {report['config']['target_rel_error']:.0%} for "
                     f"p50 and p99 up to {report['config']['pass_up_to_load']:.0%} load; above it reported only")
    return table
