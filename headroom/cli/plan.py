"""`headroom plan`: capacity planning from closed forms (queueing, batching, replicas, cost, LLM sizing).

Every subcommand prints a rich table, or with `--json` one JSON object whose fields are in SI units
(seconds, requests per second, bytes, dollars). Times on the command line are in milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from headroom.plan import batching, capacity, cost, llm, queueing
from headroom.sim.profile import resolve_profile

app = typer.Typer(
    help="Plan capacity with queueing math: Little's law, M/M/1, M/D/1, M/G/1, M/M/c, batching, replicas with "
    "headroom and N+k, cost per inference and LLM sizing. Times in ms, rates per second; --json for machines.",
    no_args_is_help=True,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object (SI units) instead of a table.")]


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value != value:  # NaN is not JSON
        return None
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return None
    return value


def _emit(as_json: bool, payload: Any, title: str, rows: list[tuple[str, str]]) -> None:
    if as_json:
        typer.echo(json.dumps(_plain(payload), indent=2))
        return
    table = Table(title=title, show_header=True)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for name, val in rows:
        table.add_row(name, val)
    Console().print(table)


def _fail(exc: ValueError) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(code=2)


FromProfileOpt = Annotated[str | None, typer.Option(
    help="Service times from a profile file (`headroom profile MODEL`, docs/sim.md) or a built-in name.")]


def _profile_service_s(from_profile: str | None, service_ms: float | None) -> float:
    if from_profile is not None:
        return resolve_profile(from_profile).mean_service_s(1)
    if service_ms is None:
        raise ValueError("give --service-ms or --from-profile")
    return service_ms / 1e3


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f} ms"


def _queue_rows(r: queueing.QueueResult) -> list[tuple[str, str]]:
    return [("utilisation rho", f"{r.utilisation:.3f}"), ("P(wait)", f"{r.prob_wait:.4f}"),
            ("mean wait Wq", _ms(r.mean_wait_s)), ("mean time in system W", _ms(r.mean_time_in_system_s)),
            ("mean queue length Lq", f"{r.mean_in_queue:.3f}"), ("mean in system L", f"{r.mean_in_system:.3f}")]


@app.command("little")
def little(
    arrival_rate: Annotated[float, typer.Option(help="lambda, requests per second.")],
    time_ms: Annotated[float, typer.Option(help="T, mean time in the system (ms).")],
    as_json: JsonOpt = False,
) -> None:
    """Little's law (eq. 3): Q = lambda * T, the mean number of requests in the system (any queue)."""
    n = queueing.littles_law_in_system(arrival_rate, time_ms / 1e3)
    _emit(as_json, {"arrival_rate_per_s": arrival_rate, "time_in_system_s": time_ms / 1e3, "in_system": n},
          "Little's law", [("in system Q", f"{n:,.3f}")])


def _single(model: str, arrival_rate: float, service_ms: float, cv: float, percentile: float,
            as_json: bool) -> None:
    try:
        r = queueing.mg1(arrival_rate, service_ms / 1e3, cv)
        r = dataclasses.replace(r, model=model)
        pct: dict[str, float] = {}
        if model == "M/M/1":
            pct["response_percentile_s"] = queueing.mm1_response_percentile_s(arrival_rate, service_ms / 1e3,
                                                                              percentile)
            pct["wait_percentile_s"] = queueing.mmc_wait_percentile_s(arrival_rate, service_ms / 1e3, 1,
                                                                      percentile)
        elif model == "M/D/1":
            pct["wait_percentile_s"] = queueing.md1_wait_percentile_s(arrival_rate, service_ms / 1e3, percentile)
    except ValueError as exc:
        raise _fail(exc) from exc
    rows = [*_queue_rows(r), *[(f"p{percentile * 100:g} {k.split('_')[0]}", _ms(v)) for k, v in pct.items()]]
    _emit(as_json, {**_plain(r), "percentile": percentile, **pct}, model, rows)


ArrivalOpt = Annotated[float, typer.Option(help="lambda, arrivals per second.")]
ServiceOpt = Annotated[float, typer.Option(help="S, mean service time of one server (ms).")]
PercentileOpt = Annotated[float, typer.Option(help="Quantile for the tail columns (0.99 = p99).")]


@app.command("mm1")
def mm1(arrival_rate: ArrivalOpt, service_ms: ServiceOpt, percentile: PercentileOpt = 0.99,
        as_json: JsonOpt = False) -> None:
    """M/M/1 (eq. 5): W = S / (1 - rho); response time is exponential, so p99 = ln(100) W (eq. 6)."""
    _single("M/M/1", arrival_rate, service_ms, 1.0, percentile, as_json)


@app.command("md1")
def md1(arrival_rate: ArrivalOpt, service_ms: ServiceOpt, percentile: PercentileOpt = 0.99,
        as_json: JsonOpt = False) -> None:
    """M/D/1: Wq = rho S / (2 (1 - rho)), half of M/M/1's; wait percentile from Erlang's exact CDF."""
    _single("M/D/1", arrival_rate, service_ms, 0.0, percentile, as_json)


@app.command("mg1")
def mg1(arrival_rate: ArrivalOpt, service_ms: ServiceOpt,
        service_cv: Annotated[float, typer.Option(help="Service-time std / mean (0 = M/D/1, 1 = M/M/1).")],
        as_json: JsonOpt = False) -> None:
    """M/G/1, Pollaczek-Khinchine: Wq = rho S (1 + cv^2) / (2 (1 - rho))."""
    _single("M/G/1", arrival_rate, service_ms, service_cv, 0.99, as_json)


@app.command("mmc")
def mmc(arrival_rate: ArrivalOpt, service_ms: ServiceOpt,
        servers: Annotated[int, typer.Option(help="c, identical servers sharing one FIFO queue.")],
        percentile: PercentileOpt = 0.99, as_json: JsonOpt = False) -> None:
    """M/M/c (Erlang C): P(wait) = C(c, lambda S), Wq = C / (c mu - lambda), P(Wq > t) = C e^{-(c mu - lambda) t}."""
    try:
        r = queueing.mmc(arrival_rate, service_ms / 1e3, servers)
        p = queueing.mmc_wait_percentile_s(arrival_rate, service_ms / 1e3, servers, percentile)
    except ValueError as exc:
        raise _fail(exc) from exc
    _emit(as_json, {**_plain(r), "percentile": percentile, "wait_percentile_s": p}, f"M/M/{servers}",
          [*_queue_rows(r), (f"p{percentile * 100:g} wait", _ms(p))])


@app.command("knee")
def knee(service_ms: ServiceOpt = 5.0,
         utilisation: Annotated[list[float] | None, typer.Option(help="Utilisations (repeat the option).")] = None,
         exact: Annotated[bool, typer.Option(help="Use ln(100) = 4.605 instead of the textbook's 4.6.")] = False,
         as_json: JsonOpt = False) -> None:
    """The utilisation knee (table 7): M/M/1 mean W = S / (1 - rho) and p99 ~ 4.6 S / (1 - rho) (eq. 6)."""
    rows = queueing.knee_table(service_ms / 1e3, tuple(utilisation) if utilisation else queueing.KNEE_UTILISATIONS,
                               exact=exact)
    if as_json:
        typer.echo(json.dumps(_plain(rows), indent=2))
        return
    table = Table(title=f"Utilisation knee, M/M/1, S = {service_ms:g} ms")
    for col in ("rho", "W / S", "mean", "p99"):
        table.add_column(col, justify="right")
    for r in rows:
        style = "green" if r.utilisation < 0.7 else ("yellow" if r.utilisation < 0.9 else "red")
        table.add_row(f"{r.utilisation:.0%}", f"{r.latency_multiple:.1f}x", _ms(r.mean_latency_s),
                      _ms(r.p99_latency_s), style=style)
    Console().print(table)


@app.command("capacity")
def capacity_cmd(
    peak_qps: Annotated[float, typer.Option(help="Peak arrival rate to plan for (requests/s).")],
    p99_ms: Annotated[float, typer.Option(help="Tail-latency SLO at --percentile (ms).")],
    service_ms: Annotated[float | None, typer.Option(help="S, per-request service time (ms); or --from-profile.")]
    = None,
    from_profile: FromProfileOpt = None,
    headroom: Annotated[float, typer.Option(help="Extra fraction for spikes: 0.3 adds 30 %.")] = 0.3,
    redundancy: Annotated[int, typer.Option(help="k of N+k: replica failures to survive at rho_max.")] = 1,
    percentile: PercentileOpt = 0.99,
    replica_rate: Annotated[float | None, typer.Option(help="Measured requests/s of one replica "
                                                       "(default 1000 / service-ms).")] = None,
    exact: Annotated[bool, typer.Option(help="Use ln(1/(1-p)) unrounded (4.605 for p99).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Replicas for a peak rate and a tail SLO (napkin math 1.3).

    rho_max = 1 - 4.6 S / SLO; replicas = ceil(lambda / rho_max / mu); with headroom ceil(N (1 + h));
    recommended = max(that, N + k); utilisation after k failures = lambda / (mu (recommended - k)).
    """
    try:
        service_s = _profile_service_s(from_profile, service_ms)
        p = capacity.plan_capacity(peak_qps, p99_ms / 1e3, service_s, headroom, redundancy, percentile,
                                   replica_rate, exact)
    except ValueError as exc:
        raise _fail(exc) from exc
    k = p.redundancy
    _emit(as_json, p, "Capacity plan", [
        ("safe utilisation rho_max", f"{p.max_utilisation:.2%}"),
        ("required service rate", f"{p.required_rate_per_s:,.1f} req/s"),
        ("per-replica rate mu", f"{p.per_replica_rate_per_s:,.1f} req/s"),
        ("replicas at rho_max", str(p.base_replicas)),
        (f"with {p.headroom:.0%} headroom", str(p.replicas_with_headroom)),
        (f"N+{k} minimum (no headroom)", str(p.min_replicas_n_plus_k)),
        (f"headroom kept after {k} failures", str(p.headroom_after_k_failures)),
        ("recommended", f"[bold]{p.recommended_replicas}[/bold]"),
        ("utilisation at peak", f"{p.utilisation_at_peak:.1%}"),
        (f"utilisation after {k} failures", f"{p.utilisation_after_k_failures:.1%}"
         + (" (ok)" if p.survives_k_failures else " [red](above rho_max)[/red]")),
    ])


@app.command("batching")
def batching_cmd(
    arrival_rate: ArrivalOpt,
    window_ms: Annotated[float, typer.Option(help="Batching window T_window (ms).")] = 10.0,
    fixed_ms: Annotated[float, typer.Option(help="Batch service time: fixed part (ms).")] = 5.0,
    per_item_ms: Annotated[float, typer.Option(help="Batch service time: per item (ms).")] = 0.6,
    slo_ms: Annotated[float, typer.Option(help="Latency target for B_max (eq. 12) and eq. 15 (ms).")] = 50.0,
    max_batch_size: Annotated[int, typer.Option(help="Memory cap on the batch (table 14).")] = 32,
    efficiency: Annotated[float, typer.Option(help="Discount on the saturated capacity (table 14: 0.89).")] = 1.0,
    from_profile: FromProfileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Batching with T_svc(B) = fixed + per_item * B: mean wait T/2 (eq. 8), Poisson batch sizes (eq. 9),
    mu_eff = B / T_svc(B) (eq. 10), B_max under the SLO (eq. 12), the envelope T + T_svc(B_p99) (eq. 13) and
    the adaptive window min(SLO - T_svc, sqrt(T_svc / lambda)) (eq. 15)."""
    try:
        svc: batching.ServiceTimeFn = batching.LinearServiceTime(fixed_ms / 1e3, per_item_ms / 1e3)
        if from_profile is not None:
            svc = resolve_profile(from_profile).mean_service_s
        window_s = window_ms / 1e3
        stats = batching.batch_size_stats(arrival_rate, window_s)
        env = batching.envelope(arrival_rate, window_s, svc, max_batch_size, efficiency=efficiency)
        bmax = batching.max_batch_under_slo(slo_ms / 1e3, window_s, svc)
        adaptive = batching.adaptive_window(arrival_rate, slo_ms / 1e3, svc(1))
    except ValueError as exc:
        raise _fail(exc) from exc
    payload = {"stats": stats, "envelope": env, "b_max": bmax, "adaptive": adaptive,
               "mean_wait_s": batching.window_mean_wait_s(window_s)}
    _emit(as_json, payload, "Batching", [
        ("mean wait (T/2)", _ms(window_s / 2)),
        ("batch size mean / std", f"{stats.mean:.2f} / {stats.std:.2f}"),
        ("P(empty window)", f"{stats.prob_empty:.3%}"), ("P(batch >= 2 mean)", f"{stats.prob_at_least_double:.3%}"),
        ("batch a request sees: mean / p99", f"{env.mean_batch_seen:.1f} / {env.p99_batch_seen}"),
        ("mean latency", _ms(env.mean_latency_s)), ("conservative envelope", _ms(env.envelope_s)),
        (f"saturated capacity at B={max_batch_size}", f"{env.saturated_capacity_per_s:,.1f} /s"),
        ("served", f"{env.served_per_s:,.1f} /s"), ("B_max under SLO (eq. 12)", str(bmax)),
        ("adaptive window (eq. 15)", _ms(adaptive.window_s)),
    ])


@app.command("cost")
def cost_cmd(
    option: Annotated[list[str], typer.Option(help="NAME:HOURLY_COST:THROUGHPUT_PER_S, repeat for each "
                                               "choice, e.g. --option cpu:0.17:50 --option t4:0.53:400.")],
    load_qps: Annotated[float | None, typer.Option(help="Actual load; sizes a fleet of each option.")] = None,
    max_utilisation: Annotated[float, typer.Option(help="Keep each instance below this share.")] = 1.0,
    as_json: JsonOpt = False,
) -> None:
    """Cost per million inferences = hourly cost / (throughput * 3600) * 1e6, and GPU vs CPU at a load."""
    try:
        opts = [cost.parse_option(o) for o in option]
        load = load_qps if load_qps is not None else max(o.throughput_per_s for o in opts)
        rows = cost.compare(opts, load, max_utilisation)
    except ValueError as exc:
        raise _fail(exc) from exc
    if as_json:
        typer.echo(json.dumps(_plain(rows), indent=2))
        return
    table = Table(title=f"Cost at {load:,.1f} req/s")
    for col in ("option", "$/h", "req/s", "$/M at capacity", "instances", "fleet $/h", "util", "$/M at load"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r.name, f"{r.hourly_cost:.2f}", f"{r.throughput_per_s:,.0f}",
                      f"{r.cost_per_million_at_capacity:.2f}", str(r.instances), f"{r.fleet_hourly_cost:.2f}",
                      f"{r.utilisation:.1%}", f"{r.cost_per_million_at_load:.2f}")
    Console().print(table)


@app.command("llm")
def llm_cmd(
    params_b: Annotated[float, typer.Option(help="Parameters in billions.")] = 8.03,
    bits: Annotated[float, typer.Option(help="Weight bits per parameter (4 = AWQ INT4).")] = 4.0,
    layers: Annotated[int, typer.Option(help="Transformer layers.")] = 32,
    kv_heads: Annotated[int, typer.Option(help="KV heads (GQA).")] = 8,
    head_dim: Annotated[int, typer.Option(help="Per-head width.")] = 128,
    d_model: Annotated[int, typer.Option(help="Hidden size, for attention FLOPs.")] = 4096,
    kv_bytes: Annotated[float, typer.Option(help="Bytes per KV element (2 = FP16).")] = 2.0,
    hbm_gib: Annotated[float, typer.Option(help="Accelerator memory (GiB).")] = 80.0,
    kv_budget_gib: Annotated[float, typer.Option(help="Memory reserved for the KV cache (GiB).")] = 72.0,
    bandwidth_tb_s: Annotated[float, typer.Option(help="Memory bandwidth (TB/s).")] = 3.35,
    peak_tflops: Annotated[float, typer.Option(help="Dense peak (TFLOP/s).")] = 989.4,
    efficiency: Annotated[float, typer.Option(help="Achieved share of the peak in prefill.")] = 0.4,
    prompt_tokens: Annotated[int, typer.Option(help="Tokens in.")] = 1000,
    output_tokens: Annotated[int, typer.Option(help="Tokens out.")] = 256,
    tpot_overhead_ms: Annotated[float, typer.Option(help="Runtime cost per token above the floor (ms).")] = 0.0,
    hourly_cost: Annotated[float, typer.Option(help="Dollars per accelerator-hour.")] = 3.0,
    power_w: Annotated[float, typer.Option(help="Watts (GPU plus host share).")] = 1000.0,
    request_rate: Annotated[float, typer.Option(help="Sustained requests/s (0: prefill-bound 1/TTFT).")] = 0.0,
    as_json: JsonOpt = False,
) -> None:
    """LLM sizing (Llama-3-8B case study defaults): KV bytes/token = 2 L H_kv d bytes; sequences = budget /
    (tokens * KV/token); TPOT floor = weight bytes / bandwidth (eq. 18); prefill = (2 P n + 4 L n^2 d) /
    (peak * efficiency); tokens/h; $ per M tokens = $/h / tokens/h; J/token = W / tokens/s."""
    spec = llm.LlmSpec(num_params=params_b * 1e9, bits_per_param=bits, num_layers=layers, num_kv_heads=kv_heads,
                       head_dim=head_dim, d_model=d_model, kv_bytes_per_element=kv_bytes,
                       hbm_bytes=hbm_gib * llm.GIB, kv_budget_bytes=kv_budget_gib * llm.GIB,
                       bandwidth_bytes_per_s=bandwidth_tb_s * 1e12, peak_flops_per_s=peak_tflops * 1e12,
                       compute_efficiency=efficiency, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                       tpot_overhead_s=tpot_overhead_ms / 1e3, hourly_cost=hourly_cost, power_w=power_w,
                       request_rate_per_s=request_rate)
    try:
        s = llm.size_llm(spec)
    except ValueError as exc:
        raise _fail(exc) from exc
    _emit(as_json, s, "LLM sizing", [
        ("weights", f"{s.weight_bytes / 1e9:.3f} GB"), ("KV per token", f"{s.kv_bytes_per_token / 1e6:.3f} MB"),
        ("memory after weights", f"{s.memory_left_bytes / 1e9:.1f} GB"),
        ("KV tokens in budget", f"{s.kv_tokens:,.0f}"), ("concurrent sequences", str(s.concurrent_sequences)),
        ("TPOT floor", _ms(s.tpot_floor_s)), ("prefill (TTFT, model side)", _ms(s.prefill_s)),
        ("decode", _ms(s.decode_s)), ("tokens per hour", f"{s.tokens_per_hour / 1e6:,.1f} M"),
        ("$ per M tokens", f"{s.cost_per_million_tokens:.4f}"), ("J per token", f"{s.joules_per_token:.4f}"),
    ])
