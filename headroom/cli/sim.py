"""`headroom sim`: discrete-event simulation of a deployment, running the server's own batching and
autoscaling policies on a virtual clock. Reports the bench's metrics; optional JSON and histogram PNG."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from headroom.autoscaler.policy import AutoscalerConfig
from headroom.batching.policy import BatchPolicyConfig
from headroom.loadgen.arrivals import ArrivalSpec, make_schedule
from headroom.sim.config import SimConfig, SimResult
from headroom.sim.engine import simulate
from headroom.sim.profile import ServiceProfile, builtin_profiles, resolve_profile
from headroom.sim.router import ROUTERS

app = typer.Typer(
    help="Simulate a deployment: arrivals -> router -> N replicas with static / dynamic / adaptive / "
    "continuous batching (the server's own policy functions) -> latency percentiles, throughput, utilisation, "
    "queue, rejects. Example: headroom sim --rate 500 --replicas 2 --batching dynamic --max-batch-size 16 "
    "--service-ms 5 --per-item-ms 0.6 --duration 60 --plot lat.png",
    invoke_without_command=True,
    no_args_is_help=False,
)


def _profile(path: str | None, service_ms: float, per_item_ms: float, distribution: str,
             service_cv: float) -> ServiceProfile:
    if path is not None:
        return resolve_profile(path)
    return ServiceProfile.linear(service_ms / 1e3, per_item_ms / 1e3, distribution=distribution, cv=service_cv,
                                 name=f"{service_ms:g} ms + {per_item_ms:g} ms/item")


def _print(result: SimResult, cfg: SimConfig, profile: ServiceProfile) -> None:
    table = Table(title=f"headroom sim: {cfg.replicas} replica(s), {cfg.batching} batching, {profile.name}")
    table.add_column("metric")
    table.add_column("value", justify="right")

    def ms(seconds: float) -> str:
        return "-" if math.isnan(seconds) else f"{seconds * 1e3:,.2f} ms"

    rows = [
        ("measured QPS", f"{result.throughput_per_s:,.1f} req/s"), ("utilisation", f"{result.utilisation:.1%}"),
        ("completed", f"{result.completed:,}"), ("rejected (queue full)", f"{result.rejected:,}"),
        ("expired (timeout)", f"{result.expired:,}"), ("queue at end of arrivals", f"{result.queue_at_end:,}"),
        ("max queue depth", f"{result.max_queue_depth:,}"), ("mean batch size", f"{result.mean_batch_size:.2f}"),
        ("P50", ms(result.p50_latency_s)), ("P95", ms(result.p95_latency_s)), ("P99", ms(result.p99_latency_s)),
        ("mean latency", ms(result.mean_latency_s)), ("mean wait", ms(result.mean_wait_s)),
        *_token_rows(result, ms),
        ("replicas at end", str(result.replica_timeline[-1][1] if result.replica_timeline else cfg.replicas)),
        ("simulated in", f"{result.wall_s:.2f} s ({result.offered / max(result.wall_s, 1e-9) * 60 / 1e6:.2f} "
                         "M req/min)"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)


def _token_rows(result: SimResult, ms: Callable[[float], str]) -> list[tuple[str, str]]:
    """TTFT / TPOT / ITL percentiles (continuous batching only; nothing otherwise)."""
    if math.isnan(result.ttft_p50_s):
        return []
    return [(f"{label} p50 / p90 / p99", " / ".join(ms(getattr(result, f"{key}_p{q}_s")) for q in (50, 90, 99)))
            for label, key in (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"))]


@app.callback()
def sim(
    ctx: typer.Context,
    rate: Annotated[float, typer.Option(help="Mean arrival rate (requests/s).")] = 100.0,
    duration: Annotated[float, typer.Option(help="Seconds of arrivals to simulate.")] = 60.0,
    arrival: Annotated[str, typer.Option(help="Arrival process: poisson | constant | gamma | ramp.")] = "poisson",
    arrival_cv: Annotated[float, typer.Option(help="gamma: gap coefficient of variation (>1 bursty).")] = 1.0,
    end_rate: Annotated[float, typer.Option(help="ramp: rate at the end (starts at --rate).")] = 0.0,
    replicas: Annotated[int, typer.Option(help="Replicas serving at t = 0.")] = 1,
    batching: Annotated[str, typer.Option(help="none | static | dynamic | adaptive | continuous.")] = "dynamic",
    max_batch_size: Annotated[int, typer.Option(help="Cap on a batch.")] = 8,
    max_queue_delay_ms: Annotated[float, typer.Option(help="dynamic: longest wait of the oldest request.")] = 2.0,
    static_timeout_ms: Annotated[float, typer.Option(help="static: flush a partial batch after this.")] = 100.0,
    slo_ms: Annotated[float, typer.Option(help="adaptive: latency budget (eq. 15).")] = 100.0,
    target_batch_size: Annotated[int, typer.Option(help="adaptive: close at once when this many wait.")] = 16,
    profile: Annotated[str | None, typer.Option(help="Service-time profile: a JSON/YAML file (docs/sim.md) or a "
                                                "built-in name: " + ", ".join(builtin_profiles()) + ".")] = None,
    service_ms: Annotated[float, typer.Option(help="Without --profile: fixed batch time (ms).")] = 5.0,
    per_item_ms: Annotated[float, typer.Option(help="Without --profile: extra time per item (ms).")] = 0.0,
    distribution: Annotated[str, typer.Option(help="Without --profile: deterministic | exponential | "
                                              "lognormal.")] = "deterministic",
    service_cv: Annotated[float, typer.Option(help="lognormal: coefficient of variation.")] = 0.0,
    host_cpu_ms: Annotated[float, typer.Option(help="Host CPU (ms) each arrival takes from the model's cores: "
                                               "HTTP, JSON, preprocessing on the same cores stretch every batch "
                                               "(docs/sim.md, host CPU sharing). 0 = a dedicated core.")] = 0.0,
    host_cpu_per_batch_ms: Annotated[float, typer.Option(help="Host CPU (ms) the front end spends on the model's "
                                                         "cores each time a batch completes (event-loop wake-up, "
                                                         "futures); it delays the next batch if one starts before "
                                                         "it is done (docs/sim.md). 0 = none.")] = 0.0,
    service_time_scale: Annotated[float, typer.Option(help="Multiply every batch's profile time by this "
                                                      "in-service slowdown (what `--validate` measures: batch "
                                                      "time in the loaded server / the isolated profile; docs/"
                                                      "sim.md). 1 = the profile as is.")] = 1.0,
    shared_queue: Annotated[bool, typer.Option(help="One queue for all replicas (M/M/c) instead of a "
                                               "router.")] = False,
    router: Annotated[str, typer.Option(help=" | ".join(ROUTERS))] = "round_robin",
    max_queue: Annotated[int, typer.Option(help="Admission control: reject when a queue holds this many "
                                           "(0 = unbounded).")] = 0,
    timeout_ms: Annotated[float, typer.Option(help="Shed requests queued longer than this (0 = never).")] = 0.0,
    autoscale: Annotated[bool, typer.Option(help="Scale on utilisation: up above 75 %, down below 25 %.")] = False,
    max_replicas: Annotated[int, typer.Option(help="Autoscaling ceiling.")] = 8,
    cold_start_s: Annotated[float, typer.Option(help="Seconds before a new replica serves.")] = 30.0,
    autoscale_interval_s: Annotated[float, typer.Option(help="Seconds between autoscaler evaluations.")] = 5.0,
    warmup_s: Annotated[float, typer.Option(help="Leave requests of the first seconds out of the metrics.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seeds arrivals and service-time noise.")] = 0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the metrics as JSON to this file "
                                                  "('-' for stdout).")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write the coloured latency histogram PNG here.")] = None,
    validate: Annotated[bool, typer.Option("--validate", help="Check the simulator against the real server: "
                                           "profile --model (or read --profile), start `headroom serve`, calibrate "
                                           "its per-request costs and host CPU, bench it open-loop at each of "
                                           "--loads (target utilisations by default) for --duration s, simulate "
                                           "the same schedule, compare p50/p99. On a small machine pin: "
                                           "--server-cpus 1 --generator-cpus 0 (docs/sim.md).")] = False,
    model: Annotated[str, typer.Option(help="--validate: model to serve and bench (digits, minilm).")] = "digits",
    model_repository: Annotated[Path, typer.Option(help="--validate: model repository.")] = Path("models"),
    loads: Annotated[str, typer.Option(help="--validate: judged loads, comma-separated: target utilisations "
                                       "(see --load-basis); those <= 0.7 must meet the 15 % target, the rest are "
                                       "reported.")] = "0.3,0.5,0.7,0.9",
    load_basis: Annotated[str, typer.Option(help="--validate: what --loads are. utilisation: the rate at which the "
                                            "calibrated simulator keeps the model busy that fraction of the time "
                                            "(the real server's busy fraction is reported beside it); capacity: "
                                            "fractions of the calibrated full-batch capacity (with dynamic "
                                            "batching a server is much busier than that fraction: small batches "
                                            "cost more per item).")] = "utilisation",
    capacity_per_s: Annotated[float, typer.Option(help="--validate: capacity (req/s) the loads are fractions of; "
                                                  "0 = B_max / T(B_max) from the profile.")] = 0.0,
    overhead: Annotated[str, typer.Option(help="--validate: per-request cost added to simulated latency: fixed "
                                          "(median measured) | empirical (measured draws).")] = "fixed",
    calibration_queries: Annotated[int, typer.Option(help="--validate: single-stream requests measuring the "
                                                     "overhead.")] = 200,
    server_cpus: Annotated[str, typer.Option(help="--validate: pin the server AND the profiling to these CPUs "
                                             "(taskset -c syntax: 1, 0-1); the model gets one intra-op thread per "
                                             "CPU (see --model-threads). Empty = no pinning.")] = "",
    generator_cpus: Annotated[str, typer.Option(help="--validate: pin the load generator to these CPUs, e.g. 0 "
                                                "with --server-cpus 1, so it does not compete with the "
                                                "server.")] = "",
    model_threads: Annotated[int, typer.Option(help="--validate: intra-op threads for the profiled and served "
                                               "model (onnxruntime/torch); 0 = one per --server-cpus CPU, or the "
                                               "model's config when not pinned.")] = 0,
    host_cpu: Annotated[bool, typer.Option("--host-cpu/--no-host-cpu", help="--validate: model the server's "
                                           "per-request host CPU (measured at calibration) sharing the model's "
                                           "cores, and take the load fractions of the capacity that implies "
                                           "(docs/sim.md).")] = True,
    calibration_load: Annotated[float, typer.Option(help="--validate: run an open-loop calibration pass at this "
                                                    "fraction of the capacity the single-stream costs imply (or "
                                                    "of --capacity-per-s; apart from --loads): the "
                                                    "judged per-request cost, host CPU and in-service slowdown "
                                                    "(batch time in the loaded server / profile) come from it. "
                                                    "0 = skip it (single-stream costs, no slowdown).")] = 0.15,
    calibration_duration: Annotated[float, typer.Option(help="--validate: seconds of that calibration "
                                                        "pass.")] = 15.0,
    saturation_queries: Annotated[int, typer.Option(help="--validate: calibration pass of this many requests, "
                                                    "closed loop at 2 x max batch in flight: the throughput the "
                                                    "server really sustains (reported against the effective "
                                                    "capacity) and the host CPU per request at full batches, which "
                                                    "splits host CPU into per-request and per-batch work. "
                                                    "0 = skip (all host CPU per request).")] = 600,
    calibration_high_load: Annotated[float, typer.Option(help="--validate: a second open-loop calibration pass at "
                                                         "this fraction of the calibration capacity (0.5-1.2): host "
                                                         "CPU per request at large batches under open-loop "
                                                         "arrivals, which splits host CPU into per-request and "
                                                         "per-batch work (closed-loop saturation under-states it). "
                                                         "0 = skip (split with the saturation pass).")] = 0.85,
) -> None:
    """Simulate one deployment and print P50/P95/P99, measured QPS, utilisation, queue, completed, rejected."""
    if ctx.invoked_subcommand is not None:
        return
    if validate:
        _validate(model, model_repository, profile, loads, capacity_per_s, duration, seed, overhead,
                  calibration_queries, json_out, server_cpus, generator_cpus, model_threads, host_cpu,
                  calibration_load, calibration_duration, saturation_queries, load_basis, calibration_high_load)
        return
    try:
        prof = _profile(profile, service_ms, per_item_ms, distribution, service_cv)
        policy = BatchPolicyConfig(mode="dynamic", max_batch_size=max_batch_size,
                                   max_queue_delay_s=max_queue_delay_ms / 1e3, static_timeout_s=static_timeout_ms / 1e3,
                                   slo_s=slo_ms / 1e3, target_batch_size=target_batch_size)
        scaler = AutoscalerConfig(min_replicas=1, max_replicas=max(max_replicas, replicas), warm_pool=0,
                                  window_s=3 * autoscale_interval_s, scale_up_period_s=autoscale_interval_s,
                                  scale_down_stabilisation_s=6 * autoscale_interval_s,
                                  cooldown_s=3 * autoscale_interval_s) if autoscale else None
        cfg = SimConfig(replicas=replicas, batching=batching, policy=policy, shared_queue=shared_queue,
                        router=router, max_queue=max_queue, timeout_s=timeout_ms / 1e3 if timeout_ms > 0 else math.inf,
                        autoscale=scaler, autoscale_interval_s=autoscale_interval_s, cold_start_s=cold_start_s,
                        warmup_s=warmup_s, host_cpu_per_request_s=host_cpu_ms / 1e3,
                        host_cpu_per_batch_s=host_cpu_per_batch_ms / 1e3, service_time_scale=service_time_scale,
                        seed=seed)
        spec = ArrivalSpec(kind=arrival, rate_per_s=rate, duration_s=duration, cv=arrival_cv,
                           end_rate_per_s=end_rate)
        arrivals = make_schedule(spec, np.random.default_rng(seed))
        with Console(stderr=True).status(f"simulating {arrivals.size:,} requests ..."):
            result = simulate(cfg, prof, arrivals)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    payload = {"config": {"rate_per_s": rate, "duration_s": duration, "arrival": arrival, "replicas": replicas,
                          "batching": batching, "max_batch_size": max_batch_size, "profile": prof.name,
                          "host_cpu_ms": host_cpu_ms, "host_cpu_per_batch_ms": host_cpu_per_batch_ms,
                          "service_time_scale": service_time_scale},
               "metrics": result.summary(),
               "replica_timeline": [list(p) for p in result.replica_timeline]}
    if json_out is not None and str(json_out) == "-":
        typer.echo(json.dumps(payload, indent=2))
    else:
        _print(result, cfg, prof)
        if json_out is not None:
            json_out.write_text(json.dumps(payload, indent=2))
    if plot is not None and result.completed:
        from headroom.sim.plot import latency_histogram_png

        latency_histogram_png(result.latencies_s, plot)


def _validate(model: str, model_repository: Path, profile: str | None, loads: str, capacity_per_s: float,
              duration: float, seed: int, overhead: str, calibration_queries: int, json_out: Path | None,
              server_cpus: str, generator_cpus: str, model_threads: int, host_cpu: bool,
              calibration_load: float = 0.15, calibration_duration: float = 15.0,
              saturation_queries: int = 600, load_basis: str = "utilisation",
              calibration_high_load: float = 0.85) -> None:
    from headroom.sim.validate import ValidateConfig, run_validation
    from headroom.sim.validate_table import report_table

    console = Console(stderr=True)
    try:
        fractions = tuple(float(x) for x in loads.split(",") if x.strip())
        cfg = ValidateConfig(model=model, model_repository=model_repository, profile_path=profile,
                             loads=fractions, capacity_per_s=capacity_per_s, duration_s=duration, seed=seed,
                             overhead=overhead, calibration_queries=calibration_queries,
                             server_cpus=server_cpus, generator_cpus=generator_cpus, model_threads=model_threads,
                             host_cpu=host_cpu, calibration_load=calibration_load,
                             calibration_duration_s=calibration_duration, saturation_queries=saturation_queries,
                             load_basis=load_basis, calibration_high_load=calibration_high_load)
        with console.status("validating ...") as status:
            def step(msg: str) -> None:
                status.update(msg)
                console.log(msg)

            report = run_validation(cfg, on_step=step)
    except (ValueError, RuntimeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    report["environment"]["command_line"] = " ".join(["headroom", "sim", *sys.argv[2:]])
    if json_out is not None and str(json_out) == "-":
        typer.echo(json.dumps(report, indent=2))
    else:
        Console().print(report_table(report))
        if json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(report, indent=2) + "\n")
    if not report["verdict"]["pass"]:
        raise typer.Exit(code=1)
